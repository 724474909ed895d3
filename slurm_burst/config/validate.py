"""Semantic checks that types alone cannot express. Pure: no file or network access."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

from slurm_burst.adapters.cloud.registry import host_key_sources, offering, provider
from slurm_burst.config.model import _PATTERN, Config, NodeGroup, ProviderConfig
from slurm_burst.config.schema import Problem
from slurm_burst.config.validate_launch import launch_problems
from slurm_burst.config.validate_staging import staging_problems
from slurm_burst.core.hostlist import HostlistError, expand
from slurm_burst.core.pricing import PricingError, ambiguous, parse_instant, to_micros
from slurm_burst.core.redact import has_inline_password
from slurm_burst.core.runtime import RULE_NAMES
from slurm_burst.core.slurm import SUPPORTED_RELEASES, release_key
from slurm_burst.core.slurmsyntax import (
    is_device_path,
    is_feature,
    is_name,
    is_node_name,
    is_path,
    is_time,
)

_IFNAME = re.compile(r"[A-Za-z0-9_.-]{1,15}", re.ASCII)
_PORT = re.compile(r"[0-9]{1,5}", re.ASCII)
BACKENDS = ("cli",)


def validate(
    cfg: Config,
    driver_exists: Callable[[str], bool] | None = None,
    declared_providers: set[str] | None = None,
) -> list[Problem]:
    """Every semantic problem in ``cfg``; ``driver_exists`` checks libcloud driver names.

    ``declared_providers`` are the profile names in the file, including ones that
    failed to load (already reported), so references to them are not errors twice.
    """
    out: list[Problem] = []
    _cluster(cfg, out)
    _slurm(cfg, out)
    _groups(cfg, out, declared_providers or set(cfg.providers))
    for name, prov in cfg.providers.items():
        if not prov.driver:
            out.append(Problem(f"providers.{name}.driver", "must name a libcloud driver"))
        elif driver_exists is not None and not driver_exists(prov.driver):
            out.append(
                Problem(
                    f"providers.{name}.driver", f"libcloud has no compute driver {prov.driver!r}"
                )
            )
        _provider(name, prov, out)
        creds = prov.credentials
        if creds is not None and creds.file and (creds.key_env or creds.secret_env):
            out.append(
                Problem(
                    f"providers.{name}.credentials",
                    "give either 'file' or 'key_env'/'secret_env', not both",
                )
            )
    _mesh(cfg, out)
    _gpu(cfg, out)
    _policy(cfg, out)
    _ledger(cfg, out)
    _rates(cfg, out)
    out.extend(launch_problems(cfg))
    out.extend(staging_problems(cfg))
    if not 0.1 <= cfg.daemon.hook_db_timeout <= 60:  # NaN fails both
        out.append(Problem("daemon.hook_db_timeout", "must be between 0.1 and 60 seconds"))
    for key in ("spool_dir", "state_dir"):
        if not is_path(getattr(cfg.daemon, key)):
            out.append(Problem(f"daemon.{key}", _PATH_ADVICE))
    if cfg.daemon.syslog and not is_path(cfg.daemon.syslog):
        out.append(Problem("daemon.syslog", _PATH_ADVICE))
    if cfg.daemon.spool_dir.rstrip("/") == cfg.daemon.state_dir.rstrip("/"):
        out.append(Problem("daemon.spool_dir", "must not be daemon.state_dir: it stands in for it"))
    if cfg.daemon.poll_period <= 0:
        out.append(Problem("daemon.poll_period", "must be positive"))
    if cfg.daemon.workers < 1:
        out.append(Problem("daemon.workers", "must be at least 1"))
    if cfg.daemon.bootstrap_slots < 1:
        out.append(Problem("daemon.bootstrap_slots", "must be at least 1"))
    else:
        out.extend(_join_slots(cfg))
    if not 0 <= cfg.daemon.name_each_max <= 1_000_000:
        out.append(Problem("daemon.name_each_max", "must be between 0 and 1000000"))
    if not (0 < cfg.daemon.api_share <= 1):
        out.append(Problem("daemon.api_share", "must be more than 0 and at most 1"))
    for pname, prov in cfg.providers.items():
        for api, lim in prov.api_limits.items():
            ok = (
                isinstance(lim, list | tuple)
                and len(lim) == 2
                and all(isinstance(x, int | float) and not isinstance(x, bool) for x in lim)
                and all(0 < float(x) < 1e9 for x in lim)
            )
            if not ok:
                out.append(Problem(
                    f"providers.{pname}.api_limits.{api}",
                    "must be [burst, refill per second], two numbers above 0",
                ))  # fmt: skip
    for key in (
        "boot_timeout",
        "bootstrap_timeout",
        "register_timeout",
        "api_backoff",
        "api_backoff_max",
    ):
        if getattr(cfg.daemon, key) <= 0:
            out.append(Problem(f"daemon.{key}", "must be positive"))
    for key in ("orphan_grace", "lost_resume_grace", "capacity_cooldown", "protect_cooldown"):
        if getattr(cfg.daemon, key) < 0:
            out.append(Problem(f"daemon.{key}", "must not be negative"))
    for key in ("protect_after", "api_attempts", "metrics_max_accounts"):
        if getattr(cfg.daemon, key) < 1:
            out.append(Problem(f"daemon.{key}", "must be at least 1"))
    if cfg.daemon.metrics_listen:
        _host, sep, port = cfg.daemon.metrics_listen.rpartition(":")
        if not sep or not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
            out.append(Problem("daemon.metrics_listen", "must be HOST:PORT (e.g. 127.0.0.1:9466)"))
    if cfg.daemon.ha_url and not cfg.daemon.ha_url.startswith("postgresql"):
        out.append(Problem("daemon.ha_url", "HA needs a PostgreSQL URL (postgresql+psycopg://...)"))
    if cfg.slurm.power_save_interval < 1:
        out.append(Problem("slurm.power_save_interval", "must be at least 1 second"))
    if cfg.node_groups and not cfg.mesh.endpoint:
        out.append(Problem("mesh.endpoint", "cloud nodes need the hub's public address"))
    if cfg.daemon.heartbeat_stale <= cfg.daemon.poll_period:
        out.append(Problem("daemon.heartbeat_stale", "must be longer than daemon.poll_period"))
    return out


_INLINE_URL_ADVICE = (
    "holds a password, which the config must not: PostgreSQL reads it from the password "
    "file (~root/.pgpass, or PGPASSFILE), MariaDB from an option file named in the URL "
    "(?read_default_file=/etc/slurm-burst/my.cnf, mode 0600)"
)


def _ledger(cfg: Config, out: list[Problem]) -> None:
    for key, url in (("ledger.url", cfg.ledger.url), ("daemon.ha_url", cfg.daemon.ha_url)):
        if url and has_inline_password(url):
            out.append(Problem(key, _INLINE_URL_ADVICE))
    led = cfg.ledger
    if "://" not in led.url:
        out.append(Problem("ledger.url", "must be an SQLAlchemy URL such as sqlite:////path.db"))
    if led.overhead not in ("usage", "site"):
        out.append(Problem("ledger.overhead", "must be 'usage' or 'site'"))
    if not is_name(led.site_account):
        out.append(Problem("ledger.site_account", "must be a Slurm account name"))
    for key in ("ingest_interval", "budget_sync_interval"):
        if getattr(led, key) <= 0:
            out.append(Problem(f"ledger.{key}", "must be positive"))
    if led.ingest_overlap < 0:
        out.append(Problem("ledger.ingest_overlap", "must not be negative"))


def _rates(cfg: Config, out: list[Problem]) -> None:
    sizes = {s for g in cfg.node_groups.values() for s in g.size_names}
    for name, r in cfg.rates.items():
        base = f"rates.{name}"
        if r.per not in ("instance", "gpu"):
            out.append(Problem(f"{base}.per", "must be 'instance' or 'gpu'"))
        _money(r.price_per_hour, f"{base}.price_per_hour", out)
        if r.size not in sizes:
            out.append(
                Problem(f"{base}.size", f"no node group uses size {r.size!r}", severity="warning")
            )
        if r.per == "gpu" and r.size in sizes and cfg.gpus_of_size(r.size) == 0:
            out.append(Problem(f"{base}.per", f"'gpu', but size {r.size!r} has no GPUs"))
        if r.account and not is_name(r.account):
            out.append(Problem(f"{base}.account", "must be a Slurm account name"))
        try:
            start = parse_instant(r.valid_from, "valid_from")
            end = parse_instant(r.valid_to, "valid_to") if r.valid_to else None
        except PricingError as exc:
            out.append(Problem(base, str(exc)))
            continue
        if end is not None and end <= start:
            out.append(Problem(f"{base}.valid_to", "must be after valid_from"))
    for a, b in ambiguous(cfg.rate_list()):
        out.append(
            Problem(
                b.name.removeprefix("rates.") if b.name.startswith("rates.") else b.name,
                f"starts at the same time as {a.name} for the same size and account",
            )
        )


def _cluster(cfg: Config, out: list[Problem]) -> None:
    if not is_name(cfg.cluster.name):
        out.append(Problem("cluster.name", "must be letters, digits, '-' or '_'"))
    if not cfg.cluster.controller_host:
        out.append(Problem("cluster.controller_host", "must not be empty"))
    try:
        ipaddress.ip_address(cfg.cluster.controller_addr)
    except ValueError:
        out.append(Problem("cluster.controller_addr", "must be an IP address"))


def _slurm(cfg: Config, out: list[Problem]) -> None:
    s = cfg.slurm
    if s.backend not in BACKENDS:
        out.append(Problem("slurm.backend", f"must be one of {', '.join(BACKENDS)}"))
    for key in (
        "command_timeout",
        "resume_timeout",
        "suspend_timeout",
        "suspend_time",
        "hostlist_max_names",
    ):
        if getattr(s, key) <= 0:
            out.append(Problem(f"slurm.{key}", "must be positive"))
    if not 1 <= s.update_batch <= 100:
        out.append(Problem("slurm.update_batch", "must be between 1 and 100"))
    for key in ("resume_rate", "suspend_rate"):
        if getattr(s, key) < 0:
            out.append(Problem(f"slurm.{key}", "must not be negative"))
    # What the rendered fragment carries: each value as Slurm's parser takes it.
    for key in ("hook_dir", "conf_dir"):
        if not is_path(getattr(s, key)):
            out.append(Problem(f"slurm.{key}", _PATH_ADVICE))
    for key, high in _SLURM_BOUNDS.items():
        if getattr(s, key) > high:
            out.append(Problem(f"slurm.{key}", f"must be at most {high:,} (Slurm's limit)"))
    for part in s.onprem_partitions:
        if not is_name(part):
            out.append(Problem("slurm.onprem_partitions", f"{part!r} is not a partition name"))
    for name, pcfg in cfg.partitions.items():
        base = f"partitions.{name}"
        if not is_name(name):
            out.append(Problem(base, "a partition name is letters, digits, '-' or '_'"))
        if not is_time(pcfg.max_time):
            out.append(
                Problem(
                    f"{base}.max_time",
                    "must be a Slurm time: MINUTES, HH:MM:SS, D-HH:MM:SS or INFINITE",
                )
            )
        if pcfg.suspend_time is not None and not 1 <= pcfg.suspend_time <= 2**31 - 1:
            out.append(Problem(f"{base}.suspend_time", "must be a positive number of seconds"))
    if s.release and s.release not in SUPPORTED_RELEASES:
        out.append(Problem("slurm.release", f"must be one of {', '.join(SUPPORTED_RELEASES)}"))
    _metrics(cfg, out)
    if s.prolog_chain and not s.prolog_chain.startswith("/"):
        out.append(Problem("slurm.prolog_chain", "must be an absolute path (Slurm's PATH is bare)"))
    burst = set(cfg.burst_partitions())
    for part in s.onprem_partitions:
        if part in burst:
            out.append(
                Problem(
                    "slurm.onprem_partitions", f"{part!r} is also a burst partition of a node group"
                )
            )


_PATH_ADVICE = (
    "must be an absolute path of ASCII letters, digits and ._+@/- (it is written into "
    "slurm.conf, where a blank, '#', quote or control character would change the line)"
)
# Slurm keeps these in 16 bits (ResumeTimeout, SuspendTimeout, rates; PrologEpilogTimeout
# is ResumeTimeout + 30): a larger value is refused or wraps.
_SLURM_BOUNDS = {
    "resume_timeout": 65_000,
    "suspend_timeout": 65_000,
    "resume_rate": 65_000,
    "suspend_rate": 65_000,
    "suspend_time": 2**31 - 1,
    "power_save_interval": 86_400,
    "hostlist_max_names": 10_000_000,
}
# Nodes one group may define: Slurm's own limit of nodes in a cluster is 65,533 plus the
# controller (TreeWidth); a larger count is a typo that every hook would pay for.
MAX_GROUP_NODES = 65_536
MAX_TOTAL_NODES = 65_536  # all groups together


def _money(value: float, path: str, out: list[Problem]) -> None:
    """A price: not negative, and an amount to_micros can hold exactly."""
    if value < 0:
        out.append(Problem(path, "must not be negative"))
        return
    try:
        to_micros(value)
    except PricingError as exc:
        out.append(Problem(path, str(exc)))


def _groups(cfg: Config, out: list[Problem], declared: set[str]) -> None:
    if not cfg.node_groups:
        out.append(Problem("node_groups", "no node group defined", severity="warning"))
    total = sum(g.count for g in cfg.node_groups.values())
    if total > MAX_TOTAL_NODES:
        out.append(
            Problem(
                "node_groups",
                f"define {total:,} nodes in all, over {MAX_TOTAL_NODES:,} (every hook expands "
                "and checks them; Slurm's own limit of a cluster's nodes is about this)",
            )
        )
    seen: dict[str, str] = {}
    for gname, g in cfg.node_groups.items():
        base = f"node_groups.{gname}"
        if g.all_or_nothing not in ("job", "node"):
            out.append(Problem(f"{base}.all_or_nothing", "must be 'job' or 'node'"))
        _group(cfg, g, base, out, declared)
        for wname, w in g.warm.items():
            try:
                win = w.window()
            except ValueError as exc:
                out.append(Problem(f"{base}.warm.{wname}", str(exc)))
                continue
            if win.nodes > g.limit:
                out.append(
                    Problem(f"{base}.warm.{wname}.nodes", f"more than the group's {g.limit}")
                )
        if (
            _PATTERN.fullmatch(g.pattern)
            and 1 <= g.count <= MAX_GROUP_NODES
            and total <= MAX_TOTAL_NODES
        ):
            for node in g.node_names():
                if node in seen:
                    out.append(
                        Problem(
                            f"{base}.pattern",
                            f"node {node} is also defined by node group {seen[node]!r}",
                        )
                    )
                    break
                seen[node] = gname
    _max_node_count(cfg, out)
    for pname in cfg.partitions:
        if pname not in cfg.burst_partitions():
            out.append(
                Problem(
                    f"partitions.{pname}", "no node group uses this partition", severity="warning"
                )
            )


DYNAMIC_SINCE = (23, 11)


def dynamic_refusal(cfg: Config, release: str) -> str | None:
    """Why Slurm ``release`` cannot run the config's dynamic node groups; None if it can
    (or there are none). Said by conf render and the daemon's start."""
    first = next((g for g in cfg.node_groups.values() if g.dynamic), None)
    return None if first is None else _dynamic_refused(first.name, release)


def _dynamic_refused(group: str, release: str) -> str | None:
    """Why Slurm ``release`` cannot run dynamic node group ``group``; None if it can."""
    if release not in SUPPORTED_RELEASES or release_key(release) >= DYNAMIC_SINCE:
        return None
    return (
        f"node group {group} is dynamic: before 23.11 Slurm ({release} here) has "
        "dynamic nodes only with TreeWidth=65533 for the whole cluster (no fan-out to "
        "any node, on-prem ones too); slurm-burst supports and tests them from Slurm "
        "23.11: use nodes = 'declared'"
    )


METRICS_SINCE = {"open": (25, 11), "users": (26, 5)}


def metrics_refusal(cfg: Config, release: str) -> str | None:
    """Why Slurm ``release`` cannot serve slurm.metrics as configured; None if it can."""
    want = cfg.slurm.metrics
    since = METRICS_SINCE.get(want)
    if since is None or release not in SUPPORTED_RELEASES or release_key(release) >= since:
        return None
    what = "MetricsAuthUsers" if want == "users" else "slurmctld's OpenMetrics"
    return (
        f"slurm.metrics = '{want}' needs Slurm {since[0]}.{since[1]:02d} or newer "
        f"({what}); this cluster runs {release}: use 'off'"
    )


def _metrics(cfg: Config, out: list[Problem]) -> None:
    s = cfg.slurm
    if s.metrics not in ("off", "open", "users"):
        out.append(Problem("slurm.metrics", "must be 'off', 'open' or 'users'"))
        return
    refused = metrics_refusal(cfg, s.release)
    if refused:
        out.append(Problem("slurm.metrics", refused))
    if s.metrics == "users" and not s.metrics_users:
        out.append(Problem("slurm.metrics_users", "must name at least one user with 'users'"))
    for user in s.metrics_users:
        if not is_name(user):
            out.append(Problem("slurm.metrics_users", f"{user!r} is not a user name"))
    if s.metrics == "open":
        out.append(
            Problem(
                "slurm.metrics",
                "'open' serves slurmctld's metrics (job counts by user and account) "
                "without authentication to every host that reaches its port, cloud nodes "
                "included",
                severity="warning",
            )
        )


def _dynamic_group(cfg: Config, g: NodeGroup, base: str, out: list[Problem]) -> None:
    """What ``nodes = "dynamic"`` asks of the group and of Slurm."""
    if g.nodes not in ("declared", "dynamic"):
        out.append(Problem(f"{base}.nodes", "must be 'declared' or 'dynamic'"))
        return
    if not g.dynamic:
        return
    refused = _dynamic_refused(g.name, cfg.slurm.release)
    if refused:
        out.append(Problem(f"{base}.nodes", refused))
    if g.warm:
        out.append(
            Problem(
                f"{base}.warm",
                "a dynamic group has no warm pool (SuspendExcNodes names nodes of "
                "slurm.conf); use a declared group for warm capacity",
            )
        )


def _max_node_count(cfg: Config, out: list[Problem]) -> None:
    """slurm.max_node_count: room in slurmctld for every dynamic group's nodes."""
    n = cfg.slurm.max_node_count
    dynamic = [g for g in cfg.node_groups.values() if g.dynamic]
    ours = sum(g.limit if g.dynamic else g.count for g in cfg.node_groups.values())
    if not 0 <= n <= MAX_TOTAL_NODES:
        out.append(Problem("slurm.max_node_count", f"must be 0 to {MAX_TOTAL_NODES:,}"))
    elif dynamic and n == 0:
        out.append(
            Problem(
                "slurm.max_node_count",
                f"must be set with a dynamic node group ({dynamic[0].name}): the nodes of "
                f"the site's slurm.conf plus at least {ours:,} of ours (Slurm creates no "
                "node past MaxNodeCount)",
            )
        )
    elif n and n < ours:
        out.append(
            Problem(
                "slurm.max_node_count",
                f"{n:,} is below the node groups' own {ours:,} (declared nodes plus the "
                "dynamic groups' max_nodes), before any node of the site's",
            )
        )


def _provider(name: str, prov: ProviderConfig, out: list[Problem]) -> None:
    base = f"providers.{name}"
    if prov.launch_batch < 0:
        out.append(Problem(f"{base}.launch_batch", "must not be negative (0: driver default)"))
    _host_keys(name, prov, out)
    out += (
        Problem(f"{base}.{key}", why) for key, why in provider(prov.driver).profile_problems(prov)
    )
    for key in ("name", "size", "image", "location", "ex_userdata", "ex_metadata"):
        if key in prov.launch_options:
            out.append(Problem(f"{base}.launch_options.{key}", "is set by slurm-burst; remove it"))


def _host_keys(name: str, prov: ProviderConfig, out: list[Problem]) -> None:
    """A join must never fail at run time for a reason the config could have shown: a
    driver with no way to read a new instance's host keys through its API is refused."""
    base = f"providers.{name}"
    offered = host_key_sources(prov.driver)
    if prov.driver and not offered:
        usable = offering(lambda p: p.host_key_sources)
        out.append(
            Problem(
                f"{base}.driver",
                f"slurm-burst cannot read a new {prov.driver} instance's SSH host keys through "
                "the provider's API, so no node could join (nothing to trust); use "
                f"{', '.join(usable[:-1])} or {usable[-1]} (docs/providers.md, 'Host keys')",
            )
        )
    elif prov.host_keys and prov.host_keys not in offered:
        out.append(
            Problem(
                f"{base}.host_keys",
                f"{prov.host_keys!r} is not a host-key source of {prov.driver}; "
                f"choose {' or '.join(repr(x) for x in offered)}",
            )
        )
    rate = prov.host_key_reads_per_second
    if not 0 <= rate < 10_000:  # NaN fails both
        out.append(Problem(f"{base}.host_key_reads_per_second", "must be 0 (the default) to 10000"))


def _group_on_providers(cfg: Config, g: NodeGroup, base: str, out: list[Problem]) -> None:
    """What a node group asks of each of its providers' drivers."""
    if g.disk_gb < 0:
        out.append(Problem(f"{base}.disk_gb", "must not be negative"))
    _money(g.spot_max_price, f"{base}.spot_max_price", out)
    for pname in g.providers:
        prov = cfg.providers.get(pname)
        if prov is None:
            continue
        described = provider(prov.driver)
        if g.spot and not described.spot:
            out.append(
                Problem(
                    f"{base}.spot",
                    f"provider {pname!r} ({prov.driver}): libcloud cannot ask it for "
                    f"spot capacity; use a group without spot there",
                )
            )
        for key, why in described.group_problems(g):
            out.append(Problem(f"{base}.{key}", f"provider {pname!r}: {why}"))
        for key, why in described.group_warnings(g):
            out.append(Problem(f"{base}.{key}", f"provider {pname!r}: {why}", severity="warning"))


def _group(cfg: Config, g: NodeGroup, base: str, out: list[Problem], declared: set[str]) -> None:
    if not is_name(g.name):
        out.append(Problem(base, "group name must be letters, digits, '-' or '_'"))
    if not _PATTERN.fullmatch(g.pattern):
        out.append(
            Problem(
                f"{base}.pattern",
                "must be a node name with one '{n}' or '{n:0Wd}' index, e.g. 'gpu-{n}'",
            )
        )
    if not 1 <= g.count <= MAX_GROUP_NODES:
        out.append(Problem(f"{base}.count", f"must be between 1 and {MAX_GROUP_NODES:,}"))
    elif _PATTERN.fullmatch(g.pattern) and not is_node_name(g.node_name(g.count)):
        out.append(Problem(f"{base}.pattern", "makes node names over 64 characters"))
    if g.max_nodes is not None and not 0 <= g.max_nodes <= g.count:
        out.append(Problem(f"{base}.max_nodes", f"must be between 0 and count ({g.count})"))
    _dynamic_group(cfg, g, base, out)
    if not is_name(g.partition):
        out.append(Problem(f"{base}.partition", "must be a Slurm partition name"))
    if not g.providers:
        out.append(Problem(f"{base}.providers", "must name at least one provider profile"))
    for prov in g.providers:
        if prov not in declared:
            out.append(
                Problem(
                    f"{base}.providers",
                    f"no provider profile {prov!r} (defined: {', '.join(cfg.providers) or 'none'})",
                )
            )
    _group_on_providers(cfg, g, base, out)
    if not g.sizes:
        out.append(Problem(f"{base}.sizes", "must list at least one size"))
    if len(set(g.sizes)) != len(g.sizes):
        out.append(Problem(f"{base}.sizes", "lists a size twice"))
    for entry in g.sizes:
        owner, sep, _size = entry.rpartition(":")
        if sep and owner not in g.providers:
            out.append(
                Problem(
                    f"{base}.sizes", f"{entry!r}: {owner!r} is not one of the group's providers"
                )
            )
    if g.sizes and g.providers and not g.candidates():
        out.append(Problem(f"{base}.sizes", "no size is offered on any of the group's providers"))
    for size in g.price_per_hour:
        if size not in g.size_names:
            out.append(Problem(f"{base}.price_per_hour.{size}", "is not one of the group's sizes"))
    for size, price in g.price_per_hour.items():
        _money(price, f"{base}.price_per_hour.{size}", out)
    for size in g.size_names:
        if size not in g.price_per_hour:
            out.append(
                Problem(
                    f"{base}.price_per_hour",
                    f"no price for size {size!r}: its cost will be recorded as 0",
                    severity="warning",
                )
            )
    if not g.image:
        out.append(Problem(f"{base}.image", "must not be empty"))
    if not 1 <= g.cpus <= 65_535:  # Slurm's CPUs= is 16 bits
        out.append(Problem(f"{base}.cpus", "must be between 1 and 65,535"))
    if not 1 <= g.memory_mb <= 2**40:
        out.append(Problem(f"{base}.memory_mb", "must be between 1 and 2**40 (MB)"))
    if not 0 <= g.gpus <= 1024:
        out.append(Problem(f"{base}.gpus", "must be between 0 and 1,024"))
    if g.gpu_type and not g.gpus:
        out.append(Problem(f"{base}.gpu_type", "set, but gpus is 0"))
    if g.gpu_type and not is_feature(g.gpu_type):
        out.append(Problem(f"{base}.gpu_type", "must be letters, digits, '_', '.' or '-'"))
    if g.gpu_files and not is_device_path(g.gpu_files):
        out.append(
            Problem(f"{base}.gpu_files", "must be an absolute device path such as /dev/nvidia[0-3]")
        )
    elif g.gpu_files:
        try:  # File= takes hostlist brackets; '/' is only a path separator here
            count = len(expand(g.gpu_files.replace("/", "_")))
        except HostlistError as exc:
            out.append(Problem(f"{base}.gpu_files", f"bad device list: {exc.message}"))
        else:
            if count != g.gpus:
                out.append(
                    Problem(f"{base}.gpu_files", f"names {count} device(s), gpus is {g.gpus}")
                )
    for key in ("gpu_model", "gpu_driver", "gpu_cuda"):
        if getattr(g, key) and not g.gpus:
            out.append(Problem(f"{base}.{key}", "set, but gpus is 0"))
    if len(g.gpu_model) > 96 or any(not c.isprintable() for c in g.gpu_model):
        out.append(Problem(f"{base}.gpu_model", "must be NVML's name of the model"))
    if g.gpu_driver and not _DRIVER.fullmatch(g.gpu_driver):
        out.append(Problem(f"{base}.gpu_driver", "must be a driver version such as 550.54.15"))
    if g.gpu_cuda and not _CUDA.fullmatch(g.gpu_cuda):
        out.append(Problem(f"{base}.gpu_cuda", "must be a CUDA version such as 12.4"))
    if g.runtime_manifest and not is_path(g.runtime_manifest):
        out.append(Problem(f"{base}.runtime_manifest", "must be an absolute path"))
    if g.runtime_rule not in RULE_NAMES:
        out.append(Problem(f"{base}.runtime_rule", "must be 'exact' or 'compatible'"))
    for feat in g.features:
        if not is_feature(feat):
            out.append(
                Problem(f"{base}.features", f"feature {feat!r} has characters Slurm rejects")
            )


_DRIVER = re.compile(r"[0-9]{1,4}(\.[0-9]{1,4}){1,3}", re.ASCII)
_CUDA = re.compile(r"[0-9]{1,3}\.[0-9]{1,2}", re.ASCII)


def _gpu(cfg: Config, out: list[Problem]) -> None:
    gpu = cfg.gpu
    for key in ("node_python", "health_check_program", "health_check_chain", "kernel_log"):
        path = getattr(gpu, key)
        if path and not is_path(path):
            out.append(Problem(f"gpu.{key}", _PATH_ADVICE))
    if gpu.health_check_chain and not gpu.health_check_program:
        out.append(
            Problem(
                "gpu.health_check_chain",
                "set, but health_check_program is not",
                severity="warning",
            )
        )
    if not 0 <= gpu.health_check_interval <= 86400:
        out.append(Problem("gpu.health_check_interval", "must be between 0 and 86400 seconds"))
    if not 0 <= gpu.telemetry_interval <= 86400:  # NaN fails both comparisons
        out.append(Problem("gpu.telemetry_interval", "must be between 0 and 86400 seconds"))
    if not all(1 <= x <= 9999 for x in gpu.critical_xids):
        out.append(Problem("gpu.critical_xids", "must be XID numbers (1-9999)"))


def _policy(cfg: Config, out: list[Problem]) -> None:
    p = cfg.policy
    checks = [("min_wait", p.min_wait, 0, 30 * 86400), ("wait_factor", p.wait_factor, 0, 1000),
              ("wait_per_dollar", p.wait_per_dollar, 0, 1e9),
              ("max_job_cost", p.max_job_cost, 0, 1e9), ("recheck", p.recheck, 1, 86400),
              ("boot_estimate", p.boot_estimate, 0, 86400), ("interval", p.interval, 1, 3600),
              ("spend_cap", p.spend_cap, 0, 1e12),
              ("burst_share", p.burst_share, 0, 0.99)]  # fmt: skip
    for name in p.groups:
        if name not in cfg.node_groups:
            out.append(Problem("policy.groups", f"no node group {name!r}"))
    if p.enabled and cfg.slurm.backend != "cli":
        out.append(Problem("policy.enabled", 'the burst policy needs slurm.backend = "cli"'))
    if p.enabled and not cfg.slurm.onprem_partitions:
        out.append(Problem("policy.enabled", "needs slurm.onprem_partitions: the jobs it steers"))
    for kind in ("accounts", "qos", "partitions"):
        seen: dict[str, str] = {}
        for name, o in getattr(p, kind).items():
            if not is_name(name):
                out.append(Problem(f"policy.{kind}.{name}", "must be a Slurm name"))
            other = seen.setdefault(name.lower(), name)
            if kind != "partitions" and other != name:
                said = f"is {other} to Slurm, which compares names without regard to case"
                out.append(Problem(f"policy.{kind}.{name}", f"{said}: keep one of them"))
            for key in ("min_wait", "wait_per_dollar", "wait_factor", "max_job_cost",
                        "burst_share"):  # fmt: skip
                value = getattr(o, key)
                if value is not None:
                    low, high = next((lo, hi) for k, _, lo, hi in checks if k == key)
                    checks.append((f"{kind}.{name}.{key}", value, low, high))
    for key, value, low, high in checks:
        if not low <= value <= high:  # NaN fails both
            out.append(Problem(f"policy.{key}", f"must be between {low:g} and {high:g}"))


def _mesh(cfg: Config, out: list[Problem]) -> None:
    net = _network(cfg.mesh.subnet, "mesh.subnet", out)
    if net is not None and net.num_addresses < 4:
        out.append(Problem("mesh.subnet", "is too small for a hub and nodes"))
    if not _IFNAME.fullmatch(cfg.mesh.interface):
        out.append(Problem("mesh.interface", "must be a Linux interface name (1-15 characters)"))
    if not 1 <= cfg.mesh.port <= 65535:
        out.append(Problem("mesh.port", "must be a UDP port (1-65535)"))


def _network(
    text: str, path: str, out: list[Problem]
) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(text)
    except ValueError as exc:
        out.append(Problem(path, f"is not a network: {exc}"))
        return None


FASTEST_BOOT = 60  # seconds: a quick cloud boot, for sizing the bootstrap slots
FASTEST_BOOTSTRAP = 10  # seconds: a quick SSH bootstrap (keys, tunnel, munge, slurmd)


def _join_slots(cfg: Config) -> list[Problem]:
    """The bootstrap slots should let the largest node group join inside Slurm's
    ResumeTimeout at the quickest: a boot of a minute, then its nodes in waves of
    ``bootstrap_slots`` of 10 s each. A warning: a site's images may boot faster."""
    slots = cfg.daemon.bootstrap_slots
    if not cfg.node_groups:
        return []
    group = max(cfg.node_groups.values(), key=lambda g: g.count)
    waves = -(-group.count // slots)
    need = FASTEST_BOOT + waves * FASTEST_BOOTSTRAP
    limit = cfg.slurm.resume_timeout
    if need <= limit:
        return []
    room = (limit - FASTEST_BOOT) // FASTEST_BOOTSTRAP  # waves that fit
    if room < 1:
        return [Problem(
            "slurm.resume_timeout",
            f"{limit} s leaves no time for a bootstrap after a {FASTEST_BOOT} s boot "
            f"(at least {FASTEST_BOOT + FASTEST_BOOTSTRAP} s)",
            severity="warning",
        )]  # fmt: skip
    least = -(-group.count // room)
    return [Problem(
        "daemon.bootstrap_slots",
        f"{slots} slots join node group {group.name}'s {group.count} nodes in {waves} waves: "
        f"{need} s at the quickest (a {FASTEST_BOOT} s boot, {FASTEST_BOOTSTRAP} s a "
        f"bootstrap), past slurm.resume_timeout {limit} s; "
        f"use at least {least}",
        severity="warning",
    )]  # fmt: skip
