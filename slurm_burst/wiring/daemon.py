"""The daemon: each service's settings from the config (the one place a service's
knobs are read), its adapters, and the services assembled by constructor injection."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from slurm_burst.adapters.host import LocalHost
from slurm_burst.adapters.imagelayout import pinned_copy
from slurm_burst.adapters.mesh.wireguard import WireGuardHub
from slurm_burst.adapters.metrics.prom import Metrics as PromMetrics
from slurm_burst.adapters.nodeapi import NodeApiServer
from slurm_burst.adapters.ssh.session import SshConnector, generate_key
from slurm_burst.adapters.stagepush import CliPusher
from slurm_burst.config import Config, NodeGroup
from slurm_burst.config.validate import dynamic_refusal
from slurm_burst.core.cloud import CapacityError
from slurm_burst.core.mesh import hub_address
from slurm_burst.core.reconcile import Policy
from slurm_burst.core.records import NodeRecord
from slurm_burst.ports import (
    AccountingLedger,
    Clock,
    Cloud,
    Connector,
    DaemonHost,
    JobControl,
    JobSteering,
    LeaderElection,
    Mesh,
    Metrics,
    NodeStore,
    OutputPromoter,
    Scheduler,
    ServedStore,
    SpooledLedger,
    StagePusher,
)
from slurm_burst.runtimeref import References, keep_node_manifest
from slurm_burst.services.burstpolicy import BurstPolicy, PolicySettings
from slurm_burst.services.chargeback import Chargeback, ChargebackLoop
from slurm_burst.services.daemon import Daemon, DaemonPorts, DaemonServices, DaemonSettings
from slurm_burst.services.gputelemetry import GpuTelemetry, TelemetrySettings
from slurm_burst.services.images import ImagePorts, Images, ImageSettings
from slurm_burst.services.instancelog import InstanceLog
from slurm_burst.services.interruptions import InterruptionPorts, Interruptions
from slurm_burst.services.launcher import Launcher, LauncherSettings, cooled
from slurm_burst.services.lifecycle import Lifecycle
from slurm_burst.services.nodeapi import NodeApi, NodeApiSettings
from slurm_burst.services.nodestage import NodeStaging, NodeStagingSettings
from slurm_burst.services.outputs import OutputPorts, Outputs, OutputSettings
from slurm_burst.services.provisioner import (
    Provisioner,
    ProvisionerPorts,
    ProvisionerServices,
    ProvisionerSettings,
    Secrets,
)
from slurm_burst.services.reconciler import (
    NodeHands,
    Reconciler,
    ReconcilerPorts,
    ReconcilerSettings,
)
from slurm_burst.services.registration import Registrations
from slurm_burst.services.runtimecheck import RuntimeCheck, RuntimeCheckPorts
from slurm_burst.services.simulation import cloud_groups
from slurm_burst.services.stagework import StageWork, StageWorkSettings
from slurm_burst.services.staging import Stager
from slurm_burst.services.warmpool import WarmKeeper, WarmSettings
from slurm_burst.services.workers import Workers
from slurm_burst.wiring.clouds import fleet_views, managed_clouds, notice_providers
from slurm_burst.wiring.ledger import chargeback, daemon_ledger, ledger
from slurm_burst.wiring.light import (
    clock,
    group_control,
    leader,
    node_id,
    node_store,
    request_spool,
    scheduler,
    slurm_group,
    slurm_release,
)
from slurm_burst.wiring.storage import mesh_store_servers, prices, stager, transfer_book


def mesh_hub(cfg: Config) -> WireGuardHub:
    m = cfg.mesh
    return WireGuardHub(m.interface, m.subnet, m.port, m.state_dir, m.endpoint, m.keepalive)


def metrics(cfg: Config) -> PromMetrics:
    m = PromMetrics(max_accounts=cfg.daemon.metrics_max_accounts)
    m.burst_partitions((g.partition, g.name) for g in cfg.node_groups.values())
    return m


def agents_wanted(cfg: Config) -> bool:
    """Whether any node runs an agent: a group that tunnels directly, or a spot group on
    a provider with interruption notices."""
    notices = notice_providers(cfg)
    return any(
        g.cloud_to_cloud == "wireguard" or (g.spot and set(notices) & set(g.providers))
        for g in cfg.node_groups.values()
    )


@dataclass(frozen=True)
class DaemonParts:
    """What the daemon is made of: the adapters, built here or (tests, benchmarks) by hand."""

    store: NodeStore
    clouds: Mapping[str, Cloud]
    mesh: Mesh
    connector: Connector
    scheduler: Scheduler
    ledger: SpooledLedger  # the provisioner's: spools while the database is away
    secrets: Secrets
    leader: LeaderElection
    clock: Clock
    sql_ledger: AccountingLedger | None = None  # reconcile's open rows and chargeback
    metrics: Metrics | None = None
    chargeback: Chargeback | None = None
    slurm_release: str | None = None  # slurmctld's: a node's slurmd is checked against it
    steering: JobSteering | None = None  # the burst policy's view of the queue
    host: DaemonHost | None = None  # None: this host's lock and socket (daemon_host)
    stager: Stager | None = None  # staging.store's: the nodes' pull plans (None: no staging)
    pusher: StagePusher | None = None  # pushes as the jobs' users (with stager)
    promoter: OutputPromoter | None = None  # brings outputs home as the jobs' users
    served: Sequence[ServedStore] = ()  # mesh stores the daemon serves while it leads
    jobs: JobControl | None = None  # what is done to jobs whose node is to be reclaimed
    serve_node_api: bool = False  # serve the node API on the hub's address (the daemon)


# Each service's settings, from the config: the one place a service's knobs are read.
def provisioner_settings(cfg: Config, slurm_release: str | None) -> ProvisionerSettings:
    return ProvisionerSettings(
        fleet=cfg.fleet,
        controller_addr=cfg.cluster.controller_addr,
        munge_socket=cfg.slurm.munge_socket,
        mesh_subnet=cfg.mesh.subnet,
        mesh_interface=cfg.mesh.interface,
        boot_timeout=cfg.daemon.boot_timeout,
        bootstrap_timeout=cfg.daemon.bootstrap_timeout,
        gpu=cfg.gpu,
        resume_timeout=float(cfg.slurm.resume_timeout),
        slurm_release=slurm_release,
        mesh_api_port=cfg.mesh.api_port,
        mesh_node_port=cfg.mesh.node_port,
        mesh_sync_interval=cfg.mesh.sync_interval,
        notice_providers=notice_providers(cfg),
        regions={name: p.region for name, p in cfg.providers.items()},
    )


def launcher_settings(cfg: Config) -> LauncherSettings:
    return LauncherSettings(
        fleet=cfg.fleet,
        capacity_cooldown=cfg.daemon.capacity_cooldown,
        name_each_max=cfg.daemon.name_each_max,
    )


def reconciler_settings(cfg: Config) -> ReconcilerSettings:
    d = cfg.daemon
    return ReconcilerSettings(
        fleet=cfg.fleet,
        policy=Policy(
            orphan_grace=d.orphan_grace,
            resume_timeout=float(cfg.slurm.resume_timeout),
            protect_after=d.protect_after,
            protect_cooldown=d.protect_cooldown,
            lost_resume_grace=max(d.lost_resume_grace, 2 * d.poll_period),
            register_timeout=d.register_timeout,
        ),
    )


def telemetry_settings(cfg: Config) -> TelemetrySettings:
    return TelemetrySettings(fleet=cfg.fleet, gpu=cfg.gpu)


def warm_settings(cfg: Config) -> WarmSettings:
    def idle_limit(g: NodeGroup) -> float:
        part = cfg.partitions.get(g.partition)
        limit = part.suspend_time if part is not None else None
        return float(cfg.slurm.suspend_time if limit is None else limit)

    return WarmSettings(
        groups=cfg.node_groups, idle_limits={n: idle_limit(g) for n, g in cfg.node_groups.items()}
    )


def policy_settings(cfg: Config) -> PolicySettings:
    groups = cfg.node_groups.values()
    st = cfg.staging
    mbit = st.link_mbit  # 0: staged data not counted; the push's own limit when lower
    if mbit > 0 and 0 < st.bandwidth_mbit < mbit:
        mbit = st.bandwidth_mbit
    store = cfg.stores.get(st.store) if st.store else None
    return PolicySettings(
        policy=cfg.policy,
        data_mbit=mbit if store is not None else 0.0,
        data_prices=prices(st.store, store) if store is not None else None,
        partition_of={g.name: g.partition for g in groups},
        max_time={
            g.name: cfg.partitions[g.partition].max_time
            for g in groups
            if g.partition in cfg.partitions
        },
        onprem=frozenset(cfg.slurm.onprem_partitions),
        burst=frozenset(cfg.burst_partitions()),
    )


def daemon_settings(cfg: Config) -> DaemonSettings:
    return DaemonSettings(
        fleet=cfg.fleet,
        poll_period=cfg.daemon.poll_period,
        metrics_listen=cfg.daemon.metrics_listen,
    )


def daemon_host(cfg: Config) -> DaemonHost:
    d = cfg.daemon
    lock = f"daemon.{node_id(cfg)}.lock" if d.ha_url else "daemon.lock"
    return LocalHost(d.state_dir, d.socket, lock, slurm_group(cfg))


def reconciler(
    cfg: Config, ports: ReconcilerPorts, hands: NodeHands, lifecycle: Lifecycle
) -> Reconciler:
    groups = group_control(cfg, ports.store, ports.scheduler)
    return Reconciler(reconciler_settings(cfg), ports, hands, groups, lifecycle)


def runtime_check(cfg: Config, p: DaemonParts) -> RuntimeCheck | None:
    """The runtime step of the joins, where a group names a reference manifest."""
    if not any(g.runtime_manifest for g in cfg.node_groups.values()):
        return None
    state_dir = cfg.daemon.state_dir
    return RuntimeCheck(
        RuntimeCheckPorts(
            store=p.store,
            clock=p.clock,
            program=resources.files("slurm_burst.node").joinpath("runtime.py").read_bytes(),
            reference=References(),
            keep=lambda node, data: keep_node_manifest(state_dir, node, data),
        )
    )


def assemble(cfg: Config, parts: DaemonParts) -> Daemon:
    """The daemon and its services from ``parts``: constructor injection, no set-up after."""
    p = parts
    stop = threading.Event()
    clouds = dict(p.clouds)
    lifecycle = Lifecycle(p.store, p.clock)  # the one writer of node records
    registrations = Registrations(
        p.store, p.scheduler, p.clock, stop, give_up=cfg.daemon.register_timeout,
        metrics=p.metrics, lifecycle=lifecycle,
    )  # fmt: skip
    staging, stagework, outputs, images = None, None, None, None
    if p.stager is not None and p.pusher is not None:
        book = transfer_book(cfg, p.stager.store.name, p.clock, p.ledger, p.metrics)
        staging = NodeStaging(
            NodeStagingSettings(node_dir=cfg.staging.node_dir), p.store, p.stager, p.clock,
            p.connector, book,
        )  # fmt: skip
        if p.promoter is not None:
            outputs = Outputs(
                OutputSettings(node_dir=cfg.staging.node_dir,
                               release_deadline=cfg.staging.release_deadline,
                               partitions=tuple(cfg.burst_partitions())),
                OutputPorts(store=p.store, stager=p.stager, clock=p.clock,
                            connector=p.connector, scheduler=p.scheduler,
                            promoter=p.promoter, book=book, metrics=p.metrics),
            )  # fmt: skip
        stagework = StageWork(
            StageWorkSettings(), p.store, p.pusher, p.clock, staging.pull_asked, book, outputs
        )
        if any(g.images for g in cfg.node_groups.values()):
            images = Images(
                ImageSettings(images=cfg.images, node_dir=cfg.staging.node_dir,
                              work_dir=str(Path(cfg.daemon.state_dir) / "images")),
                ImagePorts(stager=p.stager, staging=staging, clock=p.clock, copy=pinned_copy,
                           book=book),
            )  # fmt: skip
    views = fleet_views(cfg, clouds, p.clock)
    ports = ProvisionerPorts(
        store=p.store, clouds=clouds, mesh=p.mesh, connector=p.connector,
        scheduler=p.scheduler, ledger=p.ledger, clock=p.clock, metrics=p.metrics,
        staging=staging, outputs=outputs, views=views, runtime=runtime_check(cfg, p),
        images=images,
    )  # fmt: skip
    instances = InstanceLog(cfg.fleet, p.ledger, p.clock)
    launcher = Launcher(
        launcher_settings(cfg), ports, p.secrets.ssh_public_key, instances, lifecycle
    )
    provisioner = Provisioner(
        provisioner_settings(cfg, p.slurm_release), ports, p.secrets,
        ProvisionerServices(launcher=launcher, lifecycle=lifecycle, instances=instances,
                            joined=registrations.watch),
        stopping=stop,
    )  # fmt: skip
    workers = Workers(
        provisioner, launcher, p.store, cfg.daemon.workers, cfg.daemon.bootstrap_slots
    )
    reconcile = reconciler(
        cfg,
        ReconcilerPorts(
            store=p.store, scheduler=p.scheduler, clouds=clouds, mesh=p.mesh, clock=p.clock,
            ledger=p.sql_ledger, metrics=p.metrics, views=views,
        ),
        NodeHands(fail=provisioner.fail, submit=workers.submit),
        lifecycle,
    )  # fmt: skip
    ledger_loop = None
    if p.chargeback is not None:
        ledger_loop = ChargebackLoop(cfg.ledger, p.chargeback, p.ledger)
    telemetry = GpuTelemetry(
        telemetry_settings(cfg), p.store, p.connector, p.scheduler, p.clock, stop,
        p.sql_ledger.gpu_usage if p.sql_ledger is not None else None, p.metrics,
    )  # fmt: skip
    policy = None
    if p.steering is not None and cfg.policy.enabled:
        money_left = p.chargeback.money_left if p.chargeback is not None else None
        policy = BurstPolicy(
            policy_settings(cfg), p.steering, p.store, p.clock, cloud_groups(cfg), money_left, stop,
            p.metrics,
        )  # fmt: skip
    warm = None
    if any(g.warm for g in cfg.node_groups.values()):
        warm = WarmKeeper(warm_settings(cfg), p.scheduler, p.store, p.clock)
    node_api, interruptions, served = node_agents(cfg, p, provisioner, launcher, workers)
    return Daemon(
        daemon_settings(cfg),
        DaemonPorts(
            store=p.store, leader=p.leader, clock=p.clock, host=p.host or daemon_host(cfg),
            spool=request_spool(cfg), metrics=p.metrics, served=served,
        ),
        DaemonServices(
            provisioner=provisioner, workers=workers, reconciler=reconcile, lifecycle=lifecycle,
            registrations=registrations, ledger_loop=ledger_loop, telemetry=telemetry,
            policy=policy, warm=warm, stagework=stagework, node_api=node_api,
            interruptions=interruptions,
        ),
        stop,
    )  # fmt: skip


def node_agents(
    cfg: Config, p: DaemonParts, provisioner: Provisioner, launcher: Launcher, workers: Workers
) -> tuple[NodeApi | None, Interruptions | None, list[ServedStore]]:
    """What the nodes' agents talk to: the node API (direct peers; interruption notices,
    handed to the interruptions service where jobs can be requeued), and its server on
    the hub's mesh address, among what the daemon serves (``serve_node_api``)."""

    served = list(p.served)
    if not agents_wanted(cfg):
        return None, None, served
    m = cfg.mesh
    api = NodeApi(NodeApiSettings(cfg.fleet, m.subnet), p.store, p.clock)
    interruptions = None
    if p.jobs is not None:

        def cool(rec: NodeRecord, exc: CapacityError) -> None:
            size = cooled(rec.size, rec.market)
            launcher.size_unavailable(rec.name, rec.provider, size, exc)

        interruptions = Interruptions(
            InterruptionPorts(store=p.store, jobs=p.jobs, clock=p.clock, cool=cool,
                              fail=provisioner.fail, submit=workers.submit,
                              sync_outputs=provisioner.outputs.sync_now
                              if provisioner.outputs is not None else None)
        )  # fmt: skip
        api.noticed = interruptions.notice
    if p.serve_node_api:
        served.append(NodeApiServer(api.peers, (hub_address(m.subnet), m.api_port), m.interface,
                                    notice=api.notice))  # fmt: skip
    return api, interruptions, served


def daemon(cfg: Config) -> Daemon:
    """The daemon with every collaborator built from ``cfg`` (the hub is brought up).
    RuntimeError, before anything is made, when the cluster's Slurm cannot run the
    config's dynamic node groups."""
    release = _release_or_none(cfg)
    refused = dynamic_refusal(cfg, release) if release else None
    if refused:
        raise RuntimeError(refused)
    key_path = str(Path(cfg.daemon.state_dir) / "ssh" / "id_ed25519")
    ssh_public = generate_key(key_path)
    munge_key = Path(cfg.slurm.munge_key).read_bytes()
    hub = mesh_hub(cfg)
    hub.ensure_hub()
    child = CliPusher(str(Path(cfg.source).resolve()))  # stage work as the jobs' users
    sql = ledger(cfg, check_schema=False)
    prom = metrics(cfg)
    slurm = scheduler(cfg)
    state = node_store(cfg, upgrade=True)
    served = mesh_store_servers(cfg)  # before the stager: it reads the grant keys made here
    parts = DaemonParts(
        store=state,
        clouds=managed_clouds(cfg, prom),
        mesh=hub,
        connector=SshConnector(cfg.daemon.ssh_user, key_path),
        scheduler=slurm,
        ledger=daemon_ledger(cfg, sql),
        secrets=Secrets(ssh_public, munge_key),
        leader=leader(cfg),
        clock=clock(),
        sql_ledger=sql,
        metrics=prom,
        chargeback=chargeback(cfg, sql, prom),
        slurm_release=release,
        steering=slurm,
        stager=stager(cfg) if cfg.staging.store else None,
        pusher=child if cfg.staging.store else None,
        promoter=child if cfg.staging.store else None,
        served=served,
        jobs=slurm,
        serve_node_api=True,
    )
    return assemble(cfg, parts)


def _release_or_none(cfg: Config) -> str | None:
    """slurmctld's release for the nodes' version check; None (no check, said) if unknown."""
    try:
        return slurm_release(cfg)
    except ValueError as exc:
        logging.getLogger(__name__).warning("daemon.slurm_release_unknown %s", exc)
        return None
