"""The reconcile loop's parts that need no lab: cloud-call retries, status, metrics and
the squeue count read (the HA election is in tests/integration/test_ha.py)."""

from __future__ import annotations

import time

import pytest

from slurm_burst.adapters.proc import Result
from slurm_burst.adapters.slurm.cli import SlurmCli
from slurm_burst.adapters.slurm.openapi import SchemaError
from slurm_burst.config import load_config
from slurm_burst.core.cloud import (
    AuthError,
    CloudError,
    Instance,
    LaunchSpec,
    ThrottledError,
    backoff,
)
from slurm_burst.core.fleetstatus import FleetStatus, GroupView
from slurm_burst.core.nodestate import NodeState, Want
from slurm_burst.services.cloudcalls import CallSettings, ManagedCloud
from slurm_burst.services.status import status
from tests.conftest import LAB_CONFIG
from tests.fakes.store import MemoryStore


class Flaky:
    """A Cloud port whose launch fails with ``errors`` first (then succeeds)."""

    name = "lab"

    def __init__(self, errors: list[CloudError]) -> None:
        self.errors = list(errors)
        self.calls = 0

    def launch(self, spec: LaunchSpec) -> Instance:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return Instance("i-1", spec.node, "pending", "lab")


SPEC = LaunchSpec("n1", "c", "cpu", "s", "img", "tok", "ssh-ed25519 AAAA", "")


def test_backoff_is_exponential_capped_and_jittered() -> None:
    assert [backoff(a, 1.0, 30.0, 0.999) for a in range(7)] == pytest.approx(
        [0.999, 1.998, 3.996, 7.992, 15.984, 29.97, 29.97]
    )
    assert backoff(3, 1.0, 30.0, 0.0) == 0.0


def test_throttled_launch_is_retried_then_succeeds() -> None:
    inner = Flaky([ThrottledError("slow down"), ThrottledError("slow down")])
    slept: list[float] = []
    settings = CallSettings(attempts=5, base=1, cap=8)
    cloud = ManagedCloud(inner, settings, sleep=slept.append, rand=lambda: 0.5)  # type: ignore[arg-type]
    assert cloud.launch(SPEC).id == "i-1"
    assert inner.calls == 3 and slept == [0.5, 1.0]


def test_throttling_gives_up_after_the_attempts() -> None:
    inner = Flaky([ThrottledError("slow down")] * 9)
    cloud = ManagedCloud(inner, CallSettings(attempts=3), sleep=lambda s: None, rand=lambda: 0.0)  # type: ignore[arg-type]
    with pytest.raises(ThrottledError):
        cloud.launch(SPEC)
    assert inner.calls == 3


def test_other_errors_are_not_retried() -> None:
    inner = Flaky([AuthError("no")])
    cloud = ManagedCloud(inner, sleep=lambda s: None)  # type: ignore[arg-type]
    with pytest.raises(AuthError):
        cloud.launch(SPEC)
    assert inner.calls == 1


def test_status_reports_daemon_nodes_groups_and_spend() -> None:
    cfg = load_config(LAB_CONFIG)
    store = MemoryStore()
    now = time.time()
    assert status(cfg, store, now).daemon.running is False
    store.beat(now, {"pid": 42, "node_id": "ctl-a", "in_flight": 0})
    store.transition(
        "burst-gpu-1", NodeState.REQUESTED, now, group="gpu", want=Want.UP, requested_at=now
    )
    store.transition("burst-gpu-1", NodeState.LAUNCHING, now, provider="lab", size="ns.gpu1")
    store.transition("burst-gpu-1", NodeState.BOOTING, now, instance_id="ns-1")
    store.protect_group("cpu", now + 60, "3 failed launches in a row")
    store.record_pass({"ended": now, "seconds": 0.1, "actions": {}, "errors": {}})
    typed = status(cfg, store, now)
    assert typed.fleet.groups["gpu"].live == 1 and typed.fleet.groups["cpu"].protected(now)
    assert typed.fleet.groups["capped"].max_nodes == 2 and typed.fleet.groups["gpu"].holding == 1
    st = typed.doc()
    assert st["daemon"]["running"] and st["leader"] == "ctl-a"
    assert st["caps"]["capped"] == {"max_nodes": 2, "holding": 0}
    assert st["nodes"] == {"gpu": {"booting": 1}}
    assert st["protected_groups"]["cpu"]["reason"] == "3 failed launches in a row"
    assert st["spend_per_hour_total"] == pytest.approx(2.80)  # rates.gpu1-2026: 2 GPUs x 1.40


def test_job_counts_reads_one_compact_squeue() -> None:
    seen: list[list[str]] = []

    def runner(argv: list[str], timeout: float, env: object) -> Result:
        seen.append(argv)
        out = "burst-cpu|PENDING\nburst-cpu|PENDING\nburst-gpu|RUNNING\n"
        return Result(tuple(argv), 0, out, "", 0.0)

    cli = SlurmCli(runner=runner)
    assert cli.job_counts(["burst-cpu", "burst-gpu"]) == {
        ("burst-cpu", "PENDING"): 2,
        ("burst-gpu", "RUNNING"): 1,
    }
    assert len(seen) == 1 and "--partition=burst-cpu,burst-gpu" in seen[0]
    bad = SlurmCli(runner=lambda argv, timeout, env: Result((), 0, "garbage\n", "", 0.0))
    with pytest.raises(SchemaError, match="garbage"):
        bad.job_counts()


def test_metrics_are_named_by_convention() -> None:
    from slurm_burst.adapters.metrics.prom import Metrics

    m = Metrics()
    m.fleet(FleetStatus(0.0, {"cpu": GroupView("cpu", {"joined": 3}, 1.5, 3, protected_until=9.0),
                              "gpu": GroupView("gpu", {}, 0.0, 0)}))  # fmt: skip
    m.launched("cpu", "lab", "ns.cpu2")
    m.reconcile_pass(0.2, 1_790_000_000.0)
    m.cloud_call("lab", "launch", 0.3, "InsufficientInstanceCapacity")
    text = m.text().decode()
    assert 'slurm_burst_nodes{group="cpu",state="joined"} 3.0' in text
    assert 'slurm_burst_nodes{group="gpu",state="joined"} 0.0' in text
    assert 'slurm_burst_group_protected{group="cpu"} 1.0' in text  # what status says
    assert 'slurm_burst_spend_rate_dollars_per_hour{group="cpu"} 1.5' in text
    assert 'slurm_burst_launches_total{group="cpu",provider="lab",size="ns.cpu2"} 1.0' in text
    assert "slurm_burst_reconcile_pass_duration_seconds_count 1.0" in text
    assert (
        'slurm_burst_cloud_api_errors_total{call="launch",code="InsufficientInstanceCapacity",'
        'provider="lab"} 1.0'
    ) in text
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert all(n.startswith("slurm_burst_") for n in names)
