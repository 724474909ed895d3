"""The ledger in memory: instance events, once each."""

from __future__ import annotations

import threading

from slurm_burst.core.usage import InstanceEvent, LedgerUnavailable


class FakeLedger:
    """The Ledger port (and the reconcile loop's ``open_instances``): an event of an
    instance is recorded once, as the SQL ledger's unique key makes it. ``away`` makes
    writes fail as a database that cannot be reached."""

    def __init__(self) -> None:
        self.events: list[InstanceEvent] = []
        self.away = False
        self._lock = threading.Lock()

    def instance_event(self, ev: InstanceEvent) -> None:
        if self.away:
            raise LedgerUnavailable("ledger database unreachable")
        with self._lock:
            if not any((e.instance_id, e.event) == (ev.instance_id, ev.event) for e in self.events):
                self.events.append(ev)

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
