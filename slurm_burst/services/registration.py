"""Publish when slurmctld has heard from a joined node: what the PrologSlurmctld waits on.

A node is ``joined`` once its slurmd has been started; slurmd then registers with
slurmctld, which clears the node's POWERING_UP flag. A batch job on that node starts
at once only if the job's PrologSlurmctld returns after that moment (Slurm looks at
CONFIGURING jobs again only every 30 s otherwise), so the daemon watches for it and
writes ``registered_at`` into the node's record, where the prolog reads it.

One watcher for the whole daemon: while any node waits, one ``scontrol show node``
for all of them every ``interval`` seconds (one Slurm call per tick, whatever the
count); nothing at all while no node waits. A node that never registers is dropped
after ``give_up`` seconds: the reconcile loop fails it (``SlurmdNotRegistered``).
"""

from __future__ import annotations

import logging
import threading

from slurm_burst.core.errors import BurstError
from slurm_burst.core.hostlist import compress
from slurm_burst.core.nodestate import NodeState
from slurm_burst.ports import Clock, Metrics, NodeBook, Scheduler
from slurm_burst.services.lifecycle import Lifecycle
from slurm_burst.services.periodic import contain

log = logging.getLogger(__name__)


class Registrations:
    def __init__(
        self,
        store: NodeBook,  # the node records it reads (the state port's part)
        scheduler: Scheduler,
        clock: Clock,
        stop: threading.Event,
        interval: float = 0.25,
        give_up: float = 300.0,
        metrics: Metrics | None = None,
        *,
        lifecycle: Lifecycle,
    ) -> None:
        self.store = store
        self.lifecycle = lifecycle  # the one writer of node records
        self.metrics = metrics
        self.scheduler = scheduler
        self.clock = clock
        self.stop = stop
        self.interval = interval
        self.give_up = give_up
        self._waiting: dict[str, float] = {}  # node -> monotonic time it began to wait
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self.calls = 0  # Slurm calls made (tests and the benchmark count them)

    def watch(self, name: str) -> None:
        """``name``'s slurmd has just been started: look for its registration."""
        with self._cv:
            self._waiting.setdefault(name, self.clock.monotonic())
            self._cv.notify()

    def seed(self) -> None:
        """After a (re)start: every joined node not yet seen registered is watched."""
        for rec in self.store.nodes():
            if rec.state == NodeState.JOINED and not rec.registered_at:
                self.watch(rec.name)

    def start(self) -> None:
        self.seed()
        self._thread = threading.Thread(target=self._run, name="registrations", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Let the thread see ``stop``."""
        with self._cv:
            self._cv.notify()

    def _run(self) -> None:
        while not self.stop.is_set():
            with self._cv:
                while not self._waiting and not self.stop.is_set():
                    self._cv.wait(timeout=5.0)
            if self.stop.is_set():
                return
            try:
                self.poll_once()
            except BurstError as exc:  # Slurm busy, state store locked: try again next tick
                log.warning("registration.poll_waiting code=%s error=%s", exc.code, exc)
            except Exception as exc:  # boundary: the watcher thread outlives one look
                contain("registration.poll", exc, self.metrics)
            self.stop.wait(self.interval)

    def poll_once(self) -> set[str]:
        """One look at every waiting node; returns those found registered. A node no
        longer joined (torn down meanwhile) stops being watched."""
        with self._cv:
            names = sorted(self._waiting)
        if not names:
            return set()
        records = self.store.nodes_named(names)
        joined = [n for n in names if n in records and records[n].state == NodeState.JOINED]
        seen: set[str] = set()
        if joined:
            self.calls += 1
            seen = self.scheduler.registered(joined)
        now = self.clock.now()
        for name in sorted(seen):
            rec = records[name]
            self.lifecycle.registered(name, now)
            log.info(
                "node.registered node=%s seconds_after_request=%.1f",
                name,
                now - (rec.requested_at or rec.state_since),
            )
        late = self.clock.monotonic() - self.give_up
        done = seen | (set(names) - set(joined))
        with self._cv:
            for name in names:
                if name in done or self._waiting.get(name, late) < late:
                    self._waiting.pop(name, None)
        if seen:
            log.info("registration.seen count=%d hostlist=%s", len(seen), compress(sorted(seen)))
        return seen
