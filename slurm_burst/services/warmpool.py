"""Warm capacity in the daemon: keep a node group's warm nodes joined by schedule.

The mechanism, the same on every supported Slurm (22.05 cannot change the suspend
exclusions at run time, so nothing here does): ``conf render`` puts each group's warm
pool (its last nodes, as many as its largest window) in ``SuspendExcNodes``, so Slurm
never powers them down. After each reconcile pass the leader

1. works out how many of each pool should be up now: the largest active window (the
   controller's local time), or a ``slurm-burst group warm`` override while it lasts;
2. asks Slurm to power up those of the first ``want`` pool nodes that are down
   (``scontrol update state=power_up``: Slurm then calls the resume hook as for a job,
   and the node joins as any other);
3. powers down (``state=power_down``) the other pool nodes once they have been idle as
   long as their partition's SuspendTime, which is what Slurm would have done.

One ``sinfo`` a pass, only when a group has a warm pool; the updates are batched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from slurm_burst.config import NodeGroup
from slurm_burst.core.slurm import SchedulerError, SlurmNode
from slurm_burst.core.warm import PoolNode, pool_moves, warm_nodes
from slurm_burst.ports import Clock, NodeStore, Scheduler

log = logging.getLogger(__name__)

GOING_DOWN = frozenset({"POWERING_DOWN", "POWER_DOWN"})


@dataclass(frozen=True, kw_only=True)
class WarmSettings:
    """The groups with warm pools, and how long each group's idle node stays up (its
    partition's SuspendTime, else slurm.suspend_time): wiring.daemon.warm_settings."""

    groups: Mapping[str, NodeGroup]
    idle_limits: Mapping[str, float]


class WarmKeeper:
    def __init__(
        self,
        settings: WarmSettings,
        scheduler: Scheduler,
        store: NodeStore,
        clock: Clock,
        local: Callable[[float], time.struct_time] = time.localtime,
    ) -> None:
        self.groups = settings.groups
        self.idle_limits = settings.idle_limits
        self.scheduler = scheduler
        self.store = store
        self.clock = clock
        self.local = local
        self.pools = {g.name: g.warm_pool() for g in self.groups.values() if g.warm}
        self.pools = {k: v for k, v in self.pools.items() if v}
        self.idle_since: dict[str, float] = {}

    def want(self, group: str, now: float) -> int:
        return wanted(self.groups[group], self.store, now, self.local)

    def pass_once(self) -> dict[str, tuple[int, list[str], list[str]]]:
        """{group: (want, powered up, powered down)} of this pass."""
        if not self.pools:
            return {}
        now = self.clock.now()
        nodes = {n.name: n for n in self.scheduler.nodes()}
        out = {}
        for group, names in self.pools.items():
            want = self.want(group, now)
            pool = [_pool_node(nodes[n]) for n in names if n in nodes]
            for p in pool:
                if p.idle:
                    self.idle_since.setdefault(p.name, now)
                else:
                    self.idle_since.pop(p.name, None)
            idle_for = {name: now - since for name, since in self.idle_since.items()}
            up, down = pool_moves(pool, want, idle_for, self.idle_limits[group])
            for state, moved in (("power_up", up), ("power_down", down)):
                if not moved:
                    continue
                try:
                    self.scheduler.update_nodes(moved, state=state)
                except SchedulerError as exc:  # the next pass reads Slurm again
                    log.warning("warm.%s_failed group=%s error=%s", state, group, exc)
                    continue
                for name in moved:
                    self.idle_since.pop(name, None)
                    self.store.event(now, f"warm.{state}", name, f"group {group}: {want} warm")
                log.info("warm.%s group=%s want=%d nodes=%s", state, group, want, ",".join(moved))
            out[group] = (want, up, down)
        return out


def wanted(
    g: NodeGroup,
    store: NodeStore,
    now: float,
    local: Callable[[float], time.struct_time] = time.localtime,
) -> int:
    """How many of the group's warm pool should be up at ``now``: its largest active
    window, or a ``group warm`` override while it lasts, whichever is more."""
    group = g.name
    t = local(now)
    n = warm_nodes(g.warm_windows(), t.tm_wday, t.tm_hour * 60 + t.tm_min)
    override = store.warm_override(group)
    if override is not None and override.until > now:
        n = max(n, override.nodes)
    return min(n, len(g.warm_pool()))


def _pool_node(n: SlurmNode) -> PoolNode:
    up = not n.powered_down and not n.flags & GOING_DOWN
    return PoolNode(
        n.name,
        up=up,
        idle=up and n.state == "idle" and not n.powering_up and n.registered,
        usable=n.state != "down" and "DRAIN" not in n.flags and "FAIL" not in n.flags,
    )
