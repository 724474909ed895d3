"""The composition root: the one place adapters are built from the configuration and
handed to the services.

Services know ports only (``slurm_burst.ports``); this module names the adapters.
Imports are inside the functions: the hooks use this module and must not pay for
libcloud, paramiko or SQLAlchemy.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_burst import extensions
from slurm_burst.config import Config, NodeGroup, ProviderConfig
from slurm_burst.fileio import gid_of

if TYPE_CHECKING:
    from libcloud.compute.base import NodeDriver

    from slurm_burst.adapters.cloud.compute import LibcloudCloud
    from slurm_burst.adapters.cloud.profiles import Placement
    from slurm_burst.adapters.ledger.spool import SpoolingLedger
    from slurm_burst.adapters.ledger.sql import SqlLedger
    from slurm_burst.adapters.mesh.wireguard import WireGuardHub
    from slurm_burst.adapters.metrics.prom import Metrics as PromMetrics
    from slurm_burst.adapters.slurm.accounting import SlurmAccounting
    from slurm_burst.adapters.slurm.cli import SlurmCli
    from slurm_burst.adapters.state.requestspool import RequestSpool
    from slurm_burst.adapters.state.store import Store
    from slurm_burst.adapters.storage.mesh import MeshStoreServer
    from slurm_burst.config.model import StoreConfig
    from slurm_burst.core.cloud import CapacityError
    from slurm_burst.core.records import NodeRecord
    from slurm_burst.core.simulate import Comparison
    from slurm_burst.core.staging import KeptHome
    from slurm_burst.core.tuning import Point
    from slurm_burst.ports import (
        AccountingLedger,
        Clock,
        Cloud,
        Connector,
        DaemonHost,
        JobControl,
        JobSteering,
        LeaderElection,
        Ledger,
        Mesh,
        Metrics,
        NodeStore,
        ObjectStore,
        OutputPromoter,
        Scheduler,
        ServedStore,
        SpooledLedger,
        StagePusher,
    )
    from slurm_burst.services.burstpolicy import PolicySettings
    from slurm_burst.services.chargeback import Chargeback, ChargebackSettings
    from slurm_burst.services.cloudcalls import ManagedCloud, SharedBudget
    from slurm_burst.services.daemon import Daemon, DaemonSettings
    from slurm_burst.services.fleetview import FleetView
    from slurm_burst.services.gputelemetry import TelemetrySettings
    from slurm_burst.services.groups import GroupControl
    from slurm_burst.services.interruptions import Interruptions
    from slurm_burst.services.launcher import Launcher, LauncherSettings
    from slurm_burst.services.nodeapi import NodeApi
    from slurm_burst.services.provisioner import Provisioner, ProvisionerSettings, Secrets
    from slurm_burst.services.reconciler import (
        NodeHands,
        Reconciler,
        ReconcilerPorts,
        ReconcilerSettings,
    )
    from slurm_burst.services.staging import Progress, Stager
    from slurm_burst.services.transfers import StorageBook, StorePrices, TransferBook
    from slurm_burst.services.warmpool import WarmSettings
    from slurm_burst.services.workers import Workers
    from slurm_burst.trusted import Writers


# -- the state store -----------------------------------------------------------------
def state_db_path(cfg: Config) -> Path:
    return Path(cfg.daemon.state_dir) / "state.db"


def node_store(
    cfg: Config, create: bool = True, upgrade: bool = False, timeout: float = 10.0
) -> Store:
    """The state database; ``create=False`` for readers (StoreError if there is none).
    Only the daemon upgrades an older release's schema (``upgrade=True``): see Store.
    ``timeout``: seconds a write waits for another's lock (the hooks: hook_db_timeout)."""
    from slurm_burst.adapters.state.store import Store

    return Store(
        state_db_path(cfg), create=create, upgrade=upgrade, group=slurm_group(cfg), timeout=timeout
    )


def request_spool(cfg: Config) -> RequestSpool:
    """Where hooks keep what the state database cannot take (daemon.spool_dir)."""
    from slurm_burst.adapters.state.requestspool import RequestSpool
    from slurm_burst.trusted import Writers

    writers = Writers.us(user=cfg.daemon.user, group=cfg.daemon.group)
    return RequestSpool(cfg.daemon.spool_dir, slurm_group(cfg), writers)


def slurm_release(cfg: Config) -> str:
    """The cluster's Slurm release: ``slurm.release``, else what the installed Slurm says
    (``slurmctld -V`` beside ``slurm.bin_dir``, which needs no configuration; else
    ``sinfo --version`` with the cluster's slurm.conf). ValueError, saying what to do,
    when none answers."""
    from slurm_burst.adapters.proc import CommandError, run
    from slurm_burst.core.slurm import release_of

    if cfg.slurm.release:
        return cfg.slurm.release
    bin_dir = Path(cfg.slurm.bin_dir)
    env = {"SLURM_CONF": f"{cfg.slurm.conf_dir}/slurm.conf"}
    tried = []
    for argv in (
        [str(bin_dir.parent / "sbin" / "slurmctld"), "-V"],
        [str(bin_dir / "sinfo"), "--version"],
    ):
        try:
            return release_of(run(argv, timeout=10, env=env).stdout)
        except (CommandError, ValueError, OSError) as exc:
            tried.append(f"{' '.join(argv)}: {str(exc)[:200]}")
    raise ValueError(f"cannot tell the Slurm release ({'; '.join(tried)}); set slurm.release")


def slurm_group(cfg: Config) -> int | None:
    """The gid of ``daemon.group`` (SlurmUser's); None if this host has no such group
    (then files keep their creator's group; ``config check`` warns)."""
    return gid_of(cfg.daemon.group)


def clock() -> Clock:
    from slurm_burst.adapters.clock import SystemClock

    return SystemClock()


# -- Slurm -------------------------------------------------------------------------
def scheduler(cfg: Config, timeout: float | None = None) -> SlurmCli:
    from slurm_burst.adapters.slurm.cli import SlurmCli

    s = cfg.slurm
    return SlurmCli(
        bin_dir=s.bin_dir,
        slurm_conf=str(Path(s.conf_dir) / "slurm.conf"),
        timeout=s.command_timeout if timeout is None else min(timeout, s.command_timeout),
        batch=s.update_batch,
    )


def accounting(cfg: Config) -> SlurmAccounting:
    """Slurm accounting (sacct, sacctmgr) for the ledger's ingest and budgets."""
    from slurm_burst.adapters.slurm.accounting import SlurmAccounting

    return SlurmAccounting(
        cfg.slurm.bin_dir,
        str(Path(cfg.slurm.conf_dir) / "slurm.conf"),
        cfg.cluster.name,
        timeout=max(cfg.slurm.command_timeout, 60.0),
    )


def group_control(cfg: Config, store: NodeStore, slurm: Scheduler | None = None) -> GroupControl:
    """Protected mode on ``slurm`` (default: this config's Slurm commands)."""
    from slurm_burst.services.groups import GroupControl

    return GroupControl(
        cfg.node_groups,
        store,
        slurm if slurm is not None else scheduler(cfg),
        protect_cooldown=cfg.daemon.protect_cooldown,
    )


# -- clouds --------------------------------------------------------------------------
def driver_exists(name: str) -> bool:
    from slurm_burst.adapters.cloud.registry import driver_exists as exists

    return exists(name)


def cloud_driver(
    provider_cfg: ProviderConfig, environ: Mapping[str, str] | None = None
) -> NodeDriver:
    """A libcloud driver for ``provider``, with its credentials resolved (never logged)."""
    from slurm_burst.adapters.cloud.credentials import resolve
    from slurm_burst.adapters.cloud.registry import driver_class, provider

    cls = driver_class(provider_cfg.driver)
    kwargs: dict[str, Any] = dict(provider_cfg.options)
    creds = resolve(provider_cfg, environ)
    key, secret = creds.pop("key", ""), creds.pop("secret", "")
    kwargs.update(creds)
    driver = provider(provider_cfg.driver).construct(cls, provider_cfg, kwargs, key, secret)
    return driver  # type: ignore[no-any-return]  # libcloud ships no type information


def wrapped_driver(cfg: Config, name: str) -> NodeDriver:
    """Provider profile ``name``'s driver as the daemon calls it: through every plugin's
    driver wrapper (extensions.Plugin.driver_wrappers), in the order they are installed."""
    driver = cloud_driver(cfg.providers[name])
    for wrap in extensions.driver_wrappers():
        driver = wrap(cfg, name, driver)
    return driver


def placement(cfg: Config, provider: ProviderConfig) -> Placement:
    from slurm_burst.adapters.cloud.profiles import Placement

    return Placement(
        network=provider.network,
        subnet=provider.subnet,
        security_groups=tuple(provider.security_groups),
        key_name=provider.key_name,
        zone=provider.zone,
        resource_group=provider.resource_group,
        root_device=provider.root_device,
        ssh_user=cfg.daemon.ssh_user,
        host_keys=provider.host_keys,
        extra=dict(provider.launch_options),
    )


def clouds(cfg: Config) -> dict[str, LibcloudCloud]:
    from slurm_burst.adapters.cloud.compute import LibcloudCloud

    return {
        name: LibcloudCloud(name, wrapped_driver(cfg, name), placement(cfg, p), p.launch_batch)
        for name, p in cfg.providers.items()
    }


def managed_clouds(cfg: Config, metrics: Metrics | None = None) -> dict[str, ManagedCloud]:
    """The clouds as the daemon uses them: every call timed, paced within its account's
    API budget (one per account and region, shared by the profiles on it) and throttling
    retried."""
    from slurm_burst.services.cloudcalls import CallSettings, ManagedCloud

    d = cfg.daemon
    settings = CallSettings(attempts=d.api_attempts, base=d.api_backoff, cap=d.api_backoff_max)
    built = clouds(cfg)
    budgets = api_budgets(cfg, built, metrics)
    return {
        name: ManagedCloud(c, settings, metrics, budget=budgets[name]) for name, c in built.items()
    }


def api_budgets(
    cfg: Config, built: Mapping[str, Cloud], metrics: Metrics | None = None
) -> dict[str, SharedBudget]:
    """Each profile's :class:`SharedBudget`: profiles with the same driver, region,
    credentials and endpoint are one account and share theirs (named after the first)."""
    from slurm_burst.adapters.cloud.registry import provider
    from slurm_burst.core.ratelimit import ApiBudgets, Limit
    from slurm_burst.services.cloudcalls import SharedBudget as Budget

    shared: dict[tuple[str, ...], Budget] = {}
    out = {}
    for name in sorted(built):
        p = cfg.providers[name]
        creds = p.credentials
        account = (
            p.driver, p.region,
            (creds.file or creds.key_env) if creds else "",
            str(p.options.get("host", "")), str(p.options.get("port", "")),
        )  # fmt: skip
        if account not in shared:
            described = provider(p.driver)
            table = described.api_table()
            overrides = {api: Limit(float(b), float(r)) for api, (b, r) in p.api_limits.items()}
            if p.host_key_reads_per_second or table is None:  # else: the table's
                rps = p.host_key_reads_per_second or described.host_key_reads_per_second
                reads = described.api_names.get("host_keys", "host_keys")
                overrides.setdefault(reads, Limit(max(1.0, rps), rps))
            shared[account] = Budget(
                name, ApiBudgets(table, cfg.daemon.api_share, overrides), metrics
            )
        out[name] = shared[account]
    return out


# -- mesh, HA, metrics -----------------------------------------------------------------
def mesh_hub(cfg: Config) -> WireGuardHub:
    from slurm_burst.adapters.mesh.wireguard import WireGuardHub

    m = cfg.mesh
    return WireGuardHub(m.interface, m.subnet, m.port, m.state_dir, m.endpoint, m.keepalive)


def leader(cfg: Config) -> LeaderElection:
    from slurm_burst.adapters.ha import PgLeaderLock, SoleLeader

    if cfg.daemon.ha_url:
        return PgLeaderLock(cfg.daemon.ha_url, cfg.cluster.name, node_id(cfg))
    return SoleLeader(node_id(cfg))


def node_id(cfg: Config) -> str:
    """This daemon's name in the HA election, status and its lock file."""
    return cfg.daemon.node_id or socket.gethostname()


def metrics(cfg: Config) -> PromMetrics:
    from slurm_burst.adapters.metrics.prom import Metrics as PromMetrics

    return PromMetrics(max_accounts=cfg.daemon.metrics_max_accounts)


# -- staged data -----------------------------------------------------------------------
def object_store(cfg: Config, name: str) -> ObjectStore:
    """The store ``name`` of ``[stores]`` (StorageUnavailable if there is none)."""
    from slurm_burst.adapters.cloud.credentials import resolve_store
    from slurm_burst.adapters.storage.s3 import S3Store
    from slurm_burst.core.staging import StorageUnavailable

    st = cfg.stores.get(name)
    if st is None:
        known = ", ".join(sorted(cfg.stores)) or "none configured"
        raise StorageUnavailable(f"no store {name!r} in [stores] ({known})")
    if st.driver == "mesh":  # the daemon serves it; its key is root's, made at the start
        from slurm_burst.adapters.storage.mesh import MeshStore, load_key

        host, port = mesh_store_address(cfg, st)
        secret = load_key(mesh_store_key(cfg, name), create=False, writers=state_writers(cfg))
        return MeshStore(st.name, host=host, port=port, secret=secret)
    if st.driver == "azure_blobs":
        from slurm_burst.adapters.storage.azure import AzureBlobStore

        return AzureBlobStore(st.name, container=st.bucket, keys=resolve_store(st),
                              endpoint=st.endpoint, secure=st.secure)  # fmt: skip
    if st.driver == "google_storage":  # an HMAC key; grants: V4 signed URLs
        from slurm_burst.adapters.storage.gcs import GcsStore

        return GcsStore(st.name, bucket=st.bucket, keys=resolve_store(st),
                        endpoint=st.endpoint, secure=st.secure)  # fmt: skip
    return S3Store(
        st.name, bucket=st.bucket, region=st.region, keys=resolve_store(st),
        endpoint=st.endpoint, secure=st.secure,
    )  # fmt: skip


MESH_STORE_PORT = 8479  # a mesh store's port where its endpoint names none


def mesh_store_address(cfg: Config, st: StoreConfig) -> tuple[str, int]:
    """Where the daemon serves a mesh store: its endpoint, or the hub's mesh address."""
    if st.endpoint:
        host, _, port = st.endpoint.rpartition(":")
        return host, int(port)
    from slurm_burst.core.mesh import hub_address

    return hub_address(cfg.mesh.subnet), MESH_STORE_PORT


def state_writers(cfg: Config) -> Writers:
    """Who may own what the daemon keeps in its state directory (root, us) and change
    the directories it is in (SlurmUser's group too: state_dir is 0770 in it)."""
    from slurm_burst.trusted import Writers

    return Writers.us(group=cfg.daemon.group)


def descriptor_budget(cfg: Config) -> int:
    """The connections the daemon's HTTP servers may hold open at once, all together:
    their descriptor budget (adapters.served.Limits), to keep well under LimitNOFILE."""
    from slurm_burst.adapters.nodeapi import LIMITS as NODE_API
    from slurm_burst.adapters.storage.mesh import LIMITS as MESH_STORE

    stores = sum(st.driver == "mesh" for st in cfg.stores.values())
    return NODE_API.connections + stores * MESH_STORE.connections


def mesh_store_key(cfg: Config, name: str) -> Path:
    return Path(cfg.daemon.state_dir) / f"mesh-store-{name}.key"


def mesh_store_servers(cfg: Config) -> list[MeshStoreServer]:
    """The daemon's servers of the mesh stores (each one's grant key made if missing)."""
    from slurm_burst.adapters.storage.mesh import MeshStoreServer, load_key

    out = []
    for name, st in sorted(cfg.stores.items()):
        if st.driver == "mesh":
            key = load_key(mesh_store_key(cfg, name), create=True, writers=state_writers(cfg))
            out.append(MeshStoreServer(st.directory, key, mesh_store_address(cfg, st)))
    return out


def notice_providers(cfg: Config) -> frozenset[str]:
    """The provider profiles whose instances hear of their reclaim beforehand (EC2's
    spot ``instance-action``, read from the instance metadata service)."""
    from slurm_burst.adapters.cloud.registry import provider

    return frozenset(n for n, p in cfg.providers.items() if provider(p.driver).interruption_notices)


def agents_wanted(cfg: Config) -> bool:
    """Whether any node runs an agent: a group that tunnels directly, or a spot group on
    a provider with interruption notices."""
    notices = notice_providers(cfg)
    return any(
        g.cloud_to_cloud == "wireguard" or (g.spot and notices & set(g.providers))
        for g in cfg.node_groups.values()
    )


def kept_home(cfg: Config) -> KeptHome:
    """What the site keeps on-prem: staging's paths, and the on-prem-only accounts and QOS
    of the burst policy."""
    from slurm_burst.core.staging import KeptHome

    accounts, qos = cfg.policy.onprem_only()
    return KeptHome(
        paths=cfg.staging.onprem_only_paths, accounts=frozenset(accounts), qos=frozenset(qos)
    )


def kept_paths(cfg: Config) -> tuple[str, ...]:
    """Every spelling on this host of staging.onprem_only_paths (configured, resolved,
    and through the symlinks that lead to them), for the rendered burst_buffer.lua."""
    from slurm_burst.adapters.storage.tree import symlinks_in
    from slurm_burst.core.staging import path_spellings

    out = [s for p in cfg.staging.onprem_only_paths
           for s in path_spellings(p, os.path.realpath, symlinks_in)]  # fmt: skip
    return tuple(dict.fromkeys(out))


def run_as(user: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn()`` in a child that is ``user`` (adapters/asuser.py)."""
    from slurm_burst.adapters.asuser import run_as as child_as

    return child_as(user, fn)


def stager(cfg: Config, store: str = "", progress: Progress | None = None) -> Stager:
    """The stager of ``slurm-burst stage`` on ``store`` (default: staging.store)."""
    from slurm_burst.adapters.storage.home import LocalHome
    from slurm_burst.adapters.storage.tree import LocalTree
    from slurm_burst.core.staging import StorageUnavailable
    from slurm_burst.services.staging import Stager, StagingSettings

    s = cfg.staging
    name = store or s.store
    if not name:
        raise StorageUnavailable("no store named: give --store, or set staging.store")
    objects = object_store(cfg, name)  # StorageUnavailable when [stores] has no such store
    settings = StagingSettings(
        prefix=cfg.stores[name].prefix,
        transfers=s.transfers,
        bandwidth=s.bandwidth_mbit * 1e6 / 8,
        compress=s.compress,
        grant_seconds=s.grant_seconds,
    )
    return Stager(
        settings=settings, store=objects, tree=LocalTree(s.marker),
        clock=clock(), kept=kept_home(cfg), progress=progress, home=LocalHome(),
    )  # fmt: skip


def transfer_book(
    cfg: Config, store: str, clock: Clock, ledger: Ledger | None, metrics: Metrics | None = None
) -> TransferBook:
    """What staging's transfers cost, into ``ledger`` (the store's prices)."""
    from slurm_burst.services.transfers import TransferBook

    return TransferBook(cfg.cluster.name, _prices(store, cfg.stores[store]), clock, ledger, metrics)


def storage_book(cfg: Config, store: str) -> StorageBook:
    """Where ``stage gc`` books ``store``'s storage: the SQL ledger, at its prices."""
    from slurm_burst.services.transfers import StorageBook

    return StorageBook(cfg.cluster.name, _prices(store, cfg.stores[store]), ledger(cfg))


def _prices(name: str, st: StoreConfig) -> StorePrices:
    """A store's prices, as staging's book and the burst policy count them."""
    from slurm_burst.services.transfers import StorePrices

    return StorePrices(
        store=name, provider=st.providers[0] if len(st.providers) == 1 else "",
        upload_per_gb=st.upload_per_gb, download_per_gb=st.download_per_gb,
        egress_per_gb=st.egress_per_gb, storage_per_gb_month=st.storage_per_gb_month,
    )  # fmt: skip


# -- the ledger ------------------------------------------------------------------------
def plot_simulation(rows: list[Comparison], title: str, directory: str) -> list[str]:
    """The simulator's plots (matplotlib, imported here: only ``simulate --plot`` needs it)."""
    from slurm_burst.adapters.plots import plot

    return plot(rows, title, directory)


def plot_tuning(points: Sequence[Point], target: float, title: str, directory: str) -> list[str]:
    """The tuning's frontier plot (matplotlib, imported here: only ``--plot`` needs it)."""
    from slurm_burst.adapters.plots import plot_frontier

    return plot_frontier(points, target, title, directory)


def ledger(cfg: Config, check_schema: bool = True) -> SqlLedger:
    """The SQL ledger; readers check that the schema is current (else: run db upgrade)."""
    from slurm_burst.adapters.ledger.sql import SqlLedger

    return SqlLedger(
        cfg.ledger.url,
        cfg.cluster.name,
        {n: p.region for n, p in cfg.providers.items()},
        check_schema=check_schema,
    )


def spool_dir(cfg: Config) -> Path:
    return Path(cfg.ledger.spool_dir or Path(cfg.daemon.state_dir) / "ledger-spool")


def daemon_ledger(cfg: Config, sql: SqlLedger | None = None) -> SpoolingLedger:
    """The daemon's ledger: never blocks provisioning, spools while the database is away."""
    from slurm_burst.adapters.ledger.spool import Spool, SpoolingLedger

    return SpoolingLedger(sql or ledger(cfg, check_schema=False), Spool(spool_dir(cfg)))


def chargeback_settings(cfg: Config) -> ChargebackSettings:
    from slurm_burst.services.chargeback import ChargebackSettings

    return ChargebackSettings(fleet=cfg.fleet, ledger=cfg.ledger, spend_cap=cfg.policy.spend_cap)


def chargeback(
    cfg: Config, sql: AccountingLedger | None = None, metrics: Metrics | None = None
) -> Chargeback:
    from slurm_burst.services.chargeback import Chargeback

    return Chargeback(
        chargeback_settings(cfg),
        sql or ledger(cfg),
        accounting(cfg) if cfg.ledger.accounting else None,
        scheduler(cfg),
        metrics=metrics,
    )


# -- the daemon ------------------------------------------------------------------------
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
    from slurm_burst.services.provisioner import ProvisionerSettings

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
    )


def launcher_settings(cfg: Config) -> LauncherSettings:
    from slurm_burst.services.launcher import LauncherSettings

    return LauncherSettings(
        fleet=cfg.fleet,
        capacity_cooldown=cfg.daemon.capacity_cooldown,
        name_each_max=cfg.daemon.name_each_max,
    )


def reconciler_settings(cfg: Config) -> ReconcilerSettings:
    from slurm_burst.core.reconcile import Policy
    from slurm_burst.services.reconciler import ReconcilerSettings

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
    from slurm_burst.services.gputelemetry import TelemetrySettings

    return TelemetrySettings(fleet=cfg.fleet, gpu=cfg.gpu)


def warm_settings(cfg: Config) -> WarmSettings:
    from slurm_burst.services.warmpool import WarmSettings

    def idle_limit(g: NodeGroup) -> float:
        part = cfg.partitions.get(g.partition)
        limit = part.suspend_time if part is not None else None
        return float(cfg.slurm.suspend_time if limit is None else limit)

    return WarmSettings(
        groups=cfg.node_groups, idle_limits={n: idle_limit(g) for n, g in cfg.node_groups.items()}
    )


def policy_settings(cfg: Config) -> PolicySettings:
    from slurm_burst.services.burstpolicy import PolicySettings

    groups = cfg.node_groups.values()
    st = cfg.staging
    mbit = st.link_mbit  # 0: staged data not counted; the push's own limit when lower
    if mbit > 0 and 0 < st.bandwidth_mbit < mbit:
        mbit = st.bandwidth_mbit
    store = cfg.stores.get(st.store) if st.store else None
    return PolicySettings(
        policy=cfg.policy,
        data_mbit=mbit if store is not None else 0.0,
        data_prices=_prices(st.store, store) if store is not None else None,
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
    from slurm_burst.services.daemon import DaemonSettings

    return DaemonSettings(
        fleet=cfg.fleet,
        poll_period=cfg.daemon.poll_period,
        metrics_listen=cfg.daemon.metrics_listen,
    )


def daemon_host(cfg: Config) -> DaemonHost:
    from slurm_burst.adapters.host import LocalHost

    d = cfg.daemon
    lock = f"daemon.{node_id(cfg)}.lock" if d.ha_url else "daemon.lock"
    return LocalHost(d.state_dir, d.socket, lock, slurm_group(cfg))


def reconciler(cfg: Config, ports: ReconcilerPorts, hands: NodeHands) -> Reconciler:
    from slurm_burst.services.reconciler import Reconciler

    groups = group_control(cfg, ports.store, ports.scheduler)
    return Reconciler(reconciler_settings(cfg), ports, hands, groups)


def fleet_views(cfg: Config, clouds: Mapping[str, Cloud], clock: Clock) -> dict[str, FleetView]:
    """A shared listing for each provider profile that lists its fleet cheaply (EC2)."""
    from slurm_burst.services.cloudcalls import ManagedCloud as Managed
    from slurm_burst.services.fleetview import FleetView

    return {
        name: FleetView(c, cfg.cluster.name, clock)
        for name, c in clouds.items()
        if isinstance(c, Managed) and c.lists_fleet
    }


def assemble(cfg: Config, parts: DaemonParts) -> Daemon:
    """The daemon and its services from ``parts``: constructor injection, no set-up after."""
    from slurm_burst.services.burstpolicy import BurstPolicy
    from slurm_burst.services.chargeback import ChargebackLoop
    from slurm_burst.services.daemon import Daemon, DaemonPorts, DaemonServices
    from slurm_burst.services.gputelemetry import GpuTelemetry
    from slurm_burst.services.instancelog import InstanceLog
    from slurm_burst.services.launcher import Launcher
    from slurm_burst.services.nodestage import NodeStaging, NodeStagingSettings
    from slurm_burst.services.outputs import OutputPorts, Outputs, OutputSettings
    from slurm_burst.services.provisioner import Provisioner, ProvisionerPorts
    from slurm_burst.services.reconciler import NodeHands, ReconcilerPorts
    from slurm_burst.services.registration import Registrations
    from slurm_burst.services.simulation import cloud_groups
    from slurm_burst.services.stagework import StageWork, StageWorkSettings
    from slurm_burst.services.warmpool import WarmKeeper
    from slurm_burst.services.workers import Workers

    p = parts
    stop = threading.Event()
    clouds = dict(p.clouds)
    registrations = Registrations(
        p.store, p.scheduler, p.clock, stop, give_up=cfg.daemon.register_timeout,
        metrics=p.metrics,
    )  # fmt: skip
    staging, stagework, outputs = None, None, None
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
    views = fleet_views(cfg, clouds, p.clock)
    ports = ProvisionerPorts(
        store=p.store, clouds=clouds, mesh=p.mesh, connector=p.connector,
        scheduler=p.scheduler, ledger=p.ledger, clock=p.clock, metrics=p.metrics,
        staging=staging, outputs=outputs, views=views,
    )  # fmt: skip
    instances = InstanceLog(cfg.fleet, p.ledger, p.clock)
    launcher = Launcher(launcher_settings(cfg), ports, p.secrets.ssh_public_key, instances)
    provisioner = Provisioner(
        provisioner_settings(cfg, p.slurm_release), ports, p.secrets,
        launcher=launcher, instances=instances, stopping=stop, joined=registrations.watch,
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
            provisioner=provisioner, workers=workers, reconciler=reconcile,
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
    from slurm_burst.adapters.nodeapi import NodeApiServer
    from slurm_burst.core.mesh import hub_address
    from slurm_burst.services.interruptions import InterruptionPorts, Interruptions
    from slurm_burst.services.launcher import cooled
    from slurm_burst.services.nodeapi import NodeApi, NodeApiSettings

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
                              fail=provisioner.fail, submit=workers.submit)
        )  # fmt: skip
        api.noticed = interruptions.notice
    if p.serve_node_api:
        served.append(NodeApiServer(api.peers, (hub_address(m.subnet), m.api_port), m.interface,
                                    notice=api.notice))  # fmt: skip
    return api, interruptions, served


def daemon(cfg: Config) -> Daemon:
    """The daemon with every collaborator built from ``cfg`` (the hub is brought up)."""
    from slurm_burst.adapters.ssh.session import SshConnector, generate_key
    from slurm_burst.adapters.stagepush import CliPusher
    from slurm_burst.services.provisioner import Secrets

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
        slurm_release=_release_or_none(cfg),
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
