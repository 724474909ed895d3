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
from collections.abc import Callable
from typing import Any

from slurm_burst.config import Config
from slurm_burst.core.slurm import SlurmNode
from slurm_burst.core.warm import PoolNode, pool_moves, warm_nodes
from slurm_burst.ports import Clock, NodeStore, Scheduler

log = logging.getLogger(__name__)

OVERRIDE = "warm."  # store meta key prefix: warm.<group> -> {"nodes", "until", "by"}
GOING_DOWN = frozenset({"POWERING_DOWN", "POWER_DOWN"})


class WarmKeeper:
    def __init__(
        self,
        cfg: Config,
        scheduler: Scheduler,
        store: NodeStore,
        clock: Clock,
        local: Callable[[float], time.struct_time] = time.localtime,
    ) -> None:
        self.cfg = cfg
        self.scheduler = scheduler
        self.store = store
        self.clock = clock
        self.local = local
        self.pools = {g.name: g.warm_pool() for g in cfg.node_groups.values() if g.warm}
        self.pools = {k: v for k, v in self.pools.items() if v}
        self.idle_since: dict[str, float] = {}

    def want(self, group: str, now: float) -> int:
        return wanted(self.cfg, self.store, group, now, self.local)

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
            up, down = pool_moves(pool, want, idle_for, self._idle_limit(group))
            for state, moved in (("power_up", up), ("power_down", down)):
                if not moved:
                    continue
                try:
                    self.scheduler.update_nodes(moved, state=state)
                except Exception as exc:  # the next pass reads Slurm again
                    log.warning("warm.%s_failed group=%s error=%s", state, group, exc)
                    continue
                for name in moved:
                    self.idle_since.pop(name, None)
                    self.store.event(now, f"warm.{state}", name, f"group {group}: {want} warm")
                log.info("warm.%s group=%s want=%d nodes=%s", state, group, want, ",".join(moved))
            out[group] = (want, up, down)
        return out

    def _idle_limit(self, group: str) -> float:
        part = self.cfg.partitions.get(self.cfg.node_groups[group].partition)
        limit = part.suspend_time if part is not None else None
        return float(self.cfg.slurm.suspend_time if limit is None else limit)


def wanted(
    cfg: Config,
    store: NodeStore,
    group: str,
    now: float,
    local: Callable[[float], time.struct_time] = time.localtime,
) -> int:
    """How many of the group's warm pool should be up at ``now``: its largest active
    window, or a ``group warm`` override while it lasts, whichever is more."""
    g = cfg.node_groups[group]
    t = local(now)
    n = warm_nodes(g.warm_windows(), t.tm_wday, t.tm_hour * 60 + t.tm_min)
    override: Any = store.meta_get(OVERRIDE + group)
    if isinstance(override, dict) and float(override.get("until", 0)) > now:
        n = max(n, int(override.get("nodes", 0)))
    return min(n, len(g.warm_pool()))


def _pool_node(n: SlurmNode) -> PoolNode:
    up = not n.powered_down and not n.flags & GOING_DOWN
    return PoolNode(
        n.name,
        up=up,
        idle=up and n.state == "idle" and not n.powering_up and n.registered,
        usable=n.state != "down" and "DRAIN" not in n.flags and "FAIL" not in n.flags,
    )
