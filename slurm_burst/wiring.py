"""The composition root: the one place adapters are built from the configuration and
handed to the services.

Services know ports only (``slurm_burst.ports``); this module names the adapters.
Imports are inside the functions: the hooks use this module and must not pay for
libcloud, paramiko or SQLAlchemy.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_burst.adapters.proc import release_free_memory
from slurm_burst.config import Config, ProviderConfig
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
    from slurm_burst.ports import (
        AccountingLedger,
        Clock,
        Cloud,
        Connector,
        JobSteering,
        LeaderElection,
        Mesh,
        Metrics,
        NodeStore,
        Scheduler,
        SpooledLedger,
    )
    from slurm_burst.services.chargeback import Chargeback
    from slurm_burst.services.cloudcalls import ManagedCloud
    from slurm_burst.services.daemon import Daemon
    from slurm_burst.services.groups import GroupControl
    from slurm_burst.services.provisioner import Secrets
    from slurm_burst.services.simulation import Comparison


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

    return RequestSpool(cfg.daemon.spool_dir, slurm_group(cfg))


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


def group_control(cfg: Config, store: NodeStore) -> GroupControl:
    from slurm_burst.services.groups import GroupControl

    return GroupControl(cfg, store, scheduler(cfg))


# -- clouds --------------------------------------------------------------------------
def driver_exists(name: str) -> bool:
    from slurm_burst.adapters.cloud.registry import driver_exists as exists

    return exists(name)


def cloud_driver(provider: ProviderConfig, environ: Mapping[str, str] | None = None) -> NodeDriver:
    """A libcloud driver for ``provider``, with its credentials resolved (never logged)."""
    from slurm_burst.adapters.cloud.credentials import resolve
    from slurm_burst.adapters.cloud.registry import driver_class

    cls = driver_class(provider.driver)
    kwargs: dict[str, Any] = dict(provider.options)
    fault_file = kwargs.pop("fault_file", None)  # the lab's fault matrix, never production
    creds = resolve(provider, environ)
    key, secret = creds.pop("key", ""), creds.pop("secret", "")
    kwargs.update(creds)
    kind = provider.driver
    if kind == "nscloud":
        if provider.region:
            kwargs["region"] = provider.region
        driver = cls("lab", **kwargs)
    elif kind == "gce":  # GCENodeDriver(user_id, key, datacenter=zone, project=...)
        kwargs.setdefault("datacenter", provider.zone or provider.region or None)
        driver = cls(key, secret, **kwargs)
    elif kind == "azure_arm":  # AzureNodeDriver(tenant_id, subscription_id, key, secret)
        tenant, subscription = kwargs.pop("tenant_id", ""), kwargs.pop("subscription_id", "")
        if provider.region:
            kwargs.setdefault("region", provider.region)
        driver = cls(tenant, subscription, key, secret, **kwargs)
    elif kind == "openstack":
        kwargs.setdefault("api_version", "2.0")  # Nova 2.x; Neutron and Glance for the rest
        kwargs.setdefault("ex_force_auth_version", "3.x_password")
        if provider.region:
            kwargs.setdefault("ex_force_service_region", provider.region)
        driver = cls(key, secret, **kwargs)
    else:  # ec2 and any other driver: (key, secret, region=...)
        if provider.region:
            kwargs["region"] = provider.region
        driver = cls(key, secret, **kwargs)
    if fault_file:
        from slurm_burst.lab.faults import FaultyDriver

        driver = FaultyDriver(driver, str(fault_file))  # delegates: a NodeDriver to its users
    return driver  # type: ignore[no-any-return]  # libcloud ships no type information


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
        name: LibcloudCloud(name, cloud_driver(p), placement(cfg, p), p.launch_batch)
        for name, p in cfg.providers.items()
    }


def managed_clouds(cfg: Config, metrics: Metrics | None = None) -> dict[str, ManagedCloud]:
    """The clouds as the daemon uses them: every call timed and throttling retried."""
    from slurm_burst.core.hostkeys import READS_PER_SECOND
    from slurm_burst.services.cloudcalls import ManagedCloud

    d = cfg.daemon

    def reads(p: ProviderConfig) -> float:
        return p.host_key_reads_per_second or READS_PER_SECOND.get(p.driver, 5.0)

    return {
        name: ManagedCloud(
            c,
            d.api_attempts,
            d.api_backoff,
            d.api_backoff_max,
            metrics,
            reads_per_second=reads(cfg.providers[name]),
        )
        for name, c in clouds(cfg).items()
    }


# -- mesh, HA, metrics -----------------------------------------------------------------
def mesh_hub(cfg: Config) -> WireGuardHub:
    from slurm_burst.adapters.mesh.wireguard import WireGuardHub

    m = cfg.mesh
    return WireGuardHub(m.interface, m.subnet, m.port, m.state_dir, m.endpoint, m.keepalive)


def leader(cfg: Config) -> LeaderElection:
    from slurm_burst.adapters.ha import PgLeaderLock, SoleLeader

    node_id = cfg.daemon.node_id or socket.gethostname()
    if cfg.daemon.ha_url:
        return PgLeaderLock(cfg.daemon.ha_url, cfg.cluster.name, node_id)
    return SoleLeader(node_id)


def metrics(cfg: Config) -> PromMetrics:
    from slurm_burst.adapters.metrics.prom import Metrics as PromMetrics

    return PromMetrics(max_accounts=cfg.daemon.metrics_max_accounts)


# -- the ledger ------------------------------------------------------------------------
def plot_simulation(rows: list[Comparison], title: str, directory: str) -> list[str]:
    """The simulator's plots (matplotlib, imported here: only ``simulate --plot`` needs it)."""
    from slurm_burst.adapters.plots import plot

    return plot(rows, title, directory)


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


def chargeback(
    cfg: Config, sql: AccountingLedger | None = None, metrics: Metrics | None = None
) -> Chargeback:
    from slurm_burst.services.chargeback import Chargeback

    return Chargeback(
        cfg,
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


def assemble(cfg: Config, parts: DaemonParts) -> Daemon:
    """The daemon and its services from ``parts``: constructor injection, no set-up after."""
    from slurm_burst.services.burstpolicy import BurstPolicy
    from slurm_burst.services.chargeback import ChargebackLoop
    from slurm_burst.services.daemon import Daemon
    from slurm_burst.services.gputelemetry import GpuTelemetry
    from slurm_burst.services.provisioner import Provisioner
    from slurm_burst.services.reconciler import Reconciler
    from slurm_burst.services.registration import Registrations
    from slurm_burst.services.simulation import cloud_groups
    from slurm_burst.services.warmpool import WarmKeeper
    from slurm_burst.services.workers import Workers

    stop = threading.Event()
    clouds = dict(parts.clouds)
    registrations = Registrations(
        parts.store, parts.scheduler, parts.clock, stop, give_up=cfg.daemon.register_timeout
    )
    prov = Provisioner(
        cfg,
        parts.store,
        clouds,
        parts.mesh,
        parts.connector,
        parts.scheduler,
        parts.ledger,
        parts.secrets,
        parts.clock,
        stop,
        parts.metrics,
        joined=registrations.watch,
        slurm_release=parts.slurm_release,
    )
    workers = Workers(prov, parts.store, cfg.daemon.workers)
    reconciler = Reconciler(
        cfg,
        parts.store,
        parts.scheduler,
        clouds,
        parts.mesh,
        prov.fail,
        workers.submit,
        parts.clock,
        parts.sql_ledger,
        parts.metrics,
    )
    loop = (
        ChargebackLoop(cfg, parts.chargeback, parts.ledger)
        if parts.chargeback is not None
        else None
    )
    return Daemon(
        cfg,
        parts.store,
        prov,
        workers,
        reconciler,
        parts.leader,
        parts.clock,
        stop,
        loop,
        parts.metrics,
        slurm_group(cfg),
        release_free_memory,
        registrations,
        GpuTelemetry(
            cfg,
            parts.store,
            parts.connector,
            parts.scheduler,
            parts.clock,
            stop,
            parts.sql_ledger.gpu_usage if parts.sql_ledger is not None else None,
            parts.metrics,
        ),
        BurstPolicy(
            cfg,
            parts.steering,
            parts.store,
            parts.clock,
            cloud_groups(cfg),
            parts.chargeback.money_left if parts.chargeback is not None else None,
            stop,
        )
        if parts.steering is not None and cfg.policy.enabled
        else None,
        WarmKeeper(cfg, parts.scheduler, parts.store, parts.clock)
        if any(g.warm for g in cfg.node_groups.values())
        else None,
        request_spool(cfg),
    )


def daemon(cfg: Config) -> Daemon:
    """The daemon with every collaborator built from ``cfg`` (the hub is brought up)."""
    from slurm_burst.adapters.ssh.session import SshConnector, generate_key
    from slurm_burst.services.provisioner import Secrets

    key_path = str(Path(cfg.daemon.state_dir) / "ssh" / "id_ed25519")
    ssh_public = generate_key(key_path)
    munge_key = Path(cfg.slurm.munge_key).read_bytes()
    hub = mesh_hub(cfg)
    hub.ensure_hub()
    sql = ledger(cfg, check_schema=False)
    prom = metrics(cfg)
    slurm = scheduler(cfg)
    parts = DaemonParts(
        store=node_store(cfg, upgrade=True),
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
    )
    return assemble(cfg, parts)


def _release_or_none(cfg: Config) -> str | None:
    """slurmctld's release for the nodes' version check; None (no check, said) if unknown."""
    try:
        return slurm_release(cfg)
    except ValueError as exc:
        logging.getLogger(__name__).warning("daemon.slurm_release_unknown %s", exc)
        return None
