"""The Ledger contract: instance events and transfers, each recorded once."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from slurm_burst.core.usage import InstanceEvent, Transfer

_seq = itertools.count(1)


class RecordingLedger(Protocol):
    def instance_event(self, ev: InstanceEvent) -> None: ...

    def instance_events(self, evs: Sequence[InstanceEvent]) -> None: ...

    def open_instances(self) -> dict[str, str]: ...

    def transfer(self, t: Transfer) -> None: ...

    def transfers(
        self, start: Any, end: Any, account: str = "", job: int = 0
    ) -> list[dict[str, Any]]: ...


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

    def test_a_batch_of_events_is_recorded_once_each(self, ledger: RecordingLedger) -> None:
        """A launch's batch in one write: every instance open once, a replay of the
        batch (or of one of it) adds nothing, a later batch closes them."""
        ids = [f"i-batch-{next(_seq)}" for _ in range(3)]
        evs = [
            InstanceEvent(
                f"n{k}",
                iid,
                "requested",
                1_790_000_000.0,
                provider="lab",
                size="s1",
                price_per_hour=0.5,
                group="cpu",
                cpus=2,
            )
            for k, iid in enumerate(ids)
        ]
        ledger.instance_events(evs)
        ledger.instance_events(evs[1:])
        ledger.instance_event(evs[0])
        ledger.instance_events([])
        opened = ledger.open_instances()
        assert [opened.get(iid) for iid in ids] == ["n0", "n1", "n2"]
        ledger.instance_events(
            [InstanceEvent(f"n{k}", i, "terminated", 1_790_000_600.0) for k, i in enumerate(ids)]
        )
        assert not set(ids) & set(ledger.open_instances())

    def test_a_transfer_is_recorded_once_and_read_back_by_job(
        self, ledger: RecordingLedger
    ) -> None:
        job = 700_000 + next(_seq)
        at = 1_790_000_000.0
        t = Transfer(
            key=f"contract:{job}:in:data", direction="in", store="s3-lab", provider="lab",
            account="physics", user="alice", job_id=job, node="", dataset="/data/x",
            manifest="ab" * 32, logical_bytes=5 << 20, bytes_sent=3 << 20, objects=4,
            objects_sent=3, seconds=1.5, at=at, per_gb=0.0, storage_per_gb_month=0.023,
            cost_micros=67_383,
        )  # fmt: skip
        ledger.transfer(t)
        ledger.transfer(t)  # a replay adds nothing
        day = datetime.fromtimestamp(at, UTC).date()
        rows = ledger.transfers(day, day + timedelta(days=1), job=job)
        assert [(r["bytes_sent"], r["cost_micros"], r["direction"]) for r in rows] == [
            (3 << 20, 67_383, "in")
        ]
        assert ledger.transfers(day, day + timedelta(days=1), account="other", job=job) == []
