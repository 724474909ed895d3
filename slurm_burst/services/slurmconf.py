"""Render the slurm.conf ``Include`` fragment and gres.conf from the configuration.

The templates live in ``slurm-conf/templates`` (installed under
``share/slurm-burst``); the lines that depend on node groups are built here.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from string import Template

from slurm_burst.config import Config, NodeGroup
from slurm_burst.config.validate import dynamic_refusal, metrics_refusal
from slurm_burst.core.errors import BadInput
from slurm_burst.core.hostlist import compress
from slurm_burst.core.pricing import billing_weight
from slurm_burst.core.slurm import SUPPORTED_RELEASES, release_key
from slurm_burst.core.slurmsyntax import SlurmSyntaxError, comment, tokenize, word
from slurm_burst.fileio import write_atomic
from slurm_burst.services import burstbuffer as bb
from slurm_burst.services.burstbuffer import BB_CONF, BB_KEYS, BB_LUA
from slurm_burst.services.prolog import prolog_epilog_timeout

FRAGMENT = "slurm-burst.conf"
GRES = "gres.conf"


def template_dir() -> Path:
    """Templates from the source tree, else from the installed share directory."""
    here = Path(__file__).resolve().parents[2] / "slurm-conf" / "templates"
    if here.is_dir():
        return here
    return Path(sys.prefix) / "share" / "slurm-burst" / "templates"


class RenderError(BadInput, ValueError):
    """The config holds a value that would not reach Slurm as meant: nothing is written."""

    code = "RenderRefused"


def line(*pairs: tuple[str, object]) -> str:
    """One slurm.conf line of ``Key=Value`` pairs, each value checked to be one bare word
    that Slurm reads back as it is (:func:`~slurm_burst.core.slurmsyntax.word`)."""
    return " ".join(f"{key}={word(value, key)}" for key, value in pairs)


def node_settings(g: NodeGroup) -> list[tuple[str, object]]:
    """The settings of a NodeName line of group ``g`` after the name: slurm.conf's for a
    declared group, ``scontrol create``'s for a dynamic one (its NodeSet's feature too)."""
    pairs: list[tuple[str, object]] = [
        ("State", "CLOUD"), ("CPUs", g.cpus), ("RealMemory", g.memory_mb),
    ]  # fmt: skip
    features = [*g.features, g.nodeset] if g.dynamic else list(g.features)
    if features:
        pairs.append(("Features", ",".join(features)))
    if g.gpus:
        pairs.append(("Gres", f"gpu:{g.gpu_type}:{g.gpus}" if g.gpu_type else f"gpu:{g.gpus}"))
    return pairs


def dynamic_slurmd_args(g: NodeGroup) -> tuple[str, ...]:
    """slurmd's flags on a node of dynamic group ``g`` (none for a declared group): ``-Z``
    and ``--conf`` with the settings ``scontrol create`` gave the node. Without them a
    slurmd whose name is in no slurm.conf line exits at once ("Unable to find node
    record", ``_read_config`` in slurmd.c); with them it builds its own record and
    registers as the node slurmctld holds (``_slurm_rpc_node_registration``: an
    existing name is validated as any node's registration)."""
    if not g.dynamic:
        return ()
    return ("-Z", "--conf", line(*(pair for pair in node_settings(g) if pair[0] != "State")))


def node_line(g: NodeGroup) -> str:
    head = comment(f"# node group {g.name}: sizes {', '.join(g.sizes)}")
    if g.dynamic:  # its nodes are made at run time (services/groups.py): the set is named
        return (
            f"{head}; dynamic: up to {g.limit} nodes {comment(g.hostlist)} created by the "
            f"daemon with the feature {g.nodeset}\n"
            + line(("NodeSet", g.nodeset), ("Feature", g.nodeset))
        )
    return head + "\n" + line(("NodeName", g.hostlist), *node_settings(g))


def gres_line(g: NodeGroup) -> str:
    type_ = [("Type", g.gpu_type)] if g.gpu_type else []
    return line(("NodeName", g.hostlist), ("Name", "gpu"), *type_, ("File", g.gres_files))


def partition_lines(cfg: Config) -> list[str]:
    lines = []
    for part in cfg.burst_partitions():
        groups = [g for g in cfg.node_groups.values() if g.partition == part]
        names = [n for g in groups if not g.dynamic for n in g.node_names()]
        nodes = ",".join(
            ([compress(names)] if names else []) + [g.nodeset for g in groups if g.dynamic]
        )
        pcfg = cfg.partitions.get(part)
        suspend = (
            pcfg.suspend_time if pcfg and pcfg.suspend_time is not None else cfg.slurm.suspend_time
        )
        fields: list[tuple[str, object]] = [
            ("PartitionName", part),
            ("Nodes", nodes),
            ("MaxTime", pcfg.max_time if pcfg else "INFINITE"),
            ("Default", "YES" if pcfg and pcfg.default else "NO"),
            ("SuspendTime", suspend),
            ("State", "UP"),
        ]
        weights = billing_weights(cfg, part) if cfg.ledger.billing_weights else ""
        if weights:
            fields.append(("TRESBillingWeights", weights))
        fields += onprem_only_denials(cfg)
        lines.append(line(*fields))
    return lines


def onprem_only_denials(cfg: Config) -> list[tuple[str, str]]:
    """What keeps on-prem-only accounts and QOS off every burst partition, enforced by
    Slurm itself (not only by the policy's judgement): a job of theirs submitted there,
    alone or in a partition list, cannot run there."""
    accounts, qos = cfg.policy.onprem_only()
    return [
        *([("DenyAccounts", ",".join(accounts))] if accounts else []),
        *([("DenyQos", ",".join(qos))] if qos else []),
    ]


def billing_weights(cfg: Config, partition: str, at: datetime | None = None) -> str:
    """TRESBillingWeights making a job's billing TRES its cost in micro-dollars per minute.

    CPU partitions bill per CPU, GPU partitions per GPU (as the ledger allocates);
    with node groups of different prices in one partition, the dearest wins. The
    price is the general rate in force at ``at`` (now): re-render after a change.
    """
    at = at or datetime.now(UTC)
    groups = [g for g in cfg.node_groups.values() if g.partition == partition]
    gpu = any(g.gpus for g in groups)
    best = 0
    for g in groups:
        price = cfg.rate_table.price(g.size_names[0], g.gpus, at) if g.sizes else None
        if price is None:
            continue
        units = g.gpus if gpu else g.cpus
        if units:
            best = max(best, billing_weight(price.micros_per_hour, units))
    if not best:
        return ""
    return f"GRES/gpu={best}" if gpu else f"CPU={best}"


def release_settings(release: str) -> dict[str, str]:
    """What differs by Slurm release in the fragment. 23.11 made ``cloud_reg_addrs``
    the behaviour and ``NoAddrCache`` the default, and 24.11 refuses both as defunct
    (an ``error:`` line at every start); 22.05 needs them."""
    if release not in SUPPORTED_RELEASES:
        raise ValueError(
            f"Slurm {release} is not one slurm-burst supports ({', '.join(SUPPORTED_RELEASES)})"
        )
    old = release_key(release) < (23, 11)
    params = ["enable_configless", "idle_on_node_suspend"] + (["cloud_reg_addrs"] if old else [])
    return {
        "release": release,
        "ctld_params": ",".join(params),
        "comm_params": "CommunicationParameters=NoAddrCache" if old else "",
    }


def enforce_lines(cfg: Config) -> str:
    """EnforcePartLimits=ANY when accounts or QOS are on-prem only: Slurm then refuses at
    submission a job that no partition of its list admits (``sbatch -A medgen -p
    burst-cpu``), while one that lists an on-prem partition too is taken and runs there.
    Without it Slurm takes the job and leaves it pending for ever."""
    if not onprem_only_denials(cfg):
        return "# EnforcePartLimits: the site's own (no on-prem-only account or QOS)"
    return (
        "# On-prem-only accounts or QOS are denied the burst partitions below: refuse at\n"
        "# submission a job no partition of its list admits. This fragment then owns\n"
        "# EnforcePartLimits (ANY; ALL would refuse -p onprem,burst too).\n"
        "EnforcePartLimits=ANY"
    )


def health_check_lines(cfg: Config) -> str:
    """HealthCheckProgram when the GPU check serves as it (``gpu.health_check_program``)."""
    gpu = cfg.gpu
    if not gpu.health_check_program:
        return "# HealthCheckProgram: the site's own (gpu.health_check_program is not set)"
    chain = (
        f"{comment(gpu.health_check_chain)} runs first there"
        if gpu.health_check_chain
        else "no site program chained"
    )
    return (
        f"# The GPU check on burst nodes ({chain}). Slurm runs one program on every\n"
        "# node: the others need one at this path too (docs/gpu.md). This fragment then\n"
        "# owns HealthCheckProgram, HealthCheckInterval and HealthCheckNodeState.\n"
        + line(("HealthCheckProgram", gpu.health_check_program))
        + "\n"
        + line(("HealthCheckInterval", gpu.health_check_interval))
        + "\nHealthCheckNodeState=ANY"
    )


def render(cfg: Config, release: str, kept_paths: Sequence[str] | None = None) -> dict[str, str]:
    """``{"slurm-burst.conf": ..., "gres.conf": ...}`` for ``cfg``, in what Slurm
    ``release`` (e.g. "24.11") accepts. ``kept_paths``: every spelling of
    staging.onprem_only_paths on this host, for burst_buffer.lua (``wiring.storage.kept_paths``;
    the configured paths if None).

    Every value goes in as one word Slurm reads back unchanged, and the result is read
    back with Slurm's own line syntax before it is returned (:func:`check_rendered`):
    RenderError, and nothing to write, when a value would change a line's meaning."""
    try:
        files = _render(cfg, release, kept_paths)
        for name, text in files.items():
            if name != BB_LUA:  # Lua, built of escaped literals (services/burstbuffer.py)
                check_rendered(name, text)
    except SlurmSyntaxError as exc:
        raise RenderError(f"{cfg.source}: not rendered: {exc}") from None
    return files


# The settings each file may hold, and those that may appear once only (the others head
# one line each: NodeName=, PartitionName=). Anything else read back is an injection.
FRAGMENT_KEYS = frozenset({
    "ResumeProgram", "SuspendProgram", "ResumeFailProgram", "PrologSlurmctld",
    "PrologEpilogTimeout", "ResumeTimeout", "SuspendTimeout", "SuspendTime", "ResumeRate",
    "SuspendRate", "SuspendExcParts", "SuspendExcNodes", "SlurmctldParameters",
    "PrivateData", "TreeWidth", "CommunicationParameters", "GresTypes",
    "HealthCheckProgram", "HealthCheckInterval", "HealthCheckNodeState", "EnforcePartLimits",
    "BurstBufferType", "MaxNodeCount", "MetricsType", "MetricsParameters", "MetricsAuthUsers",
})  # fmt: skip
NODE_KEYS = frozenset({"NodeName", "State", "CPUs", "RealMemory", "Features", "Gres"})
PARTITION_KEYS = frozenset({"PartitionName", "Nodes", "MaxTime", "Default", "SuspendTime",
                            "State", "TRESBillingWeights", "DenyAccounts", "DenyQos"})  # fmt: skip
NODESET_KEYS = frozenset({"NodeSet", "Feature"})
GRES_KEYS = frozenset({"NodeName", "Name", "Type", "File"})


def check_rendered(name: str, text: str) -> None:
    """Read ``text`` back as Slurm would; SlurmSyntaxError unless every line is one we
    write: a global setting once, a NodeName= or PartitionName= line with its own keys."""
    seen: set[str] = set()
    for settings in tokenize(text):
        head = settings[0].key
        keys = [st.key for st in settings]
        if name == GRES:
            allowed = GRES_KEYS if head == "NodeName" else frozenset()
        elif name == BB_CONF:
            allowed = BB_KEYS if len(settings) == 1 and head not in seen else frozenset()
            seen.add(head)
        elif head == "NodeName":
            allowed = NODE_KEYS
        elif head == "PartitionName":
            allowed = PARTITION_KEYS
        elif head == "NodeSet":
            allowed = NODESET_KEYS
        else:
            allowed = FRAGMENT_KEYS if len(settings) == 1 and head not in seen else frozenset()
            seen.add(head)
        stray = [k for k in keys if k not in allowed] or [k for k in keys if keys.count(k) > 1]
        if stray or any(st.op for st in settings):
            raise SlurmSyntaxError(
                f"{name} line {settings[0].line} would set {stray[0] if stray else head} "
                "as slurm-burst does not"
            )


def dynamic_lines(cfg: Config, release: str) -> str:
    """MaxNodeCount (room for the dynamic groups' nodes), or why none is written;
    RenderError for a dynamic group on a release before 23.11."""
    dynamic = [g.name for g in cfg.node_groups.values() if g.dynamic]
    refused = dynamic_refusal(cfg, release)
    if refused:
        raise RenderError(f"{cfg.source}: {refused}")
    n = cfg.slurm.max_node_count
    if not n:
        return "# MaxNodeCount: the site's own (no dynamic node group)"
    return (
        "# Room for the nodes the daemon creates (dynamic node groups: "
        f"{', '.join(dynamic) or 'none'}); the site's and ours together\n"
        + line(("MaxNodeCount", n))
    )


def metrics_lines(cfg: Config, release: str) -> str:
    """slurmctld's own OpenMetrics as slurm.metrics says; RenderError where the release
    cannot serve them so."""
    refused = metrics_refusal(cfg, release)
    if refused:
        raise RenderError(f"{cfg.source}: {refused}")
    s = cfg.slurm
    if s.metrics == "off":
        return "# slurmctld's OpenMetrics: off (slurm.metrics)"
    head = (
        "# slurmctld's own OpenMetrics (/metrics/jobs, /nodes, /partitions, /scheduler) on\n"
        "# SlurmctldPort, beside the daemon's: "
    )
    if s.metrics == "open":
        return (
            head + "served to whoever reaches that port, cloud nodes\n"
            "# included (PrivateData=cloud above would restrict them): slurm.metrics = 'open'\n"
            "MetricsType=metrics/openmetrics\nMetricsParameters=ignore_private_data"
        )
    return (
        head + "root, SlurmUser and these users only, each scrape\n"
        "# with a JWT (the site's auth/jwt set-up): slurm.metrics = 'users'\n"
        "MetricsType=metrics/openmetrics\n" + line(("MetricsAuthUsers", ",".join(s.metrics_users)))
    )


def _render(cfg: Config, release: str, kept_paths: Sequence[str] | None) -> dict[str, str]:
    tdir = template_dir()
    rel = release_settings(release)
    s = cfg.slurm
    exc = (
        line(("SuspendExcParts", ",".join(s.onprem_partitions)))
        if s.onprem_partitions
        else "# no on-prem partitions listed: set slurm.onprem_partitions, or every node "
        "with SuspendTime may be powered down"
    )
    warm = [n for g in cfg.node_groups.values() for n in g.warm_pool()]
    if warm:  # the daemon powers them up and down by schedule (services/warmpool.py)
        exc += (
            "\n# Warm pools (node_groups.*.warm): Slurm never powers them down; the daemon "
            f"does, by schedule\n{line(('SuspendExcNodes', compress(warm)))}"
        )
    fragment = Template((tdir / "slurm-burst.conf.in").read_text()).substitute(
        source=comment(cfg.source),
        conf_dir=comment(s.conf_dir),
        hook_dir=word(s.hook_dir, "slurm.hook_dir"),
        resume_timeout=s.resume_timeout,
        prolog_epilog_timeout=prolog_epilog_timeout(cfg),
        suspend_timeout=s.suspend_timeout,
        suspend_time=s.suspend_time,
        resume_rate=s.resume_rate,
        suspend_rate=s.suspend_rate,
        release=rel["release"],
        ctld_params=f"{rel['ctld_params']},power_save_interval={s.power_save_interval},"
        "power_save_min_interval=0",
        comm_params=rel["comm_params"],
        suspend_exc_parts=exc,
        node_lines="\n".join(node_line(g) for g in cfg.node_groups.values()),
        dynamic=dynamic_lines(cfg, release),
        metrics=metrics_lines(cfg, release),
        partition_lines="\n".join(partition_lines(cfg)),
        health_check=health_check_lines(cfg),
        enforce=enforce_lines(cfg),
        burst_buffer=(
            "# Stage-in (#BB_LUA stage_in): burst_buffer.conf and burst_buffer.lua beside this\n"
            "# file. Slurm takes one BurstBufferType: docs/staging.md says what a site that\n"
            "# has its own does.\nBurstBufferType=burst_buffer/lua"
            if bb.enabled(cfg)
            else "# no stage-in: staging.store is not set (BurstBufferType left to the site)"
        ),
    )
    gpu_groups = [g for g in cfg.node_groups.values() if g.gpus]
    gres = Template((tdir / "gres.conf.in").read_text()).substitute(
        source=comment(cfg.source),
        gres_lines="\n".join(gres_line(g) for g in gpu_groups) or "# no GPU node groups",
    )
    files = {FRAGMENT: fragment, GRES: gres}
    if bb.enabled(cfg):
        files[BB_CONF] = bb.render_conf(cfg, release)
        template = (tdir / "burst_buffer.lua.in").read_text()
        files[BB_LUA] = bb.render_lua(cfg, template, kept_paths)
    return files


HOOKS = {
    "resume": "slurm-burst-resume",
    "suspend": "slurm-burst-suspend",
    "resume-fail": "slurm-burst-resume-fail",
    "prolog-slurmctld": "slurm-burst-prolog-slurmctld",
    "stage-in": bb.STAGE_IN_PROGRAM,  # burst_buffer.lua's data_in runs it
}

_SHIM = """#!{python}
# slurm-burst {kind} program, installed by `slurm-burst conf install-hooks`.
# slurmctld runs it as SlurmUser with a minimal environment, so the config path is
# fixed here. Node names arrive as one argv element and are never given to a shell.
import sys

from slurm_burst.cli.main import cli

cli(["--config", {config!r}, {kind!r}, *sys.argv[1:]], prog_name="slurm-burst")
"""


def hook_programs(config_path: str, python: str = sys.executable) -> dict[str, str]:
    """``{file name: program text}`` of the programs slurm.conf names: the three
    power-saving hooks and the PrologSlurmctld."""
    return {
        name: _SHIM.format(python=python, kind=kind, config=str(config_path))
        for kind, name in HOOKS.items()
    }


def install_hooks(hook_dir: str, config_path: str) -> list[Path]:
    """Write the hook programs and the prolog into ``hook_dir`` (each atomically, 0755)."""
    return write_files(Path(hook_dir), hook_programs(config_path), 0o755)


def write_files(directory: Path, files: dict[str, str], mode: int) -> list[Path]:
    """Write each file into ``directory`` (made if missing) under a fresh temporary name,
    renamed into place: a planted symlink is replaced, never written through."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in files.items():
        with write_atomic(directory / name, mode) as fh:
            fh.write(text)
        out.append(directory / name)
    return out
