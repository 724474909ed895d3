"""The reconcile loop: observe -> plan -> act -> record, once per ``daemon.poll_period``.

**Observe** reads each source once: Slurm's nodes (``sinfo --json``), burst
jobs (counts by state, ``SlurmCli.job_counts``) and partitions
(``scontrol show partition``), each provider's instances filtered by our cluster tag, the hub's
WireGuard peers, the mesh address pool, the ledger's open instances, then our own
node records last (see ``core.reconcile`` for why last). A source that fails is
left out of the snapshot and named in the pass report; the rules that need it
wait for the next pass, the others run.

**Plan** is ``core.reconcile.plan``: pure, from the snapshot and the clock.

**Act** runs each action on its own: one failing (a cloud error, Slurm busy)
is logged and counted and does not stop the rest. Actions are idempotent, so a
pass repeated (after a crash, or by a new leader) does no harm.

**Record** writes each action as an event (node, code, message), the pass
report to the state database (``slurm-burst status`` reads it) and the metrics.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

from slurm_burst.config import Fleet
from slurm_burst.core.cloud import CloudError, InUseError
from slurm_burst.core.errors import BurstError
from slurm_burst.core.hostlist import compress
from slurm_burst.core.nodestate import LIVE, NodeState, Want
from slurm_burst.core.placement import unheld
from slurm_burst.core.reconcile import (
    Action,
    Plan,
    Policy,
    Snapshot,
    findings,
    plan,
)
from slurm_burst.core.records import GroupHealth
from slurm_burst.core.slurm import SchedulerError, node_activity
from slurm_burst.core.usage import InstanceEvent
from slurm_burst.ports import AccountingLedger, Clock, Cloud, Mesh, Metrics, NodeStore, Scheduler
from slurm_burst.services.fleetview import FleetView
from slurm_burst.services.groups import GroupControl
from slurm_burst.services.lifecycle import Lifecycle
from slurm_burst.services.periodic import contain
from slurm_burst.services.status import fleet_status

log = logging.getLogger(__name__)

VIEW_MAX_AGE = 10.0  # seconds: a fleet listing this fresh (booting nodes keep it so) is reused


@dataclass
class PassReport:
    started: float
    seconds: float = 0.0
    errors: dict[str, str] = field(default_factory=dict)  # source or action -> error
    actions: dict[str, int] = field(default_factory=dict)  # kind -> count
    jobs: dict[str, int] = field(default_factory=dict)  # burst jobs by state
    slurm_calls: int = 0
    # Slurm's nodes: {"onprem"|"cloud": {activity: count}} (core.slurm.node_activity)
    slurm_nodes: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ReconcilerSettings:
    """What the reconcile loop needs of the config (wiring.daemon.reconciler_settings)."""

    fleet: Fleet
    policy: Policy  # the planner's thresholds


@dataclass(frozen=True, kw_only=True)
class ReconcilerPorts:
    store: NodeStore
    scheduler: Scheduler
    clouds: Mapping[str, Cloud]
    mesh: Mesh
    clock: Clock
    ledger: AccountingLedger | None = None  # the SQL ledger: open instances, rows closed
    metrics: Metrics | None = None
    views: Mapping[str, FleetView] = field(default_factory=dict)  # listings shared with boots


@dataclass(frozen=True, kw_only=True)
class NodeHands:
    """How the reconciler acts on one node: through the daemon, never by itself."""

    fail: Callable[[str, str, str], bool]  # fails a node from outside its worker
    submit: Callable[[str], None]  # hands a node to its worker (the daemon's pool)


class Reconciler:
    def __init__(
        self,
        settings: ReconcilerSettings,
        ports: ReconcilerPorts,
        hands: NodeHands,
        groups: GroupControl,
        lifecycle: Lifecycle,
    ) -> None:
        self.fleet = settings.fleet
        self.policy = settings.policy
        self.store = ports.store
        self.scheduler = ports.scheduler
        self.clouds = ports.clouds
        self.views = ports.views
        self.mesh = ports.mesh
        self.fail = hands.fail
        self.submit = hands.submit
        self.clock = ports.clock
        self.ledger = ports.ledger
        self.metrics = ports.metrics
        self.groups = groups  # protected mode
        self.lifecycle = lifecycle  # the one writer of node records

    # -- observe ----------------------------------------------------------------
    def observe(self, report: PassReport) -> Snapshot:
        def read(source: str, fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except BurstError as exc:  # a port's failure: the pass goes on without it
                report.errors[f"observe.{source}"] = f"{type(exc).__name__}: {exc}"
                log.warning("reconcile.observe_failed source=%s error=%s", source, exc)
                if self.metrics is not None:
                    self.metrics.phase_error(f"observe.{source}")
                return None

        fleet = self.fleet
        nodes = read("slurm_nodes", self.scheduler.nodes)
        ours = [n for n in nodes or () if fleet.group_of(n.name)]
        slurm_nodes = None if nodes is None else {n.name: n for n in ours}
        for (side, activity), n in node_activity(nodes or (), fleet.group_of).items():
            report.slurm_nodes.setdefault(side, {})[activity] = n
        jobs = read("slurm_jobs", lambda: self.scheduler.job_counts(fleet.burst_partitions()))
        for (_part, state), n in (jobs or {}).items():
            report.jobs[state] = report.jobs.get(state, 0) + n
        read("slurm_partitions", self.scheduler.partitions)
        report.slurm_calls += 3
        instances: dict[str, Any] = {}
        for name, cloud in self.clouds.items():
            view = self.views.get(name)
            listing = (
                partial(view.snapshot, VIEW_MAX_AGE)
                if view is not None
                else partial(cloud.list_instances, fleet.cluster)
            )
            listed = read(f"cloud.{name}", listing)
            if listed is not None:
                instances[name] = listed
        peers = read("mesh_peers", self.mesh.peers)
        addresses = read("mesh_addresses", self.store.addresses)
        ledger_open = (
            read("ledger", self.ledger.open_instances) if self.ledger is not None else None
        )
        groups = read("groups", self.store.groups) or {}
        suspects = read("suspects", self.store.suspects) or {}
        records = read("records", self.store.nodes)
        if records is None:  # without our own records no rule is safe
            raise RuntimeError(report.errors["observe.records"])
        return Snapshot(
            now=self.clock.now(),
            records={r.name: r for r in records},
            slurm_nodes=slurm_nodes,
            slurm_all=nodes or (),
            instances=instances,
            peers=peers,
            addresses=addresses,
            ledger_open=ledger_open,
            groups=groups,
            suspects=suspects,
        )

    # -- act ---------------------------------------------------------------------
    def act(self, p: Plan, snap: Snapshot, report: PassReport) -> None:
        for action in p.actions:
            try:
                self._act(action, snap)
            except Exception as exc:  # boundary: one action's failure, even a defect,
                # must not stop the repairs of every other node (counted as contained)
                if not isinstance(exc, BurstError):
                    contain(f"reconcile.act.{action.kind}", exc, self.metrics)
                report.errors[f"act.{action.kind}.{action.node or action.target}"] = str(exc)
                log.warning(
                    "reconcile.action_failed action=%s node=%s target=%s error=%s",
                    action.kind,
                    action.node,
                    action.target,
                    exc,
                )
                if self.metrics is not None:
                    self.metrics.phase_error(f"act.{action.kind}")
                continue
            report.actions[action.kind] = report.actions.get(action.kind, 0) + 1
            log.info(
                "reconcile.%s node=%s target=%s code=%s %s",
                action.kind,
                action.node,
                action.target,
                action.code,
                action.message,
            )
            self.store.event(
                snap.now,
                f"reconcile.{action.kind}",
                action.node,
                f"{action.code}: {action.message}",
            )
            if self.metrics is not None:
                self.metrics.reconcile_action(action.kind, action.code)

    def _act(self, a: Action, snap: Snapshot) -> None:
        if a.kind == "terminate":
            self.clouds[a.provider].terminate(a.target)
        elif a.kind == "fail_node":
            if a.code == "ResumeLost":
                self.store.add_request("resume", [a.node], [], snap.now)
            elif self.fail(a.node, a.code, a.message):
                self.submit(a.node)
        elif a.kind == "teardown":
            self.lifecycle.wanted(a.node, Want.DOWN)
            self.submit(a.node)
        elif a.kind == "remove_peer":
            self.mesh.remove_peer(a.target)
        elif a.kind == "release_address":
            rec = self.store.node(a.node)
            if rec is None or rec.state not in LIVE:  # re-checked: it may have come back
                self.store.release_address(a.node)
        elif a.kind == "close_ledger":
            assert self.ledger is not None
            self.ledger.instance_event(
                InstanceEvent(a.node, a.target, "terminated", snap.now, detail=a.code)
            )
        elif a.kind == "protect":
            self.groups.protect(a.target, a.message, snap.now)
        elif a.kind == "unprotect":
            self.groups.enable(a.target)
        elif a.kind == "report":
            pass  # said: the event and the log line above are the whole action
        elif a.kind == "return_to_service":
            # only once the state database takes writes again: else the next resume would
            # fail the same way; an error here leaves it to a later pass
            self.store.check_writable(snap.now)
            self.scheduler.update_nodes([a.node], state="resume")  # clears DOWN
            try:
                self.scheduler.update_nodes([a.node], state="power_down_force")  # idle~ again
            except SchedulerError as exc:
                # the node is in service already (the resume was the repair): Slurm may
                # refuse to power down a node the resume left powered down (22.05)
                log.info("reconcile.power_down_refused node=%s error=%s", a.node, exc)
        else:
            raise ValueError(f"unknown action {a.kind}")

    def sweep_placements(self, snap: Snapshot, report: PassReport) -> None:
        """Delete the per-job placement groups no node holds an instance in any more. A
        group whose instances are still shutting down (EC2: InUse) waits for a later
        pass; one the provider no longer knows is forgotten."""
        made = {name: pg.provider for name, pg in self.store.placements().items()}
        for name, provider in unheld(made, snap.records.values()):
            cloud = self.clouds.get(provider)
            if cloud is None:  # the provider left the config: nothing can delete it here
                continue
            try:
                cloud.delete_placement(name)
            except InUseError:
                log.info("reconcile.placement_in_use name=%s provider=%s", name, provider)
                continue
            except CloudError as exc:
                report.errors[f"act.delete_placement.{name}"] = str(exc)
                log.warning("reconcile.placement_delete_failed name=%s error=%s", name, exc)
                continue
            self.store.forget_placement(name)
            self.store.event(snap.now, "placement.deleted", "", f"{provider}/{name}")
            report.actions["delete_placement"] = report.actions.get("delete_placement", 0) + 1

    def keep_caps(
        self, snap: Snapshot, report: PassReport, groups: Mapping[str, GroupHealth]
    ) -> None:
        """Each capped group's powered-down nodes past its room drained, and undrained as
        room comes back (GroupControl.keep_cap); a protected group is drained whole.
        ``groups``: the groups' protected mode as this pass left it."""
        if snap.slurm_nodes is None:
            return  # Slurm unread: nothing is known of what it may power up
        # a dynamic group's cap is the nodes slurmctld holds (keep_dynamic)
        capped = [g for g in self.fleet.node_groups.values() if g.limit < g.count and not g.dynamic]
        if not capped:
            return
        states: dict[str, dict[str, NodeState]] = {g.name: {} for g in capped}
        for r in snap.records.values():  # the records by group, once for every group
            if r.group in states:
                states[r.group][r.name] = r.state
        for g in capped:
            health = groups.get(g.name)
            if health is not None and health.protected(snap.now):
                continue
            try:
                cap = self.groups.keep_cap(g.name, states[g.name], snap.slurm_nodes)
            except BurstError as exc:  # Slurm refused: tried again next pass
                report.errors[f"cap.{g.name}"] = str(exc)
                log.warning("reconcile.cap_failed group=%s error=%s", g.name, exc)
                if self.metrics is not None:
                    self.metrics.phase_error("cap")
                continue
            if cap.drain or cap.release:
                report.actions["cap"] = report.actions.get("cap", 0) + 1
            if self.metrics is not None:
                self.metrics.cap(g.name, cap.room)

    def keep_dynamic(
        self, snap: Snapshot, report: PassReport, groups: Mapping[str, GroupHealth]
    ) -> None:
        """Each dynamic group's nodes within max_nodes made in slurmctld, those past it
        and those of a dynamic group no longer configured deleted once safe
        (GroupControl.keep_dynamic, core.dynamic); a protected group (``groups``, as
        this pass left them) makes none."""
        if snap.slurm_nodes is None:
            return  # Slurm unread: what it holds is not known
        states = {r.name: r.state for r in snap.records.values()}
        dynamic = [g for g in self.fleet.node_groups.values() if g.dynamic]
        for g in dynamic:
            health = groups.get(g.name)
            grow = health is None or not health.protected(snap.now)
            try:
                made = self.groups.keep_dynamic(g.name, states, snap.slurm_nodes, grow=grow)
            except BurstError as exc:  # Slurm refused (MaxNodeCount, a node busy): next pass
                self._dynamic_failed(f"dynamic.{g.name}", exc, snap, report)
                continue
            for kind, names in (("create_nodes", made.create), ("delete_nodes", made.delete)):
                if names:
                    report.actions[kind] = report.actions.get(kind, 0) + len(names)
                    self.store.event(
                        snap.now, f"dynamic.{kind}", "", f"{g.name}: {compress(list(names))}"
                    )
        try:
            gone = self.groups.delete_strays(snap.slurm_all, states)
        except BurstError as exc:
            self._dynamic_failed("dynamic.strays", exc, snap, report)
            return
        if gone:
            report.actions["delete_nodes"] = report.actions.get("delete_nodes", 0) + len(gone)
            self.store.event(
                snap.now, "dynamic.delete_nodes", "", f"no dynamic group: {compress(gone)}"
            )

    def _dynamic_failed(
        self, where: str, exc: BurstError, snap: Snapshot, report: PassReport
    ) -> None:
        report.errors[where] = str(exc)
        log.warning("reconcile.dynamic_failed where=%s error=%s", where, exc)
        if self.metrics is not None:
            self.metrics.phase_error("dynamic")

    # -- one pass ----------------------------------------------------------------
    def pass_once(self) -> PassReport:
        report = PassReport(started=self.clock.now())
        t0 = self.clock.monotonic()
        snap = self.observe(report)
        p = plan(snap, self.policy)
        self.act(p, snap, report)
        # protected mode read again (this pass may have protected a group), once for the
        # cap's drain and the dynamic groups' nodes, when a group has either
        kept = any(g.dynamic or g.limit < g.count for g in self.fleet.node_groups.values())
        groups = self.store.groups() if kept else {}
        self.keep_caps(snap, report, groups)
        self.keep_dynamic(snap, report, groups)
        self.sweep_placements(snap, report)
        self.store.set_suspects(p.suspects)
        report.seconds = self.clock.monotonic() - t0
        self.record(snap, report, p)
        return report

    def record(self, snap: Snapshot, report: PassReport, p: Plan | None = None) -> None:
        records = list(snap.records.values())
        view = fleet_status(self.fleet, records, snap.groups, snap.now)
        ended = self.clock.now()
        summary = {
            **asdict(report),
            "ended": ended,
            "nodes": {n: dict(g.nodes) for n, g in view.groups.items() if g.nodes},
            "spend_per_hour": {n: g.spend_per_hour for n, g in view.groups.items() if g.live},
        }
        self.store.record_pass(summary)
        if report.actions or report.errors:
            log.info(
                "reconcile.pass seconds=%.3f actions=%s errors=%d",
                report.seconds,
                report.actions,
                len(report.errors),
            )
        m = self.metrics
        if m is not None:
            m.reconcile_pass(report.seconds, ended)
            m.fleet(view)  # nodes by state, spend, protected mode: what status shows
            budgets = {id(b): b for c in self.clouds.values() if (b := getattr(c, "budget", None))}
            for budget in budgets.values():  # each account's API budget left, once
                budget.export()
            if snap.slurm_nodes is not None:
                m.slurm_node_activity(
                    {(side, a): n for side, by in report.slurm_nodes.items() for a, n in by.items()}
                )
            if p is not None:
                f = findings(p.suspects, records, snap.now, self.fleet.node_groups, self.clouds)
                m.findings(f.orphans, f.stale_peers, f.leaked_addresses, f.oldest_resume)
