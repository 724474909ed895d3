"""Warm capacity against the real slurmctld: the EC2 group's warm pool (burst-ec2-2, in
SuspendExcNodes from ``conf render``) is powered up by the daemon when ``group warm``
asks, joins, and stays up idle past its partition's SuspendTime, which Slurm would
otherwise have ended; once the override ends, the daemon powers it down after that
idle time, as Slurm would have."""

from __future__ import annotations

import time

import pytest

from slurm_burst.adapters.state.store import Store
from tests.conftest import LAB_CONFIG, invoke, wait
from tests.lab.conftest import sh

SB = ["--config", str(LAB_CONFIG)]
NODE = "burst-ec2-2"


def state(env: dict[str, str]) -> str:
    return sh(env, "sinfo", "-h", "-N", "-n", NODE, "-o", "%T").strip()


def events(store: Store, kind: str) -> list[dict[str, object]]:
    return [e for e in store.events(limit=100_000) if e["event"] == kind and e["node"] == NODE]


@pytest.mark.full  # 65 s: make test-full only (docs/testing.md, the time budget)
def test_a_warm_node_is_kept_up_past_suspend_time_then_released(
    env: dict[str, str], store: Store
) -> None:
    wait(lambda: state(env) == "idle~", 120, f"{NODE} powered down")
    ups = len(events(store, "warm.power_up"))
    out = invoke([*SB, "group", "warm", "ec2", "--nodes", "1", "--for", "10m"]).stdout
    assert f"1 of {NODE} kept up until" in out
    wait(lambda: state(env) == "idle", 120, f"{NODE} joined and idle")
    assert len(events(store, "warm.power_up")) == ups + 1
    time.sleep(40)  # the partition's SuspendTime is 30 s: Slurm leaves it alone
    assert state(env) == "idle"
    shown = invoke([*SB, "group", "list", "--json"]).stdout
    assert '"warm_now": 1' in shown
    downs = len(events(store, "warm.power_down"))
    invoke([*SB, "group", "warm", "ec2", "--off"])
    wait(lambda: state(env) == "idle~", 120, f"{NODE} powered down by the daemon")
    assert len(events(store, "warm.power_down")) == downs + 1
    rec = store.node(NODE)
    assert rec is not None and str(rec.state) == "terminated"
