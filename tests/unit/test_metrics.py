"""The daemon's metrics: bounded series whatever the fleet's size, and what the new
port methods export (read back from the exposition text, as Prometheus reads it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from prometheus_client.exposition import generate_latest

from slurm_burst.adapters.metrics.prom import OTHER_ACCOUNTS, Metrics
from slurm_burst.core.nodestate import NodeState, Want
from slurm_burst.core.reconcile import findings
from slurm_burst.core.records import NodeRecord
from slurm_burst.core.slurm import SlurmNode, node_activity

ROOT = Path(__file__).resolve().parents[2]


def sample(m: Metrics, name: str, **labels: str) -> float | None:
    """The value of series ``name{labels}`` in a scrape, None if it is not there."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in generate_latest(m.registry).decode().splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        head, _, rest = key.partition("{")
        got = ",".join(sorted(rest.rstrip("}").split(","))) if rest else ""
        if head == name and got == want:
            return float(value)
    return None


def test_the_series_are_as_many_at_2000_nodes_as_at_20000_and_at_most_5000() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "metrics.py"), "--series"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    counts = json.loads(out.stdout)
    assert counts["2000"] == counts["20000"] <= 5000, counts
    assert counts["2000"] > 500  # the synthetic state reached every family


def test_spend_keeps_the_biggest_spenders_and_sums_the_rest() -> None:
    m = Metrics(max_accounts=2)
    m.spent({("a", "cpu"): 5.0, ("b", "cpu"): 3.0, ("b", "gpu"): 4.0, ("c", "gpu"): 1.0,
             ("d", "gpu"): 2.0})  # fmt: skip
    assert sample(m, "slurm_burst_cloud_spend_dollars_total", account="b", group="gpu") == 4.0
    assert sample(m, "slurm_burst_cloud_spend_dollars_total", account="a", group="cpu") == 5.0
    assert sample(m, "slurm_burst_cloud_spend_dollars_total", account="c", group="gpu") is None
    other = sample(m, "slurm_burst_cloud_spend_dollars_total", account=OTHER_ACCOUNTS, group="gpu")
    assert other == 3.0


def test_budgets_are_replaced_whole() -> None:
    m = Metrics()
    m.budgets({"physics": (100.0, 40.0, 55.0), "chemistry": (10.0, 1.0, 9.0)}, 1.8e9)
    m.budgets({"physics": (100.0, 41.0, 54.0)}, 1.8e9)
    assert sample(m, "slurm_burst_budget_remaining_dollars", account="physics") == 54.0
    assert sample(m, "slurm_burst_budget_dollars", account="chemistry") is None
    assert sample(m, "slurm_burst_budget_period_end_timestamp_seconds") == 1.8e9


def test_findings_count_each_kind_and_age_the_oldest_resume() -> None:
    now = 1000.0
    recs = [
        NodeRecord("c1", "cpu", NodeState.BOOTING, Want.UP, requested_at=400.0),
        NodeRecord("c2", "cpu", NodeState.JOINED, Want.UP, requested_at=100.0),
        NodeRecord("c3", "cpu", NodeState.LAUNCHING, Want.DOWN, requested_at=10.0),
    ]
    suspects = {"instance:aws:i-1": 1.0, "instance:aws:i-2": 1.0, "peer:k": 1.0,
                "address:c9:10.0.0.9": 1.0, "resume-lost:c8": 1.0}  # fmt: skip
    f = findings(suspects, recs, now, ["cpu", "gpu"], ["aws", "lab"])
    assert f.orphans == {"aws": 2, "lab": 0}
    assert (f.stale_peers, f.leaked_addresses) == (1, 1)
    assert f.oldest_resume == {"cpu": 600.0, "gpu": 0.0}  # joined and unwanted don't count
    m = Metrics()
    m.findings(*f)
    assert sample(m, "slurm_burst_orphan_instances", provider="lab") == 0.0
    assert sample(m, "slurm_burst_oldest_resume_age_seconds", group="cpu") == 600.0


def test_node_activity_sides_and_states() -> None:
    nodes = [
        SlurmNode("on1", "allocated"), SlurmNode("on2", "idle"),
        SlurmNode("on3", "idle", frozenset({"DRAIN"})),
        SlurmNode("on4", "mixed", frozenset({"DRAIN"})),
        SlurmNode("b1", "idle", frozenset({"CLOUD", "POWERED_DOWN"})),
        SlurmNode("b2", "idle", frozenset({"CLOUD", "POWERING_UP"})),
        SlurmNode("b3", "allocated", frozenset({"CLOUD"})),
        SlurmNode("b4", "down", frozenset({"CLOUD"})),
    ]  # fmt: skip
    got = node_activity(nodes, lambda n: n.startswith("b"))
    assert got == {("onprem", "busy"): 2, ("onprem", "idle"): 1, ("onprem", "unavailable"): 1,
                   ("cloud", "powered_down"): 1, ("cloud", "powering_up"): 1,
                   ("cloud", "busy"): 1, ("cloud", "unavailable"): 1}  # fmt: skip
    m = Metrics()
    m.slurm_node_activity(got)
    assert sample(m, "slurm_burst_slurm_nodes", side="cloud", activity="idle") == 0.0
    assert sample(m, "slurm_burst_slurm_nodes", side="onprem", activity="busy") == 2.0


def test_steps_and_joins_are_histograms_with_bounded_labels() -> None:
    m = Metrics()
    m.step("ssh", 0.3)
    m.joined("gpu", 42.0)
    assert sample(m, "slurm_burst_node_step_duration_seconds_bucket", step="ssh", le="0.5") == 1.0
    assert sample(m, "slurm_burst_node_join_duration_seconds_count", group="gpu") == 1.0
    assert sample(m, "slurm_burst_node_join_duration_seconds_bucket", group="gpu", le="30.0") == 0.0
