"""What a node group may take, in Slurm: protected mode and the node cap.

Protected mode: after ``daemon.protect_after`` failed launches in a row the reconcile
loop protects the group: its nodes are drained in Slurm with a ``(Code:GroupProtected)``
reason (pending jobs stay pending rather than resuming node after node into the same
failure) and launches are refused. The group comes back after
``daemon.protect_cooldown`` seconds, or at once with ``slurm-burst group enable``.

The node cap (``max_nodes`` below ``count``): each reconcile pass keeps the group's
powered-down nodes beyond its room drained with a ``(Code:GroupAtCap)`` reason
(:mod:`slurm_burst.core.cap`), and lifts that drain as instances are released.

A dynamic group (``nodes = "dynamic"``) needs no such drain: slurmctld holds only its
first ``max_nodes`` nodes, which each pass creates when missing and deletes past the
limit once safe (:mod:`slurm_burst.core.dynamic`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from slurm_burst.config import NodeGroup
from slurm_burst.config.model import DYNAMIC_PREFIX
from slurm_burst.core.cap import CapPlan, cap_reason, free, plan_cap
from slurm_burst.core.dynamic import DynamicPlan, deletable, plan_dynamic, strays
from slurm_burst.core.hostlist import compress
from slurm_burst.core.nodestate import NodeState
from slurm_burst.core.nodestate import reason as node_reason
from slurm_burst.core.slurm import SchedulerError, SlurmNode
from slurm_burst.ports import NodeStore, Scheduler
from slurm_burst.services.slurmconf import node_settings

log = logging.getLogger(__name__)

PROTECTED = "(Code:GroupProtected)"


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
        names = g.node_names()
        if g.dynamic:  # those slurmctld holds now (no more are made while protected)
            held = {n.name for n in self.scheduler.nodes()}
            names = [n for n in names if n in held]
        if names:
            self.scheduler.update_nodes(names, state="drain", reason=text)
        log.error("group.protected group=%s nodes=%s reason=%s", group, g.hostlist, why)

    def enable(self, group: str) -> list[str]:
        """Leave protected mode: launches allowed, our drain lifted in Slurm (only ours:
        a drain an admin set with another reason stays). Returns the nodes undrained."""
        g = self.groups[group]
        self.store.unprotect_group(group)
        names = g.node_names()
        members = set(names)
        slurm = {n.name: n for n in self.scheduler.nodes() if n.name in members}
        drained = [n for n in names if n in slurm and PROTECTED in slurm[n].reason]
        if drained and g.limit < g.count:
            # capped: the nodes past its room take the cap's drain instead of none, so
            # Slurm never sees more of them available than the cap allows. The plan sees
            # the protected drain as the cap's own: what it releases is lifted, the other
            # free ones keep a drain (the cap's), the ones holding a place are lifted too
            states = {r.name: r.state for r in self.store.nodes() if r.group == group}
            text = cap_reason(group, g.limit)
            view = {n: x._replace(reason=text) if n in drained else x for n, x in slurm.items()}
            lifted = set(plan_cap(names, g.limit, states, view, first=g.warm_pool()).release)
            capped = {n for n in drained if n not in lifted and free(slurm[n])}
            if capped:
                self.scheduler.update_nodes(
                    [n for n in drained if n in capped], state="drain", reason=text
                )
            drained = [n for n in drained if n not in capped]
        drained = self._undrain(group, drained)
        log.info("group.enabled group=%s undrained=%s", group, compress(drained) or "-")
        return drained

    def _undrain(self, group: str, names: list[str]) -> list[str]:
        """Lift a drain of ours from ``names``; the nodes whose drain was lifted."""
        if not names:
            return []
        try:
            self.scheduler.update_nodes(names, state="resume")
        except SchedulerError as exc:
            # scontrol refuses a whole batch for one node caught mid-transition
            # (powering down): undrain one by one, keep what Slurm still refuses
            log.warning("group.undrain_batch_refused group=%s error=%s", group, exc)
            names = [n for n in names if self._resume_one(n)]
        return names

    def keep_cap(
        self, group: str, states: Mapping[str, NodeState], slurm: Mapping[str, SlurmNode]
    ) -> CapPlan:
        """One pass of the node cap for ``group`` (``max_nodes`` below ``count``, not
        protected): drain what Slurm must not power up, undrain what it may again."""
        g = self.groups[group]
        names, warm = g.node_names(), g.warm_pool()
        plan = plan_cap(names, g.limit, states, slurm, first=warm)
        if plan.drain:
            # Slurm may have given one of them a job since the pass read its nodes: a
            # drain then requeues that job. Read again just before (a window of
            # milliseconds, not the pass's), and drain what both reads agree on.
            members = set(names)
            fresh = {n.name: n for n in self.scheduler.nodes() if n.name in members}
            again = set(plan_cap(names, g.limit, states, fresh, first=warm).drain)
            plan = replace(plan, drain=tuple(n for n in plan.drain if n in again))
        if plan.drain:
            self.scheduler.update_nodes(
                list(plan.drain), state="drain", reason=cap_reason(group, g.limit)
            )
        released = self._undrain(group, list(plan.release))
        if plan.drain or released:
            log.info("group.cap group=%s limit=%d holding=%d room=%d capped=%s released=%s",
                     group, g.limit, plan.holding, plan.room, compress(list(plan.drain)) or "-",
                     compress(released) or "-")  # fmt: skip
        return plan

    def keep_dynamic(
        self,
        group: str,
        states: Mapping[str, NodeState],
        slurm: Mapping[str, SlurmNode],
        *,
        grow: bool = True,
    ) -> DynamicPlan:
        """One pass of a dynamic group: its nodes within max_nodes created in slurmctld
        (one ``scontrol create``; not while ``grow`` is False: protected), those past it
        deleted once safe. SchedulerError when Slurm refuses either (the next pass
        tries again; Slurm deletes what it may of a refused batch)."""
        g = self.groups[group]
        plan = plan_dynamic(g.node_names(), g.limit, states, slurm, create=grow)
        if plan.create:
            # a create naming a node that exists fails, and on 24.11 deletes that node if
            # it holds no job (test_slurm_versions): read again just before, make only
            # what is still missing
            here = {n.name for n in self.scheduler.nodes()}
            plan = replace(plan, create=tuple(n for n in plan.create if n not in here))
        if plan.create:
            self.scheduler.create_nodes(list(plan.create), node_settings(g))
            log.info("group.dynamic_created group=%s nodes=%s", group, compress(list(plan.create)))
        if plan.delete:
            self.scheduler.delete_nodes(list(plan.delete))
            log.info("group.dynamic_deleted group=%s nodes=%s", group, compress(list(plan.delete)))
        return plan

    def delete_strays(
        self, nodes: Sequence[SlurmNode], states: Mapping[str, NodeState]
    ) -> list[str]:
        """Delete the nodes of a dynamic group the config no longer has (its feature
        ``sbdyn_<group>``) that are safe to delete; the names deleted."""
        features = [g.nodeset for g in self.groups.values() if g.dynamic]
        gone = [n.name for n in strays(nodes, features, DYNAMIC_PREFIX)
                if deletable(n, states.get(n.name))]  # fmt: skip
        if gone:
            self.scheduler.delete_nodes(gone)
            log.info("group.dynamic_strays_deleted nodes=%s", compress(gone))
        return gone

    def _resume_one(self, name: str) -> bool:
        try:
            self.scheduler.update_nodes([name], state="resume")
            return True
        except SchedulerError as exc:
            log.warning("group.undrain_refused node=%s error=%s", name, exc)
            return False
