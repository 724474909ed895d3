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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import lru_cache, partial
from typing import Any

from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config
from slurm_burst.core.hostlist import compress
from slurm_burst.core.nodestate import LIVE
from slurm_burst.core.nodestate import NodeState as S
from slurm_burst.core.nodestate import reason as node_reason
from slurm_burst.core.pricing import dollars
from slurm_burst.core.reconcile import Action, Plan, Policy, Snapshot, plan, summarize
from slurm_burst.ports import Cloud, Mesh, Scheduler

log = logging.getLogger(__name__)


@dataclass
class PassReport:
    started: float
    seconds: float = 0.0
    errors: dict[str, str] = field(default_factory=dict)  # source or action -> error
    actions: dict[str, int] = field(default_factory=dict)  # kind -> count
    jobs: dict[str, int] = field(default_factory=dict)  # burst jobs by state
    slurm_calls: int = 0


def policy(cfg: Config) -> Policy:
    d = cfg.daemon
    return Policy(
        orphan_grace=d.orphan_grace,
        resume_timeout=float(cfg.slurm.resume_timeout),
        protect_after=d.protect_after,
        protect_cooldown=d.protect_cooldown,
        lost_resume_grace=max(60.0, 2 * d.poll_period),
        register_timeout=d.register_timeout,
    )


class Reconciler:
    def __init__(
        self,
        cfg: Config,
        store: Store,
        scheduler: Scheduler,
        clouds: dict[str, Cloud],
        mesh: Mesh,
        provisioner: Any,
        ledger: Any | None = None,  # the SQL ledger (open_instances, instance_event)
        submit: Callable[[str], None] = lambda name: None,
        metrics: Any | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.scheduler = scheduler
        self.clouds = clouds
        self.mesh = mesh
        self.prov = provisioner
        self.ledger = ledger
        self.submit = submit
        self.metrics = metrics
        self.now = clock
        self.policy = policy(cfg)

    # -- observe ----------------------------------------------------------------
    def observe(self, report: PassReport) -> Snapshot:
        def read(source: str, fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except Exception as exc:
                report.errors[f"observe.{source}"] = f"{type(exc).__name__}: {exc}"
                log.warning("reconcile.observe_failed source=%s error=%s", source, exc)
                if self.metrics is not None:
                    self.metrics.phase_errors.labels(f"observe.{source}").inc()
                return None

        cfg = self.cfg
        nodes = read("slurm_nodes", self.scheduler.nodes)
        slurm_nodes = None if nodes is None else {n.name: n for n in nodes if cfg.group_of(n.name)}
        jobs = read("slurm_jobs", lambda: self.scheduler.job_counts(cfg.burst_partitions()))
        for (_part, state), n in (jobs or {}).items():
            report.jobs[state] = report.jobs.get(state, 0) + n
        read("slurm_partitions", self.scheduler.partitions)
        report.slurm_calls += 3
        instances: dict[str, Any] = {}
        for name, cloud in self.clouds.items():
            listed = read(f"cloud.{name}", partial(cloud.list_instances, cfg.cluster.name))
            if listed is not None:
                instances[name] = listed
        peers = read("mesh_peers", self.mesh.peers)
        addresses = read("mesh_addresses", self.store.addresses)
        ledger_open = (
            read("ledger", self.ledger.open_instances) if self.ledger is not None else None
        )
        groups = read("groups", self.store.groups) or {}
        suspects = read("suspects", lambda: self.store.meta_get("suspects")) or {}
        records = read("records", self.store.nodes)
        if records is None:  # without our own records no rule is safe
            raise RuntimeError(report.errors["observe.records"])
        return Snapshot(
            now=self.now(),
            records={r.name: r for r in records},
            slurm_nodes=slurm_nodes,
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
            except Exception as exc:
                report.errors[f"act.{action.kind}.{action.node or action.target}"] = str(exc)
                log.warning(
                    "reconcile.action_failed action=%s node=%s target=%s error=%s",
                    action.kind,
                    action.node,
                    action.target,
                    exc,
                )
                if self.metrics is not None:
                    self.metrics.phase_errors.labels(f"act.{action.kind}").inc()
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
                self.metrics.actions.labels(action.kind, action.code).inc()

    def _act(self, a: Action, snap: Snapshot) -> None:
        if a.kind == "terminate":
            self.clouds[a.provider].terminate(a.target)
        elif a.kind == "fail_node":
            if a.code == "ResumeLost":
                self.store.add_request("resume", [a.node], [], snap.now)
            elif self.prov.fail(a.node, a.code, a.message):
                self.submit(a.node)
        elif a.kind == "teardown":
            self.store.update(a.node, want="down")
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
                node=a.node,
                instance_id=a.target,
                provider="",
                size="",
                price_per_hour=0.0,
                event="terminated",
                at=snap.now,
                detail=a.code,
            )
        elif a.kind == "protect":
            self.protect(a.target, a.message, snap.now)
        elif a.kind == "unprotect":
            self.enable(a.target)
        else:
            raise ValueError(f"unknown action {a.kind}")

    def protect(self, group: str, why: str, now: float) -> None:
        """Protected mode: the group's nodes drained in Slurm with a reason, launches refused."""
        g = self.cfg.node_groups[group]
        text = node_reason(
            "GroupProtected",
            f"node group {group} protected: {why}; back after "
            f"{self.cfg.daemon.protect_cooldown:g} s or 'slurm-burst group enable {group}'",
        )
        self.store.protect_group(group, now + self.cfg.daemon.protect_cooldown, text)
        self.scheduler.update_nodes(g.node_names(), state="drain", reason=text)
        log.error("group.protected group=%s nodes=%s reason=%s", group, g.hostlist, why)

    def enable(self, group: str) -> None:
        """Leave protected mode: launches allowed, our drain lifted in Slurm."""
        g = self.cfg.node_groups[group]
        self.store.unprotect_group(group)
        members = set(g.node_names())
        drained = [
            n.name
            for n in self.scheduler.nodes()
            if n.name in members and "(Code:GroupProtected)" in n.reason
        ]
        if drained:
            self.scheduler.update_nodes(drained, state="resume")
        log.info("group.enabled group=%s undrained=%s", group, compress(drained) or "-")

    # -- one pass ----------------------------------------------------------------
    def pass_once(self) -> PassReport:
        report = PassReport(started=self.now())
        t0 = time.monotonic()
        snap = self.observe(report)
        p = plan(snap, self.policy)
        self.act(p, snap, report)
        self.store.meta_set("suspects", p.suspects)
        report.seconds = time.monotonic() - t0
        self.record(snap, report)
        return report

    def record(self, snap: Snapshot, report: PassReport) -> None:
        records = list(snap.records.values())
        by_group = summarize(records)
        spend = spend_rate(self.cfg, records)
        summary = {
            **asdict(report),
            "ended": self.now(),
            "nodes": by_group,
            "spend_per_hour": {g: float(dollars(v)) for g, v in spend.items()},
        }
        self.store.meta_set("reconcile", summary)
        if report.actions or report.errors:
            log.info(
                "reconcile.pass seconds=%.3f actions=%s errors=%d",
                report.seconds,
                report.actions,
                len(report.errors),
            )
        m = self.metrics
        if m is not None:
            m.passes.inc()
            m.pass_duration.observe(report.seconds)
            m.last_pass.set(self.now())
            m.set_nodes(by_group, list(self.cfg.node_groups))
            for g in self.cfg.node_groups:
                m.spend_rate.labels(g).set(float(dollars(spend.get(g, 0))))
                health = snap.groups.get(g)
                m.protected.labels(g).set(1 if health and health.protected(snap.now) else 0)


def spend_rate(cfg: Config, records: list[Any]) -> dict[str, int]:
    """Micro-dollars per hour of the instances live now, by group.

    An estimate for status and metrics (the ledger prices each instance exactly):
    prices are looked up once per size and launch minute.
    """
    table = cfg.rate_table
    gpus_of = {name: g.gpus for name, g in cfg.node_groups.items()}

    @lru_cache(maxsize=4096)
    def price(size: str, gpus: int, minute: int) -> int:
        p = table.price(size, gpus, datetime.fromtimestamp(minute * 60, UTC))
        return 0 if p is None else p.micros_per_hour

    out: dict[str, int] = {}
    for r in records:
        if not r.instance_id or r.state not in LIVE or r.state == S.FAILED:
            continue
        minute = int((r.requested_at or r.state_since) // 60)
        out[r.grp] = out.get(r.grp, 0) + price(r.size, gpus_of.get(r.grp, 0), minute)
    return out


def status(cfg: Config, store: Store, now: float, leader: str | None = None) -> dict[str, Any]:
    """What ``slurm-burst status`` shows, from the state database alone."""
    beat = store.heartbeat()
    records = store.nodes()
    groups = store.groups()
    last = store.meta_get("reconcile")
    followers = {
        k.removeprefix("follower."): v
        for k, v in store.meta_items("follower.").items()
        if now - float(v.get("at", 0)) < cfg.daemon.heartbeat_stale
    }
    age = None if beat is None else now - float(beat["at"])
    spend = spend_rate(cfg, records)
    return {
        "daemon": {
            "running": age is not None and age < cfg.daemon.heartbeat_stale,
            "heartbeat_age": age,
            "pid": None if beat is None else beat.get("pid"),
            "node_id": None if beat is None else beat.get("node_id"),
            "in_flight": None if beat is None else beat.get("in_flight"),
        },
        "leader": leader if leader is not None else (beat or {}).get("node_id"),
        "followers": sorted(followers),
        "last_pass": last,
        "nodes": summarize(records),
        "protected_groups": {
            name: {"until": g.protected_until, "reason": g.reason, "failures": g.failures}
            for name, g in groups.items()
            if g.protected(now)
        },
        "launch_failures_in_a_row": {n: g.failures for n, g in groups.items() if g.failures},
        "unavailable_sizes": [
            {"provider": p, "size": z, "until": until, "code": code}
            for (p, z), (until, code) in sorted(store.unavailable(now).items())
        ],
        "spend_per_hour": {g: float(dollars(v)) for g, v in sorted(spend.items())},
        "spend_per_hour_total": float(dollars(sum(spend.values()))),
    }
