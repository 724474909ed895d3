"""The daemon's worker pool: at most one worker per node, batches first.

A node that needs work (its state is not where its ``want`` says) is handed to
:meth:`Workers.submit`; a node already being worked on is marked to be looked at
again when its worker finishes, so nothing is lost and no node has two workers.
New resume requests go through :meth:`Workers.submit_launch`: the launcher plans
them per node group once, a group that launches in batches gets one worker for
its batches (then each node its own worker to boot and bootstrap), and every
other node goes straight to its own worker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from slurm_burst.core.hostlist import compress
from slurm_burst.core.nodestate import needs_work
from slurm_burst.core.records import NodeRecord
from slurm_burst.ports import NodeStore
from slurm_burst.services.launcher import LaunchPlan
from slurm_burst.services.periodic import contain
from slurm_burst.services.provisioner import Provisioner

log = logging.getLogger(__name__)

# A node claimed by the request the daemon is handling (no worker yet).
_RESERVED: Future[None] = Future()


class Workers:
    def __init__(self, provisioner: Provisioner, store: NodeStore, size: int) -> None:
        self.prov = provisioner
        self.launcher = provisioner.launcher
        self.store = store
        self.pool = ThreadPoolExecutor(size, thread_name_prefix="node")
        self._active: dict[str, Future[None]] = {}
        self._again: set[str] = set()
        self._force: set[str] = set()
        self._lock = threading.Lock()

    def submit(self, name: str, power_down_force: bool = False) -> None:
        """Drive ``name`` on a worker of its own; ``power_down_force`` afterwards returns
        it to Slurm's service (a resume-fail)."""
        with self._lock:
            if power_down_force:
                self._force.add(name)
            if name in self._active:
                self._again.add(name)  # the worker re-reads the node before it ends
                return
            self._active[name] = self.pool.submit(self._work, name)

    def reserve(self, names: Iterable[str]) -> set[str]:
        """Claim the nodes among ``names`` that no worker holds, for the request being
        handled: rescans and recovery leave them alone until :meth:`submit_launch` hands
        them on. Returns the nodes claimed."""
        with self._lock:
            claimed = {n for n in names if n not in self._active}
            for n in claimed:
                self._active[n] = _RESERVED
        return claimed

    def _release(self, names: Iterable[str]) -> None:
        with self._lock:
            for n in names:
                if self._active.get(n) is _RESERVED:
                    del self._active[n]

    def submit_launch(self, requested: Sequence[NodeRecord], reserved: Iterable[str] = ()) -> None:
        """Launch newly ``requested`` nodes: in batches where their group's provider
        batches, each on its own worker otherwise; then drive each on its own.
        ``reserved`` (from :meth:`reserve`) are released, or handed on if launched."""
        self._release(set(reserved) - {r.name for r in requested})
        for plan in self.launcher.plan(requested):
            if not self.launcher.batches(plan):
                self._release(plan.nodes)
                for n in plan.nodes:
                    self.submit(n)
                continue
            with self._lock:
                free = [n for n in plan.nodes if self._active.get(n) in (None, _RESERVED)]
                busy = [n for n in plan.nodes if n not in free]
                if free:
                    batch = LaunchPlan(plan.group, tuple(free), plan.candidates)
                    fut = self.pool.submit(self._launch_work, batch)
                    for n in free:
                        self._active[n] = fut
            for n in busy:
                self.submit(n)

    def _launch_work(self, plan: LaunchPlan) -> None:
        try:
            for name, exc in self.launcher.launch_batch(plan):
                self.prov.fail(name, exc.code, str(exc))
            self._submit_released()
        except Exception as exc:  # boundary: a worker thread; its nodes are driven again
            contain("node.batch_launch", exc, self.prov.metrics)
        finally:
            with self._lock:
                for n in plan.nodes:
                    self._active.pop(n, None)
                    self._again.discard(n)
            for n in plan.nodes:
                self.submit(n)

    def _work(self, name: str) -> None:
        try:
            while True:
                try:
                    self.prov.drive(name)
                except Exception as exc:  # boundary: a worker thread; the node is rescanned
                    contain("node.worker", exc, self.prov.metrics)
                self._submit_released()
                with self._lock:
                    if name in self._again:
                        self._again.discard(name)
                        continue
                    force = name in self._force
                    self._force.discard(name)
                    break
            if force:
                self.prov.power_down_force(name)
        finally:
            with self._lock:
                self._active.pop(name, None)

    def _submit_released(self) -> None:
        """Nodes let go because their job lost a node: each to a worker, to tear down."""
        for name in self.prov.take_released():
            self.submit(name)

    def recover(self) -> None:
        """After a (re)start: pick up every node that is not where it should be."""
        todo = [r.name for r in self.store.nodes() if needs_work(r.state, r.want)]
        if todo:
            log.info("daemon.recover count=%d hostlist=%s", len(todo), compress(todo))
        for name in todo:
            self.submit(name)

    def rescan(self) -> None:
        """Hand every node that needs work and has no worker to one."""
        for rec in self.store.nodes():
            if needs_work(rec.state, rec.want) and rec.name not in self._active:
                self.submit(rec.name)

    def in_flight(self) -> int:
        with self._lock:
            return sum(1 for f in self._active.values() if f is not _RESERVED)

    def idle(self) -> bool:
        with self._lock:
            return not self._active

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
