"""The clouds: each provider profile's libcloud driver (through the plugins' wrappers),
the launch placement, the daemon's managed clouds within their accounts' API budgets,
the shared fleet listings. What a provider is comes from its module
(``adapters/cloud/providers``); nothing here tests a provider's name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from slurm_burst import extensions
from slurm_burst.adapters.cloud.compute import LibcloudCloud
from slurm_burst.adapters.cloud.credentials import resolve
from slurm_burst.adapters.cloud.profiles import Placement
from slurm_burst.adapters.cloud.registry import driver_class, provider
from slurm_burst.adapters.cloud.registry import driver_exists as exists
from slurm_burst.config import Config, ProviderConfig
from slurm_burst.core.ratelimit import ApiBudgets, Limit
from slurm_burst.ports import Clock, Cloud, Metrics
from slurm_burst.services.cloudcalls import CallSettings, ManagedCloud, SharedBudget
from slurm_burst.services.cloudcalls import ManagedCloud as Managed
from slurm_burst.services.cloudcalls import SharedBudget as Budget
from slurm_burst.services.fleetview import FleetView

if TYPE_CHECKING:
    from libcloud.compute.base import NodeDriver


def driver_exists(name: str) -> bool:
    return exists(name)


def cloud_driver(
    provider_cfg: ProviderConfig, environ: Mapping[str, str] | None = None
) -> NodeDriver:
    """A libcloud driver for ``provider``, with its credentials resolved (never logged)."""
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
    return Placement(
        network=provider.network,
        subnet=provider.subnet,
        security_groups=tuple(provider.security_groups),
        key_name=provider.key_name,
        zone=provider.zone,
        region=provider.region,
        resource_group=provider.resource_group,
        root_device=provider.root_device,
        ssh_user=cfg.daemon.ssh_user,
        host_keys=provider.host_keys,
        extra=dict(provider.launch_options),
    )


def clouds(cfg: Config) -> dict[str, LibcloudCloud]:
    return {
        name: LibcloudCloud(name, wrapped_driver(cfg, name), placement(cfg, p), p.launch_batch)
        for name, p in cfg.providers.items()
    }


def managed_clouds(cfg: Config, metrics: Metrics | None = None) -> dict[str, ManagedCloud]:
    """The clouds as the daemon uses them: every call timed, paced within its account's
    API budget (one per account and region, shared by the profiles on it) and throttling
    retried."""

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
    """Each profile's :class:`SharedBudget`: profiles in the same scope (the provider's
    ``budget_scope``: an account in a region, a GCE project) share theirs (named after
    the first)."""

    shared: dict[tuple[str, ...], Budget] = {}
    out = {}
    for name in sorted(built):
        p = cfg.providers[name]
        described = provider(p.driver)
        account = described.budget_scope(p)
        if account not in shared:
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


def fleet_views(cfg: Config, clouds: Mapping[str, Cloud], clock: Clock) -> dict[str, FleetView]:
    """A shared listing for each provider profile that lists its fleet cheaply (EC2)."""
    return {
        name: FleetView(c, cfg.cluster.name, clock)
        for name, c in clouds.items()
        if isinstance(c, Managed) and c.lists_fleet
    }


def notice_providers(cfg: Config) -> dict[str, tuple[str, ...]]:
    """The provider profiles whose instances hear of their reclaim beforehand, with the
    node agent's arguments that read it (EC2: the spot ``instance-action`` of the
    instance metadata service; GCE: the metadata server's ``preempted`` and
    ``maintenance-event``)."""
    return {n: args for n, p in cfg.providers.items()
            if (args := provider(p.driver).interruption_notices)}  # fmt: skip
