"""The lab's real Prometheus (Debian's package) scraping the daemon: every query of the
shipped dashboard runs against it without error, the ones a burst feeds return data,
and its group variable resolves through the label API. (The alerts firing and resolving
are asserted where their faults are injected: tests/lab/test_y_faults.py.)"""

from __future__ import annotations

import json
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from slurm_burst_lab import slurmfeatures
from slurm_burst_lab.config import settings
from slurm_burst_lab.prometheus import api
from slurm_burst_lab.service import Lab

from slurm_burst.config import Config
from tests.conftest import wait
from tests.lab.conftest import RELEASE, await_alert, sh

DASHBOARD = Path(__file__).resolve().parents[2] / "slurm-conf" / "grafana" / "slurm-burst.json"

# Grafana's own variables, as Grafana would substitute them before asking Prometheus
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "15s",
                     "$group": ".*"}  # fmt: skip

# panels a one-node burst job must feed (title -> at least one series)
FED = (
    "Leading daemons",
    "Since the last reconcile pass",
    "Cloud nodes by state, per group",
    "On-prem vs cloud nodes busy",
    "Resume request to joined, percentiles",
    "Launch and bootstrap steps, p90",
)


@pytest.fixture(scope="module")
def prom(lab: Lab, lab_config: Config) -> str:
    assert settings(lab_config).prometheus
    return settings(lab_config).prometheus


def query(prom: str, expr: str) -> list[dict[str, Any]]:
    data = api(prom, "query?" + urllib.parse.urlencode({"query": expr}))
    result = data["result"]
    return result if isinstance(result, list) else [{"value": result}]


def substituted(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable left in {expr!r}"
    return expr


def test_prometheus_scrapes_the_daemon(prom: str) -> None:
    up = wait(lambda: query(prom, 'up{job="slurm-burst"} == 1'), 30, "the daemon scraped")
    assert len(up) == 1
    rules = api(prom, "rules")["groups"]
    assert {r["name"] for g in rules for r in g["rules"]} >= {"SlurmBurstGroupProtected",
                                                            "SlurmBurstNoLeader"}  # fmt: skip


def test_every_dashboard_query_runs_and_a_burst_feeds_its_panels(
    prom: str, lab: Lab, env: dict[str, str]
) -> None:
    out = sh(env, "sbatch", "--parsable", "-p", "burst-cpu", "-t", "2", "-o", "/dev/null",
             "--wrap", "hostname")  # fmt: skip
    job = out.strip().split(";")[0]
    wait(lambda: "COMPLETED" in sh(env, "sacct", "-n", "-X", "-j", job, "-o", "State"), 180,
         f"burst job {job} completed")  # fmt: skip
    joined = 'sum(slurm_burst_node_join_duration_seconds_count{job="slurm-burst"}) > 0'
    wait(lambda: query(prom, joined), 30, "the join histogram scraped")
    time.sleep(2)  # one more scrape: rate() over it needs two samples after the join

    dashboard = json.loads(DASHBOARD.read_text())
    empty = []
    for panel in dashboard["panels"]:
        results = [query(prom, substituted(t["expr"])) for t in panel["targets"]]
        if panel["title"] in FED and not any(results):
            empty.append(panel["title"])
    assert empty == [], f"panels with no data after a burst: {empty}"
    leaders = query(prom, substituted(dashboard["panels"][0]["targets"][0]["expr"]))
    assert float(leaders[0]["value"][1]) == 1  # one daemon leads


def test_the_group_variable_resolves_through_the_label_api(prom: str, lab_config: Config) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    var = next(v for v in dashboard["templating"]["list"] if v["name"] == "group")
    metric, label = (
        var["definition"].removeprefix("label_values(").removesuffix(")").rsplit(", ", 1)
    )
    values = api(prom, f"label/{label}/values?" + urllib.parse.urlencode({"match[]": metric}))
    assert set(values) == set(lab_config.node_groups)


SLURM_PANELS = (
    "Pending jobs by partition (slurmctld)",
    "Burst partitions' nodes by state (slurmctld)",
)


@pytest.mark.skipif(
    not slurmfeatures.metrics(RELEASE),
    reason=f"slurmctld serves OpenMetrics from 25.11 (the lab runs {RELEASE}): its series "
    "are scraped on 26.05 (make test's share)",
)
def test_slurmctlds_own_series_feed_the_slurm_panels_and_the_down_alert(
    prom: str, lab: Lab, lab_config: Config, env: dict[str, str]
) -> None:
    """On 26.05 the lab's Prometheus scrapes slurmctld's four endpoints (slurm.metrics =
    'open'); a held job in a burst partition shows in the pending panel as a burst
    partition's, the nodes panel has the burst nodes, and a burst node set DOWN by hand
    fires SlurmBurstPartitionNodesDown for its partition until it is back."""
    up = 'up{job=~"slurmctld-.*"} == 1'
    wait(lambda: len(query(prom, up)) == 4 or None, 60, "slurmctld's four endpoints scraped")
    job = sh(env, "sbatch", "--parsable", "--hold", "-p", "burst-cpu", "-t", "1",
             "-o", "/dev/null", "--wrap", "true").strip().split(";")[0]  # fmt: skip
    node = "burst-cpu-32"
    try:
        panels = {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}
        pending = substituted(panels[SLURM_PANELS[0]]["targets"][0]["expr"])

        def burst_cpu_pending() -> list[dict[str, Any]]:
            found = query(prom, pending)
            return [r for r in found if r["metric"].get("partition") == "burst-cpu"
                    and float(r["value"][1]) >= 1]  # fmt: skip

        wait(burst_cpu_pending, 30, "the held job in the pending panel's burst series")
        nodes = [query(prom, substituted(t["expr"])) for t in panels[SLURM_PANELS[1]]["targets"]]
        assert any(float(r["value"][1]) > 0 for rs in nodes for r in rs), nodes
        sh(env, "scontrol", "update", f"nodename={node}", "state=down", "reason=observability test")
        await_alert(lab_config, "SlurmBurstPartitionNodesDown", True, partition="burst-cpu")
    finally:
        sh(env, "scancel", job, check=False)
        sh(env, "scontrol", "update", f"nodename={node}", "state=resume", check=False)
        sh(env, "scontrol", "update", f"nodename={node}", "state=power_down_force", check=False)
    await_alert(lab_config, "SlurmBurstPartitionNodesDown", False, partition="burst-cpu")
