"""``slurm-burst daemon``: takes the hooks' requests and drives each node's state machine.

One process per controller host (an exclusive lock on the state directory).
The main thread waits on the wake-up socket (or ``poll_period``), writes the
heartbeat the hooks check, turns pending requests into each node's ``want``,
and hands nodes that need work to a pool of ``daemon.workers`` threads, at
most one worker per node. After a crash or restart, every node whose state is
not where its ``want`` says is picked up again from the database: the steps
are idempotent, so finishing a half-done step is safe.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from slurm_burst.config import Fleet
from slurm_burst.core.cap import CODE as OVER_CAP
from slurm_burst.core.cap import over_cap
from slurm_burst.core.hostlist import compress
from slurm_burst.core.jobs import jobs_by_node
from slurm_burst.core.nodestate import RESUMING, NodeState, Want
from slurm_burst.core.records import DuplicateRequest, NodeRecord, Request, StoreError
from slurm_burst.ports import (
    Clock,
    DaemonHost,
    LeaderElection,
    Metrics,
    NodeStore,
    RequestSpool,
    ServedStore,
)
from slurm_burst.services.burstpolicy import BurstPolicy
from slurm_burst.services.chargeback import ChargebackLoop
from slurm_burst.services.gputelemetry import GpuTelemetry
from slurm_burst.services.interruptions import Interruptions
from slurm_burst.services.lifecycle import Lifecycle
from slurm_burst.services.nodeapi import NodeApi
from slurm_burst.services.periodic import contain
from slurm_burst.services.provisioner import Provisioner
from slurm_burst.services.reconciler import Reconciler
from slurm_burst.services.registration import Registrations
from slurm_burst.services.stagework import StageWork
from slurm_burst.services.warmpool import WarmKeeper
from slurm_burst.services.workers import Workers

log = logging.getLogger(__name__)

SAMPLE_JOIN = 15.0  # seconds the GPU telemetry may take to finish its pass at shutdown
SERVE_RETRY = 30.0  # seconds between tries to serve a mesh store that could not be


@dataclass(frozen=True, kw_only=True)
class DaemonSettings:
    """What the daemon's own loop needs of the config (wiring.daemon.daemon_settings)."""

    fleet: Fleet
    poll_period: float
    metrics_listen: str = ""  # HOST:PORT of the metrics endpoint; '' none


@dataclass(frozen=True, kw_only=True)
class DaemonPorts:
    store: NodeStore
    leader: LeaderElection
    clock: Clock
    host: DaemonHost  # the host lock, the wake-up socket
    spool: RequestSpool | None = None  # requests hooks kept when the database could not
    metrics: Metrics | None = None
    served: Sequence[ServedStore] = ()  # mesh stores: served while this daemon leads


@dataclass(frozen=True, kw_only=True)
class DaemonServices:
    """The services the daemon runs: always the first three; the rest when configured."""

    provisioner: Provisioner
    workers: Workers
    reconciler: Reconciler
    lifecycle: Lifecycle  # the one writer of node records
    registrations: Registrations | None = None  # publishes slurmd registrations (prolog)
    ledger_loop: ChargebackLoop | None = None
    telemetry: GpuTelemetry | None = None  # GPU samples of joined nodes, while leading
    policy: BurstPolicy | None = None  # the burst policy's passes (policy.enabled)
    warm: WarmKeeper | None = None  # keeps warm pools up by schedule, after each pass
    stagework: StageWork | None = None  # jobs' stage-ins, as their users (staging.store)
    node_api: NodeApi | None = None  # the nodes' agents: direct peers, interruption notices
    interruptions: Interruptions | None = None  # reclaims noticed: signal, requeue, replace


class Daemon:
    def __init__(
        self,
        settings: DaemonSettings,
        ports: DaemonPorts,
        services: DaemonServices,
        stop: threading.Event,
    ) -> None:
        self.settings = settings
        self.fleet = settings.fleet
        self.store = ports.store
        self.leader = ports.leader
        self.clock = ports.clock
        self.host = ports.host
        self.spool = ports.spool
        self.metrics = ports.metrics
        self.served = ports.served
        self._serve_tried = -math.inf
        self.prov = services.provisioner
        self.workers = services.workers
        self.reconciler = services.reconciler
        self.registrations = services.registrations
        self.ledger_loop = services.ledger_loop
        self.telemetry = services.telemetry
        self.policy = services.policy
        self.warm = services.warm
        self.stagework = services.stagework
        self.node_api = services.node_api
        self.interruptions = services.interruptions
        self.lifecycle = services.lifecycle
        self.stop = stop  # set by a signal, or when leadership is lost; the workers see it
        self.node_id = ports.leader.node_id
        self._reconcile_thread: threading.Thread | None = None
        self.leading = False
        self.lost_leadership = False  # set when the HA lock is lost: the CLI exits 1
        self.started_at = ports.clock.now()

    # -- lifecycle ------------------------------------------------------------------
    def run(self) -> None:
        self.host.acquire()
        listen = self.settings.metrics_listen
        if self.metrics is not None and listen:
            try:
                self.metrics.serve(listen)
            except OSError as exc:  # metrics are not worth refusing to provision for
                log.error("daemon.metrics_unavailable listen=%s error=%s", listen, exc)
        log.info("daemon.started pid=%d node_id=%s", os.getpid(), self.node_id)
        try:
            while not self.stop.is_set():
                if not self.leading:
                    if self.leader.try_acquire():
                        self.lead()
                    else:
                        self.follow()
                        self.stop.wait(self.settings.poll_period)
                        continue
                try:
                    self.beat()
                    self.serve_stores()
                    self.drain_spool()
                    self.handle_requests()
                    if self.stagework is not None:
                        self.stagework.pass_once()
                except (StoreError, OSError) as exc:  # a full disk, a lock held too
                    # long: the requests wait (spool, database) for the next round
                    log.error("daemon.requests_waiting error=%s", exc)
                except Exception as exc:  # boundary: the main loop outlives one round
                    contain("daemon.requests", exc, self.metrics)
                self.host.wait(1.0)
        finally:
            self.shutdown()

    def lead(self) -> None:
        """Become the acting daemon: wake-up socket, ledger thread, recovery, reconcile."""
        self.leading = True
        if self.metrics is not None:
            self.metrics.leading(True)
        log.info("daemon.leader node_id=%s", self.node_id)
        self.store.event(self.clock.now(), "daemon.leader", "", self.node_id)
        self.store.follower(self.node_id, None)
        self.host.open()
        self.beat()
        self.prov.restore_peers()
        self.serve_stores()
        if self.ledger_loop is not None:
            self.ledger_loop.ensure_schema()  # db upgrade at start, under the migration lock
            self.ledger_loop.start()  # spool replay, ingest, split: now, then every interval
        self.workers.recover()
        if self.registrations is not None:
            self.registrations.start()
        if self.telemetry is not None:
            self.telemetry.start()
        if self.policy is not None:
            self.policy.start()
        self._reconcile_thread = threading.Thread(
            target=self._reconcile_loop, name="reconcile", daemon=True
        )
        self._reconcile_thread.start()

    def follow(self) -> None:
        """Standby: say so (``slurm-burst status`` shows it), act on nothing."""
        if self.metrics is not None:
            self.metrics.leading(False)
        self.store.follower(
            self.node_id,
            {"at": self.clock.now(), "pid": os.getpid(), "leader": self.leader.leader_info()},
        )

    def _reconcile_loop(self) -> None:
        while not self.stop.is_set():
            started = self.clock.monotonic()
            if not self.leader.held():
                log.critical("daemon.leadership_lost node_id=%s: stopping", self.node_id)
                self.lost_leadership = True
                self.stop.set()
                return
            try:
                self.reconciler.pass_once()
            except Exception as exc:  # boundary: the reconcile loop outlives one pass
                contain("reconcile.pass", exc, self.metrics)
            if self.warm is not None:
                try:
                    self.warm.pass_once()
                except Exception as exc:  # boundary: as the reconcile pass
                    contain("warm.pass", exc, self.metrics)
            self.workers.rescan()
            self.host.release_memory()
            elapsed = self.clock.monotonic() - started
            self.stop.wait(max(0.0, self.settings.poll_period - elapsed))

    def shutdown(self) -> None:
        log.info("daemon.stopping in_flight=%d", self.workers.in_flight())
        if self._reconcile_thread is not None:
            self._reconcile_thread.join(timeout=60)
        self.leader.release()
        if self.registrations is not None:
            self.registrations.wake()  # it sees stop and ends
        if self.ledger_loop is not None:
            self.ledger_loop.stop.set()
        if self.telemetry is not None:
            self.telemetry.join(timeout=SAMPLE_JOIN)  # its open usage periods are recorded
        self.workers.shutdown()
        if self.stagework is not None:
            self.stagework.shutdown()
        if self.interruptions is not None:  # a requeue not done yet: the reclaim's node
            self.interruptions.close()  # failure requeues the job (the next daemon sees it)
        self.host.close()  # the wake-up socket, if this daemon led
        for served in self.served:
            served.close()

    def serve_stores(self) -> None:
        """Serve the mesh stores not up yet (tried again every SERVE_RETRY seconds: the
        hub's address may come up after the daemon)."""
        down = [s for s in self.served if not s.up]
        if not down or self.clock.monotonic() - self._serve_tried < SERVE_RETRY:
            return
        self._serve_tried = self.clock.monotonic()
        for served in down:
            try:
                served.start()
            except OSError as exc:
                log.error("daemon.store_not_served error=%s", exc)

    def beat(self) -> None:
        now = self.clock.now()
        if self.metrics is not None:
            self.metrics.heartbeat(now)
        self.store.beat(
            now,
            {
                "pid": os.getpid(),
                "node_id": self.node_id,
                "started_at": self.started_at,
                "in_flight": self.workers.in_flight(),
            },
        )

    # -- requests -----------------------------------------------------------------
    def drain_spool(self) -> int:
        return drain(self.spool, self.store, self.clock.now()) if self.spool is not None else 0

    def handle_requests(self) -> None:
        for req in self.store.pending_requests():
            # a request's nodes are claimed before their want is written: the reconcile
            # thread's rescan must not hand a resume's to one-node workers meanwhile, and
            # a node written is never seen with neither a claim nor a worker (idle)
            held = self.workers.reserve(req.nodes)
            try:
                with self.store.atomically():  # the request and its nodes: one transaction
                    launch, drive = self._record_request(req)
                    self.store.finish_request(req.id, self.clock.now())
            except BaseException:
                self.workers.submit_launch([], held)  # nothing launched: claims released
                raise
            refused = self._refuse_over_cap(launch)
            launch = [r for r in launch if r.name not in refused]
            drive += refused
            self.prov.address_early([r.name for r in launch])  # before any worker starts
            self.workers.submit_launch(launch, held - set(drive))
            for name in drive:
                self.workers.submit(
                    name, power_down_force=req.kind == "resume-fail", claimed=name in held
                )
            log.info(
                "request.done id=%d kind=%s count=%d hostlist=%s",
                req.id,
                req.kind,
                len(req.nodes),
                compress(list(req.nodes)),
            )

    def _refuse_over_cap(self, launch: Sequence[NodeRecord]) -> list[str]:
        """Of the nodes just asked up, those past their group's ``max_nodes``, failed with
        ``GroupAtCap`` (their worker tears them down and powers them down). The cap's
        drain keeps Slurm from resuming them; this catches what gets past it (a
        ``scontrol update state=power_up`` by hand, a resume before the first pass)."""
        asked: dict[str, list[str]] = {}
        for rec in launch:
            g = self.fleet.node_groups.get(rec.group)
            if g is not None and g.limit < g.count:
                asked.setdefault(g.name, []).append(rec.name)
        if not asked:
            return []
        states: dict[str, dict[str, NodeState]] = {}
        for r in self.store.nodes():
            if r.group in asked:
                states.setdefault(r.group, {})[r.name] = r.state
        refused = []
        for group, names in asked.items():
            limit = self.fleet.node_groups[group].limit
            for name in over_cap(states.get(group, {}), limit, names):
                message = (
                    f"node group {group} is at max_nodes={limit}: no instance for {name} "
                    "(a resume past the cap; its job, if any, is requeued)"
                )
                self.store.event(self.clock.now(), "node.over_cap", name, message)
                if self.metrics is not None:
                    self.metrics.resume_over_cap(group)
                self.prov.fail(name, OVER_CAP, message)
                refused.append(name)
        return refused

    def _record_request(self, req: Request) -> tuple[list[NodeRecord], list[str]]:
        """Write what ``req`` asks of each node; return the nodes newly asked up (to be
        launched in batches first) and the nodes whose worker must look at them again."""
        by_node = jobs_by_node(req.jobs, req.nodes)  # each node keeps the jobs it serves
        launch: list[NodeRecord] = []
        drive: list[str] = []
        for name in req.nodes:
            group = self.fleet.group_of(name)
            if group is None:
                log.warning("request.unknown_node request=%d node=%s", req.id, name)
                continue
            rec = self.store.node(name)
            jobs = json.dumps(by_node.get(name, []))
            if req.kind == "resume":
                if rec is not None and rec.state in RESUMING and rec.want == Want.UP:
                    if name in by_node and rec.jobs != jobs:  # Slurm's jobs, after a resume
                        self.lifecycle.serving(name, jobs)  # of ours (ResumeLost) had none
                    log.info("node.resume.duplicate node=%s state=%s", name, rec.state)
                    continue
                if rec is None or rec.state == NodeState.TERMINATED:
                    new = self.lifecycle.asked_up(name, group.name, rec, req.created_at, jobs)
                    launch.append(new)
                    continue
                self.lifecycle.wanted(name, Want.UP, jobs)
            elif rec is None:
                self.lifecycle.first_seen_down(name, group.name)
            elif rec.want != Want.DOWN:
                self.lifecycle.wanted(name, Want.DOWN)
            drive.append(name)
        return launch, drive


def drain(spool: RequestSpool, store: NodeStore, now: float) -> int:
    """Move what hooks spooled into the database (each once: by its uid), oldest first;
    a file is removed only after its request is committed, so a crash in between
    leaves it to be added again, which its uid makes a no-op."""
    items = spool.pending()
    taken = 0
    for item in items:
        try:
            store.add_request(item.kind, item.nodes, item.jobs, item.created_at, item.uid)
        except DuplicateRequest as exc:  # never merged into the other, never dropped unsaid
            spool.reject(item, str(exc))
            continue
        spool.remove(item)
        taken += 1
        log.warning(
            "request.unspooled uid=%s kind=%s count=%d hostlist=%s age=%.0f",
            item.uid,
            item.kind,
            len(item.nodes),
            compress(list(item.nodes)),
            now - item.created_at,
        )
    return taken
