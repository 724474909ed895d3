"""The ledger in memory: instance events and transfers, once each."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, date, datetime
from typing import Any

from slurm_burst.core.usage import InstanceEvent, LedgerUnavailable, Transfer


class FakeLedger:
    """The Ledger port (and the reconcile loop's ``open_instances``): an event of an
    instance is recorded once, as the SQL ledger's unique key makes it. ``away`` makes
    writes fail as a database that cannot be reached."""

    def __init__(self) -> None:
        self.events: list[InstanceEvent] = []
        self.moved: dict[str, Transfer] = {}  # by key
        self.away = False
        self._lock = threading.Lock()

    def instance_event(self, ev: InstanceEvent) -> None:
        if self.away:
            raise LedgerUnavailable("ledger database unreachable")
        with self._lock:
            if not any((e.instance_id, e.event) == (ev.instance_id, ev.event) for e in self.events):
                self.events.append(ev)

    def instance_events(self, evs: Sequence[InstanceEvent]) -> None:
        if self.away:
            raise LedgerUnavailable("ledger database unreachable")
        for ev in evs:
            self.instance_event(ev)

    def transfer(self, t: Transfer) -> None:
        if self.away:
            raise LedgerUnavailable("ledger database unreachable")
        with self._lock:
            self.moved.setdefault(t.key, t)

    def transfers(
        self, start: date, end: date, account: str = "", job: int = 0
    ) -> list[dict[str, Any]]:
        with self._lock:
            found = [
                t for t in self.moved.values()
                if start <= datetime.fromtimestamp(t.at, UTC).date() < end
                and (not account or t.account == account) and (not job or t.job_id == job)
            ]  # fmt: skip
        return [dict(t.__dict__) for t in sorted(found, key=lambda t: -t.at)]

    def open_instances(self) -> dict[str, str]:
        with self._lock:
            ended = {e.instance_id for e in self.events if e.event == "terminated"}
            return {e.instance_id: e.node for e in self.events if e.instance_id not in ended}

    def of(self, node: str) -> list[str]:
        """The events recorded for ``node``, in order."""
        return [e.event for e in self.events if e.node == node]

    # the spooled ledger's side: nothing is ever waiting here
    def replay(self) -> int:
        return 0

    def pending(self) -> int:
        return 0
