"""Slurm's own cloud features in the lab, by release (issue 55):

- from 23.11, a dynamic node group: group ``dyn``, partition ``burst-dyn``, whose nodes
  are in no slurm.conf line: the daemon creates them in slurmctld (``nodes =
  "dynamic"``, docs/configuration.md);
- from 25.11, slurmctld's own OpenMetrics (``slurm.metrics = "open"``), which the lab's
  Prometheus scrapes beside the daemon (``lab.prometheus``).

A drop-in of the lab's config, written by ``lab up`` on a release that has them and
removed on any other and by ``lab down``: 22.05's lab (the suite's, the demo's) stays as
it was, and ``conf render`` on 22.05 would refuse both.
"""

from __future__ import annotations

from pathlib import Path

from slurm_burst.config import Config
from slurm_burst.config.validate import DYNAMIC_SINCE, METRICS_SINCE
from slurm_burst.core.slurm import release_key
from slurm_burst_lab.components import onprem_names
from slurm_burst_lab.config import remove_dropin, settings, write_dropin

DROPIN = "50-lab-slurm-features.toml"
GROUP = "dyn"
PARTITION = "burst-dyn"
COUNT = 4  # names burst-dyn-[1-4]
MAX_NODES = 2  # made in slurmctld


def wanted(release: str) -> bool:
    """The release has dynamic nodes (and so the drop-in is written)."""
    return release_key(release) >= DYNAMIC_SINCE


def metrics(release: str) -> bool:
    """The release's slurmctld serves OpenMetrics."""
    return release_key(release) >= METRICS_SINCE["open"]


def group_toml(
    count: int = COUNT, max_nodes: int = MAX_NODES, pattern: str = "burst-dyn-{n}"
) -> str:
    """The lab's dynamic group as config TOML (its partition's SuspendTime 15 s); the
    tests and the benchmark make theirs of other sizes with it."""
    return (
        f'[node_groups.{GROUP}]\npattern = "{pattern}"\ncount = {count}\n'
        f'max_nodes = {max_nodes}\nnodes = "dynamic"\npartition = "{PARTITION}"\n'
        'providers = ["lab"]\nsizes = ["ns.cpu2"]\nimage = "host"\ncpus = 2\n'
        'memory_mb = 1000\nfeatures = ["cloud", "cpu"]\n'
        'price_per_hour = { "ns.cpu2" = 0.085 }\n\n'
        f'[partitions.{PARTITION}]\nsuspend_time = 15\nmax_time = "1:00:00"\n'
    )


def enable(cfg: Config, release: str) -> Path:
    """Write the drop-in; MaxNodeCount leaves room for every name of the group."""
    declared = sum(g.count for g in cfg.node_groups.values() if not g.dynamic)
    room = len(onprem_names(settings(cfg))) + declared + COUNT
    body = (
        "# written by 'lab up' on Slurm 23.11+ (lab/slurm_burst_lab/slurmfeatures.py), removed\n"
        "# by 'lab down': a node group whose nodes the daemon creates in slurmctld, and\n"
        "# from 25.11 slurmctld's own metrics\n"
        f"[slurm]\nmax_node_count = {room}\n"
        + ('metrics = "open"\n' if metrics(release) else "")
        + "\n"
        + group_toml()
    )
    return write_dropin(Path(cfg.source), DROPIN, body)


def disable(config: Path) -> bool:
    """The drop-in removed (True), if there was one."""
    return remove_dropin(config, DROPIN)
