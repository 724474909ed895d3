"""The Ledger contract: instance events, each recorded once."""

from __future__ import annotations

import itertools
from typing import Protocol

from slurm_burst.core.usage import InstanceEvent

_seq = itertools.count(1)


class RecordingLedger(Protocol):
    def instance_event(self, ev: InstanceEvent) -> None: ...

    def open_instances(self) -> dict[str, str]: ...


class LedgerContract:
    """Subclasses provide ``ledger``: a Ledger that also reads ``open_instances``."""

    def test_an_event_is_recorded_once_and_termination_closes_the_instance(
        self, ledger: RecordingLedger
    ) -> None:
        iid = f"i-contract-{next(_seq)}"
        ev = InstanceEvent(
            "n1", iid, "requested", 1_790_000_000.0, provider="lab", size="s1",
            price_per_hour=0.5, group="cpu", partition="burst-cpu", cpus=2,
        )  # fmt: skip
        ledger.instance_event(ev)
        ledger.instance_event(ev)  # a replay adds nothing
        assert ledger.open_instances()[iid] == "n1"
        ledger.instance_event(InstanceEvent("n1", iid, "terminated", 1_790_000_600.0))
        assert iid not in ledger.open_instances()
