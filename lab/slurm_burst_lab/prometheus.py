"""The lab's Prometheus: Debian's ``prometheus`` scraping the daemon every second and
evaluating the alert rules the project ships, with their ``for:`` windows cut to
seconds so a lab test sees an alert go pending, fire and resolve within a fault case
(``promtool test rules`` checks the shipped windows)."""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from pathlib import Path
from typing import Any

from slurm_burst.config import Config
from slurm_burst_lab.config import settings

RULES = Path(__file__).resolve().parents[2] / "slurm-conf" / "prometheus" / "slurm-burst.rules.yml"
LAB_FOR = "2s"
SCRAPE_JOB = "slurm-burst"  # the job name the shipped rules select
SLURMCTLD_PORT = 6817  # the lab's slurm.conf.in
FOR_LINE = re.compile(r"^(\s+for:\s*)\S+\s*$", re.M)


def lab_rules(shipped: str) -> str:
    """The shipped rules with every ``for:`` set to LAB_FOR (nothing else changes)."""
    return FOR_LINE.sub(lambda m: m.group(1) + LAB_FOR, shipped)


# slurmctld's own endpoints (slurm.metrics, 25.11+): one job each (a job has one path)
SLURMCTLD_PATHS = ("jobs", "nodes", "partitions", "scheduler")
SLURMCTLD_JOB = "slurmctld"  # its jobs are slurmctld-<path>, as a site names them


def config_text(cfg: Config, rules: Path, slurmctld: str = "") -> str:
    """prometheus.yml: the daemon's /metrics every second; with ``slurmctld`` (its
    host:port, where slurm.metrics serves them) slurmctld's own endpoints too."""
    jobs: list[dict[str, Any]] = [
        {"job_name": SCRAPE_JOB, "static_configs": [{"targets": [cfg.daemon.metrics_listen]}]}
    ]
    if slurmctld and cfg.slurm.metrics != "off":
        jobs += [
            {
                "job_name": f"{SLURMCTLD_JOB}-{path}",
                "metrics_path": f"/metrics/{path}",
                "static_configs": [{"targets": [slurmctld]}],
            }
            for path in SLURMCTLD_PATHS
        ]
    conf = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": jobs,
    }
    return json.dumps(conf, indent=2) + "\n"  # JSON is YAML


def argv(cfg: Config, state: Path) -> list[str]:
    """The command line, after writing its configuration and rules under ``state``."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise FileNotFoundError(
            "lab.prometheus is set but the prometheus program is not installed "
            "(make setup installs Debian's package)"
        )
    state.mkdir(parents=True, exist_ok=True)
    rules = state / "slurm-burst.rules.yml"
    rules.write_text(lab_rules(RULES.read_text()))
    conf = state / "prometheus.yml"
    conf.write_text(config_text(cfg, rules, f"{cfg.cluster.controller_addr}:{SLURMCTLD_PORT}"))
    return [
        binary,
        f"--config.file={conf}",
        f"--storage.tsdb.path={state / 'data'}",
        "--storage.tsdb.retention.time=1d",
        f"--web.listen-address={settings(cfg).prometheus}",
    ]


def api(listen: str, path: str, timeout: float = 10.0) -> Any:
    """GET ``/api/v1/<path>`` of the Prometheus at ``listen``; its ``data``."""
    with urllib.request.urlopen(f"http://{listen}/api/v1/{path}", timeout=timeout) as r:
        body = json.loads(r.read())
    if body.get("status") != "success":
        raise ValueError(f"Prometheus said {body.get('errorType')}: {body.get('error')}")
    return body["data"]


def ready(listen: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{listen}/-/ready", timeout=5) as r:
            return bool(r.status == 200)
    except OSError:
        return False
