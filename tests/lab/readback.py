"""Reading back, through scontrol, what slurmctld made of a rendered fragment: the lab's
own slurmctld (tests/lab/test_lab.py) and each other release's (test_slurm_versions.py)."""

from __future__ import annotations

from collections.abc import Callable

from slurm_burst.config import Config
from slurm_burst.core.hostlist import expand


def _minutes(limit: str) -> int | None:
    """A Slurm time limit in minutes, as the config writes it or scontrol prints it."""
    if limit.upper() in ("INFINITE", "UNLIMITED"):
        return None
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:  # D-HH[:MM[:SS]]
        h, m, s = [*parts, 0, 0][:3]
    elif len(parts) == 1:  # MM
        h, m, s = 0, parts[0], 0
    elif len(parts) == 2:  # MM:SS
        h, m, s = 0, parts[0], parts[1]
    else:  # HH:MM:SS
        h, m, s = parts
    return (int(days or 0) * 24 + h) * 60 + m + (1 if s else 0)


def _fields(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


def check_read_back(cfg: Config, scontrol: Callable[[list[str]], str]) -> None:
    """What slurmctld (``scontrol ARGV`` answers) made of the rendered fragment is what
    the config means: each burst partition's nodes, time limit, SuspendTime and denied
    accounts, each node group's CPUs, memory, features and GRES."""
    denied = sorted(a for a, o in cfg.policy.accounts.items() if o.onprem_only)
    for part in cfg.burst_partitions():
        shown = _fields(scontrol(["scontrol", "-o", "show", "partition", part]))
        pcfg = cfg.partitions[part]
        groups = [g for g in cfg.node_groups.values() if g.partition == part]
        # a dynamic group by its NodeSet (NodeSets=; Nodes= then lists what it holds)
        declared = ",".join(g.hostlist for g in groups if not g.dynamic)
        nodesets = ",".join(g.nodeset for g in groups if g.dynamic)
        assert shown.get("NodeSets", "(null)") == (nodesets or "(null)"), shown
        # Nodes= lists the declared nodes and those the daemon has made so far
        listed = set(expand(shown["Nodes"])) if shown["Nodes"] != "(null)" else set()
        dynamic = {n for g in groups if g.dynamic for n in g.node_names()}
        assert listed - dynamic == (set(expand(declared)) if declared else set()), shown
        assert _minutes(shown["MaxTime"]) == _minutes(pcfg.max_time), (part, shown["MaxTime"])
        assert shown["SuspendTime"] == str(pcfg.suspend_time), shown
        assert shown["DenyAccounts"] == ",".join(denied), shown
    for g in cfg.node_groups.values():
        if g.dynamic:  # no node until the daemon makes one (test_slurm_versions makes them)
            continue
        node = g.node_name(1)
        shown = _fields(scontrol(["scontrol", "-o", "show", "node", node]))
        assert (shown["CPUTot"], shown["RealMemory"]) == (str(g.cpus), str(g.memory_mb)), shown
        assert shown["AvailableFeatures"] == ",".join(g.features), shown
        gres = f"gpu:{g.gpu_type}:{g.gpus}" if g.gpu_type else f"gpu:{g.gpus}"
        assert shown["Gres"] == (gres if g.gpus else "(null)"), shown
    assert _minutes("2-12:30:00") == 3630 and _minutes("90") == 90 and _minutes("01:30:00") == 90
