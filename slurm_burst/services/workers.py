"""The daemon's worker pool: at most one worker per node, batches first; waits on timers.

A node that needs work (its state is not where its ``want`` says) is handed to
:meth:`Workers.submit`; a node already being worked on is marked to be looked at
again when its worker finishes, so nothing is lost and no node has two workers.
New resume requests go through :meth:`Workers.submit_launch`: the launcher plans
them per node group once, a group that launches in batches gets one worker for
its batches (then each node its own worker to boot and bootstrap), and every
other node goes straight to its own worker.

**Waiting holds no thread.** A node whose step must wait (its instance boots, its
console has no host keys yet, our API budget has no token) lets go of its worker
(:class:`~slurm_burst.services.provisioner.Later`); one timer thread hands it to a
worker again when its time comes, or at once when the fleet listing sees its instance
change (:meth:`Workers.wake`). A node ready to bootstrap moves to a pool of its own,
``daemon.bootstrap_slots`` SSH sessions at once, so a thousand nodes booting never
crowd out the joins, nor the joins the launches and teardowns.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from slurm_burst.core.hostlist import compress
from slurm_burst.core.nodestate import needs_work
from slurm_burst.core.records import NodeRecord
from slurm_burst.ports import NodeBook
from slurm_burst.services.launcher import Launcher, LaunchPlan
from slurm_burst.services.periodic import contain
from slurm_burst.services.provisioner import Later, NeedsJoinSlot, Provisioner, Relaunch

log = logging.getLogger(__name__)

TIMER_TICK = 0.05  # the longest the timer thread sleeps before looking again
# nodes falling back from spot are launched together this long after the first: a
# job's other nodes follow the first at once (the provisioner wakes them), each with a
# look at its instance and a terminate call: well within it, on a loaded controller too
RELAUNCH_GATHER = 1.0

# A node claimed by the request the daemon is handling (no worker yet).
_RESERVED: Future[None] = Future()


class Workers:
    def __init__(
        self,
        provisioner: Provisioner,
        launcher: Launcher,
        store: NodeBook,
        size: int,
        join_slots: int = 0,
    ) -> None:
        self.prov = provisioner
        self.launcher = launcher
        self.store = store
        self.pool = ThreadPoolExecutor(size, thread_name_prefix="node")
        self.joins = ThreadPoolExecutor(join_slots or size, thread_name_prefix="join")
        self.clock = provisioner.clock  # timers run on it (a test's fake clock moves on)
        self._active: dict[str, Future[None]] = {}
        self._again: set[str] = set()
        self._force: set[str] = set()
        self._lock = threading.Lock()
        self._waiting: dict[str, float] = {}  # node -> when it is looked at again
        self._timers: list[tuple[float, str]] = []  # heap of (due, node); stale ones skipped
        self._tick = threading.Condition(self._lock)
        self._relaunch: list[str] = []  # nodes asked for anew, to launch together
        self._relaunch_due = 0.0
        self._closed = False
        self._timer = threading.Thread(target=self._run_timers, name="node-timers", daemon=True)
        self._timer.start()
        for view in provisioner.views.values():
            view.wake = self.wake
        provisioner.wake = self.wake

    def submit(self, name: str, power_down_force: bool = False, claimed: bool = False) -> None:
        """Drive ``name`` on a worker of its own; ``power_down_force`` afterwards returns
        it to Slurm's service (a resume-fail). A node waiting on its timer goes now.
        ``claimed``: the caller holds the node's claim (:meth:`reserve`), handed on here."""
        with self._lock:
            if claimed:
                self._unclaim_locked(name)
            self._submit_locked(name, power_down_force)

    def _submit_locked(self, name: str, power_down_force: bool = False) -> None:
        """:meth:`submit` with the lock held: a node let go and handed on under one
        hold of the lock is never seen as neither active nor waiting (idle)."""
        if power_down_force:
            self._force.add(name)
        self._waiting.pop(name, None)
        if name in self._active:
            self._again.add(name)  # the worker re-reads the node before it ends
            return
        self._active[name] = self.pool.submit(self._work, name)

    def wake(self, names: Iterable[str]) -> None:
        """Nodes whose instance changed (the fleet listing): those waiting go now."""
        with self._lock:  # one being driven now looks again when its step ends
            due = [n for n in names if n in self._waiting or n in self._active]
        for n in due:
            self.submit(n)

    def _later_locked(self, name: str, seconds: float) -> None:
        due = self.clock.monotonic() + seconds
        self._waiting[name] = due
        heapq.heappush(self._timers, (due, name))
        self._tick.notify()

    def _run_timers(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                now = self.clock.monotonic()
                ready = []
                while self._timers and self._timers[0][0] <= now:
                    due, name = heapq.heappop(self._timers)
                    if self._waiting.get(name) == due:
                        ready.append(name)
                relaunch: list[str] = []
                if self._relaunch and self._relaunch_due <= now:
                    relaunch, self._relaunch = self._relaunch, []
                if not ready and not self._timers and not self._relaunch and not relaunch:
                    self._tick.wait(timeout=1.0)
                    continue
                wait = self._timers[0][0] - now if self._timers else TIMER_TICK
            if relaunch:
                self._launch_again(relaunch)
            if not ready:  # the clock's own sleep: a test's fake clock moves on
                self.clock.sleep(min(max(wait, 0.001), TIMER_TICK))
                continue
            for name in ready:
                with self._lock:
                    if self._waiting.get(name) is None:
                        continue  # submitted meanwhile
                self.submit(name)

    def waiting(self) -> int:
        """Nodes waiting on a timer (no thread held)."""
        with self._lock:
            return len(self._waiting)

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
                self._unclaim_locked(n)

    def _unclaim_locked(self, name: str) -> None:
        """Drop ``name``'s claim (:meth:`reserve`), if a claim is what holds it."""
        if self._active.get(name) is _RESERVED:
            del self._active[name]

    def submit_launch(self, requested: Sequence[NodeRecord], reserved: Iterable[str] = ()) -> None:
        """Launch newly ``requested`` nodes: in batches where their group's provider
        batches, each on its own worker otherwise; then drive each on its own.
        ``reserved`` (from :meth:`reserve`) are released, or handed on if launched."""
        self._release(set(reserved) - {r.name for r in requested})
        for plan in self.launcher.plan(requested):
            if not self.launcher.batches(plan):
                for n in plan.nodes:
                    self.submit(n, claimed=True)
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
        handed: set[str] = set()

        def launched(names: list[str]) -> None:
            """A chunk's nodes have their instances: each to a worker of its own now,
            while the other chunks still launch."""
            with self._lock:
                for n in names:
                    if n not in handed:
                        handed.add(n)
                        self._hand_on_locked(n)

        try:
            for name, exc in self.launcher.launch_batch(plan, launched):
                self.prov.fail(name, exc.code, str(exc))
            self._submit_released()
        except Exception as exc:  # boundary: a worker thread; its nodes are driven again
            contain("node.batch_launch", exc, self.prov.metrics)
        finally:
            with self._lock:  # each node to a worker of its own in one hold of the lock
                for n in plan.nodes:
                    if n not in handed:
                        self._hand_on_locked(n)

    def _hand_on_locked(self, name: str) -> None:
        """A node the batch launch held, to a worker of its own (the lock held)."""
        self._active.pop(name, None)
        self._again.discard(name)
        self._submit_locked(name)

    def _work(self, name: str, join: bool = False) -> None:
        handed = False  # to the join pool, or a timer: the node stays ours
        try:
            while True:
                try:
                    self.prov.drive(name, blocking=False, join=join)
                except Later as later:
                    with self._lock:  # from active to waiting in one hold of the lock
                        if name not in self._again:
                            handed = True
                            self._active.pop(name, None)
                            self._later_locked(name, later.seconds)
                    if handed:
                        return
                except Relaunch:
                    with self._lock:
                        self._again.discard(name)
                        self._active[name] = _RESERVED  # no rescan takes it meanwhile
                        if not self._relaunch:
                            self._relaunch_due = self.clock.monotonic() + RELAUNCH_GATHER
                        self._relaunch.append(name)
                        self._tick.notify()
                    handed = True
                    return
                except NeedsJoinSlot:
                    with self._lock:
                        self._again.discard(name)  # the join re-reads the node anyway
                        self._active[name] = self.joins.submit(self._work, name, True)
                    handed = True
                    return
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
            if not handed:
                with self._lock:
                    self._active.pop(name, None)

    def _launch_again(self, names: list[str]) -> None:
        """Nodes asked for anew (spot fallback): planned and launched as new requests."""
        try:
            recs = [r for r in map(self.store.node, names) if r is not None]
            log.info("daemon.relaunch count=%d hostlist=%s", len(recs), compress(names))
            self.submit_launch(recs, names)
        except Exception as exc:  # boundary: the timer thread; a rescan picks them up
            self._release(names)
            contain("node.relaunch", exc, self.prov.metrics)

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
        """Hand every node that needs work and has no worker (nor a timer) to one."""
        for rec in self.store.nodes():
            with self._lock:
                held = rec.name in self._active or rec.name in self._waiting
            if needs_work(rec.state, rec.want) and not held:
                self.submit(rec.name)

    def in_flight(self) -> int:
        with self._lock:
            working = sum(1 for f in self._active.values() if f is not _RESERVED)
            return working + len(self._waiting)

    def idle(self) -> bool:
        with self._lock:
            return not self._active and not self._waiting

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            self._waiting.clear()  # their state is in the store: the next daemon recovers them
            self._tick.notify()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.joins.shutdown(wait=True, cancel_futures=True)
