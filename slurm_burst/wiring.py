"""The one place adapters are built from the configuration.

Imports are inside the functions: the hooks use this module and must not pay
for libcloud, paramiko or SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_burst.config import Config, ProviderConfig

if TYPE_CHECKING:
    from slurm_burst.adapters.slurm.cli import SlurmCli
    from slurm_burst.ports import Cloud


def state_db_path(cfg: Config) -> Path:
    return Path(cfg.daemon.state_dir) / "state.db"


def scheduler(cfg: Config, timeout: float | None = None) -> SlurmCli:
    from slurm_burst.adapters.slurm.cli import SlurmCli

    s = cfg.slurm
    return SlurmCli(
        bin_dir=s.bin_dir,
        slurm_conf=str(Path(s.conf_dir) / "slurm.conf"),
        timeout=s.command_timeout if timeout is None else min(timeout, s.command_timeout),
        batch=s.update_batch,
    )


def cloud_driver(provider: ProviderConfig, environ: Mapping[str, str] | None = None) -> Any:
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
        from slurm_burst.adapters.cloud.faults import FaultyDriver

        return FaultyDriver(driver, str(fault_file))
    return driver


def placement(cfg: Config, provider: ProviderConfig) -> Any:
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
        extra=dict(provider.launch_options),
    )


def clouds(cfg: Config) -> dict[str, Cloud]:
    from slurm_burst.adapters.cloud.compute import LibcloudCloud

    return {
        name: LibcloudCloud(name, cloud_driver(p), placement(cfg, p), p.launch_batch)
        for name, p in cfg.providers.items()
    }


def managed_clouds(cfg: Config, metrics: Any | None = None) -> dict[str, Any]:
    """The clouds as the daemon uses them: every call timed and throttling retried."""
    from slurm_burst.services.cloudcalls import ManagedCloud

    d = cfg.daemon
    return {
        name: ManagedCloud(c, d.api_attempts, d.api_backoff, d.api_backoff_max, metrics)
        for name, c in clouds(cfg).items()
    }


def leader(cfg: Config) -> Any:
    import socket

    from slurm_burst.adapters.ha import PgLeaderLock, SoleLeader

    node_id = cfg.daemon.node_id or socket.gethostname()
    if cfg.daemon.ha_url:
        return PgLeaderLock(cfg.daemon.ha_url, cfg.cluster.name, node_id)
    return SoleLeader(node_id)


def daemon(cfg: Config) -> Any:
    """The daemon with every collaborator built from ``cfg`` (the hub is brought up)."""
    from slurm_burst.adapters.metrics.prom import Metrics
    from slurm_burst.adapters.ssh.session import SshConnector, generate_key
    from slurm_burst.adapters.state.store import Store
    from slurm_burst.services.daemon import Daemon
    from slurm_burst.services.provisioner import Provisioner, Secrets
    from slurm_burst.services.reconciler import Reconciler

    key_path = str(Path(cfg.daemon.state_dir) / "ssh" / "id_ed25519")
    ssh_public = generate_key(key_path)
    munge_key = Path(cfg.slurm.munge_key).read_bytes()
    hub = mesh_hub(cfg)
    hub.ensure_hub()
    store = Store(state_db_path(cfg))
    spooling = daemon_ledger(cfg)
    metrics = Metrics()
    cl = managed_clouds(cfg, metrics)
    sched = scheduler(cfg)
    prov = Provisioner(
        cfg,
        store,
        cl,
        hub,
        SshConnector(cfg.daemon.ssh_user, key_path),
        sched,
        spooling,
        Secrets(ssh_public, munge_key),
        metrics=metrics,
    )
    d = Daemon(
        cfg,
        store,
        prov,
        chargeback(cfg, spooling.ledger),
        leader=leader(cfg),
        metrics=metrics,
    )
    d.reconciler = Reconciler(
        cfg, store, sched, cl, hub, prov, spooling.ledger, submit=d.submit, metrics=metrics
    )
    return d


def mesh_hub(cfg: Config) -> Any:
    from slurm_burst.adapters.mesh.wireguard import WireGuardHub

    m = cfg.mesh
    return WireGuardHub(m.interface, m.subnet, m.port, m.state_dir, m.endpoint, m.keepalive)


def ledger(cfg: Config, check_schema: bool = True) -> Any:
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


def daemon_ledger(cfg: Config) -> Any:
    """The daemon's ledger: never blocks provisioning, spools while the database is away."""
    from slurm_burst.adapters.ledger.spool import Spool, SpoolingLedger

    return SpoolingLedger(ledger(cfg, check_schema=False), Spool(spool_dir(cfg)))


def accounting(cfg: Config) -> Any:
    """Slurm accounting (sacct, sacctmgr) for the ledger's ingest and budgets."""
    from slurm_burst.adapters.slurm.accounting import SlurmAccounting

    return SlurmAccounting(
        cfg.slurm.bin_dir,
        str(Path(cfg.slurm.conf_dir) / "slurm.conf"),
        cfg.cluster.name,
        timeout=max(cfg.slurm.command_timeout, 60.0),
    )


def chargeback(cfg: Config, sql_ledger: Any | None = None) -> Any:
    from slurm_burst.services.chargeback import Chargeback

    return Chargeback(
        cfg,
        sql_ledger or ledger(cfg),
        accounting(cfg) if cfg.ledger.accounting else None,
        scheduler(cfg),
    )
