"""One view of a provider's fleet: a shared listing instead of a describe per node.

A thousand booting nodes that each asked for their own instance every half second
would spend an account's whole API budget on it (and EC2 throttles per account). A
:class:`FleetView` lists the cluster's instances in one paginated call at most every
``every`` seconds, when a waiting node looks and the listing is older than that (the
nodes' timers are due just after the next listing, so one of them takes it), and wakes
the nodes whose instance changed (running, or gone); the reconcile pass reads the same
listing when it is fresh enough (:meth:`FleetView.snapshot`). One view per provider
profile that :attr:`~slurm_burst.services.cloudcalls.ManagedCloud.lists_fleet` (EC2).

A listing is eventually consistent: an instance launched a moment ago may be missing
from it. :meth:`FleetView.look` says ``None`` (not known yet) for an instance the
listings taken since its launch have not shown for :data:`LISTING_LAG` seconds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from slurm_burst.core.cloud import CloudError, Instance
from slurm_burst.ports import Clock
from slurm_burst.services.cloudcalls import ManagedCloud

log = logging.getLogger(__name__)

EVERY = 3.0  # seconds between listings while a node waits on one
LISTING_LAG = 30.0  # seconds an instance may be missing from listings after its launch
GONE = "gone"  # :meth:`FleetView.look`: listed no more (terminated, or never there)


class FleetView:
    def __init__(
        self, cloud: ManagedCloud, cluster: str, clock: Clock, every: float = EVERY
    ) -> None:
        self.cloud = cloud
        self.cluster = cluster
        self.clock = clock
        self.every = every
        self.wake: Callable[[Iterable[str]], None] = lambda names: None  # set by the workers
        self._by_id: dict[str, Instance] = {}
        self._taken = -1.0  # clock.now() when the listing was asked for; -1: never
        self._watched: dict[str, tuple[str, float, str]] = {}  # id -> (node, since, state)
        self._cond = threading.Condition()
        self._refreshing = False
        self.listings = 0

    # -- what booting nodes ask ---------------------------------------------------
    def watch(self, instance_id: str, node: str, since: float) -> None:
        """Wake ``node`` when ``instance_id`` (launched at ``since``) changes state."""
        with self._cond:
            if instance_id not in self._watched:
                inst = self._by_id.get(instance_id)
                self._watched[instance_id] = (node, since, inst.state if inst else "")

    def unwatch(self, instance_id: str) -> None:
        with self._cond:
            self._watched.pop(instance_id, None)

    def look(self, instance_id: str, since: float) -> Instance | str | None:
        """The instance as last listed (listed again first if that is ``every`` s old and
        no one is listing); :data:`GONE` if the listings taken :data:`LISTING_LAG` s
        after its launch (``since``) do not show it; ``None`` while not known yet. A
        listing that fails is logged and left to the next look."""
        with self._cond:
            due = not self._refreshing and (
                self._taken < 0 or self.clock.now() - self._taken >= self.every
            )
        if due:
            try:
                self.refresh()
            except CloudError as exc:  # throttled, or the API away: the next look lists
                log.warning("fleet.list_failed provider=%s code=%s error=%s",
                            self.cloud.name, exc.code, str(exc)[:200])  # fmt: skip
        with self._cond:
            inst = self._by_id.get(instance_id)
            if inst is not None:
                return inst
            return GONE if self._taken > since + LISTING_LAG else None

    def next_in(self) -> float:
        """Seconds until the next listing is due (what a waiting node may sleep)."""
        with self._cond:
            if self._taken < 0:
                return self.every
            return max(0.5, self._taken + self.every - self.clock.now())

    # -- what the reconcile pass asks -------------------------------------------------
    def snapshot(self, max_age: float) -> list[Instance]:
        """The listing, taken again first if it is older than ``max_age`` seconds."""
        with self._cond:
            fresh = self._taken >= 0 and self.clock.now() - self._taken <= max_age
            if fresh and not self._refreshing:
                return list(self._by_id.values())
        self.refresh()
        with self._cond:
            return list(self._by_id.values())

    # -- inside -----------------------------------------------------------------
    def refresh(self) -> None:
        """List now (one caller at a time; a second waits for the first's listing)."""
        with self._cond:
            if self._refreshing:
                while self._refreshing:
                    self._cond.wait()
                return
            self._refreshing = True
        try:
            taken = self.clock.now()
            listed = self.cloud.list_fleet(self.cluster)
        finally:
            with self._cond:
                self._refreshing = False
                self._cond.notify_all()
        changed: list[str] = []
        with self._cond:
            self._by_id = {i.id: i for i in listed}
            self._taken = taken
            self.listings += 1
            for iid, (node, since, was) in list(self._watched.items()):
                inst = self._by_id.get(iid)
                state = inst.state if inst else (GONE if taken > since + LISTING_LAG else "")
                ready = inst is not None and inst.state == "running" and inst.address
                if state != was or ready:
                    self._watched[iid] = (node, since, state)
                    if ready or state in (GONE, "terminated", "stopped", "error"):
                        changed.append(node)
        if changed:
            self.wake(changed)
