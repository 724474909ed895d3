"""Protected mode: a node group that keeps failing to launch stops being offered to jobs.

After ``daemon.protect_after`` failed launches in a row the reconcile loop protects
the group: its nodes are drained in Slurm with a ``(Code:GroupProtected)`` reason
(pending jobs stay pending rather than resuming node after node into the same
failure) and launches are refused. The group comes back after
``daemon.protect_cooldown`` seconds, or at once with ``slurm-burst group enable``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from slurm_burst.config import NodeGroup
from slurm_burst.core.hostlist import compress
from slurm_burst.core.nodestate import reason as node_reason
from slurm_burst.core.slurm import SchedulerError
from slurm_burst.ports import NodeStore, Scheduler

log = logging.getLogger(__name__)


class GroupControl:
    def __init__(
        self,
        groups: Mapping[str, NodeGroup],
        store: NodeStore,
        scheduler: Scheduler,
        *,
        protect_cooldown: float,
    ) -> None:
        self.groups = groups
        self.store = store
        self.scheduler = scheduler
        self.protect_cooldown = protect_cooldown

    def protect(self, group: str, why: str, now: float) -> None:
        """Protected mode: the group's nodes drained in Slurm with a reason, launches refused."""
        g = self.groups[group]
        text = node_reason(
            "GroupProtected",
            f"node group {group} protected: {why}; back after "
            f"{self.protect_cooldown:g} s or 'slurm-burst group enable {group}'",
        )
        self.store.protect_group(group, now + self.protect_cooldown, text)
        self.scheduler.update_nodes(g.node_names(), state="drain", reason=text)
        log.error("group.protected group=%s nodes=%s reason=%s", group, g.hostlist, why)

    def enable(self, group: str) -> list[str]:
        """Leave protected mode: launches allowed, our drain lifted in Slurm (only ours:
        a drain an admin set with another reason stays). Returns the nodes undrained."""
        g = self.groups[group]
        self.store.unprotect_group(group)
        members = set(g.node_names())
        drained = [
            n.name
            for n in self.scheduler.nodes()
            if n.name in members and "(Code:GroupProtected)" in n.reason
        ]
        if drained:
            try:
                self.scheduler.update_nodes(drained, state="resume")
            except SchedulerError as exc:
                # scontrol refuses a whole batch for one node caught mid-transition
                # (powering down): undrain one by one, keep what Slurm still refuses
                log.warning("group.undrain_batch_refused group=%s error=%s", group, exc)
                drained = [n for n in drained if self._resume_one(n)]
        log.info("group.enabled group=%s undrained=%s", group, compress(drained) or "-")
        return drained

    def _resume_one(self, name: str) -> bool:
        try:
            self.scheduler.update_nodes([name], state="resume")
            return True
        except SchedulerError as exc:
            log.warning("group.undrain_refused node=%s error=%s", name, exc)
            return False
