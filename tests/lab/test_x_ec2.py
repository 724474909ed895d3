"""EC2 end to end: the first test in which a real provider's code path goes from launch to
a job. libcloud's EC2 driver and our EC2 profile talk SigV4 over HTTP to the lab's EC2
emulator; its instances boot as namespace VMs at their private IPs. The daemon reads
each instance's host keys with GetConsoleOutput (``Latest=true``: t3.micro is on
Nitro), joins it over WireGuard, and a job runs on both nodes; then they are released.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from slurm_burst_lab.service import Lab

from slurm_burst.adapters.state.store import Store
from slurm_burst.config import Config
from slurm_burst.core.records import NodeRecord
from tests.conftest import wait
from tests.lab.conftest import CLOUD_JOIN, sh

NODES = ("burst-ec2-1", "burst-ec2-2")


def emulator(cfg: Config, path: str) -> dict[str, Any]:
    """The lab's EC2 emulator's control endpoint ``/_emulator/<path>``."""
    port = cfg.providers["aws"].options["port"]
    url = f"http://127.0.0.1:{port}/_emulator/{path}"
    with urllib.request.urlopen(url, timeout=30) as r:
        return dict(json.loads(r.read()))


def emulator_calls(cfg: Config) -> dict[str, int]:
    return emulator(cfg, "calls")


def ec2_vms(lab: Lab) -> list[str]:
    vms = lab.paths.state / "ec2" / "vms"
    return sorted(d.name for d in vms.iterdir()) if vms.is_dir() else []


def test_a_job_runs_on_ec2_instances_the_ec2_profile_launched_attested_and_joined(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store
) -> None:
    before = emulator_calls(lab_config)
    srun = subprocess.run(
        ["srun", "-p", "burst-ec2", "-N2", "-t", "5", "hostname"],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert srun.returncode == 0, srun.stderr[-3000:]
    # EC2's own host names (ip-10-251-0-x): the job ran inside the instances' VMs
    names = sorted(srun.stdout.split())
    assert len(names) == 2 and all(re.fullmatch(r"ip-10-251-0-\d+", n) for n in names), names
    recs = {n: store.node(n) for n in NODES}
    for rec in recs.values():
        assert rec is not None and rec.provider == "aws" and rec.size == "t3.micro", rec
        assert rec.instance_id.startswith("i-") and rec.ip.startswith("10.251.0."), rec
    calls = emulator_calls(lab_config)
    assert calls.get("RunInstances", 0) - before.get("RunInstances", 0) == 1  # one batch
    assert calls.get("GetConsoleOutput", 0) > before.get("GetConsoleOutput", 0)
    assert sorted(ec2_vms(lab)) == sorted(r.instance_id for r in recs.values() if r)
    log = (lab.paths.log / "daemon.log").read_text()
    for name in NODES:
        steps = dict(re.findall(rf"node\.step node={name} step=([\w-]+) seconds=([\d.]+)", log))
        assert "attest" in steps, f"no attest step logged for {name}"
        CLOUD_JOIN[name] = {k: steps[k] for k in ("launch", "boot", "attest", "ssh", "slurmd")
                          if k in steps}  # fmt: skip
    # released: instances terminated through the API, their VMs halted
    sh(env, "scontrol", "update", f"nodename={','.join(NODES)}", "state=power_down")
    wait(lambda: not ec2_vms(lab), 120, "the EC2 instances' VMs halted")
    wait(
        lambda: all(str(getattr(store.node(n), "state", "")) == "terminated" for n in NODES),
        60,
        "both EC2 nodes torn down",
    )
    assert not [p for p in Path("/var/run/netns").iterdir() if p.name.endswith(
        tuple(r.instance_id[2:14] for r in recs.values() if r))]  # fmt: skip


WIDE = [f"burst-ec2x-{i}" for i in range(1, 33)]
SCALE = 0.05  # EC2's buckets at a twentieth: console reads 5 at once and 1 a second


@pytest.mark.full  # 1 min: make test-full only (docs/testing.md, the time budget)
def test_a_burst_of_32_ec2_vms_joins_every_node_and_runs_its_job_while_ec2_throttles(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store
) -> None:
    """EC2's request buckets scaled down in the emulator (its throttle switch) so that
    the daemon's calls are throttled (RequestLimitExceeded): 32 instances launched in
    one call, each attested and joined, the job runs on all 32, and no node fails. The
    daemon is not told the smaller buckets: it learns them from the throttled answers.
    Throttling is switched off again before the release (32 TerminateInstances at a
    twentieth of EC2's refill would take two minutes: not what is tested)."""
    start = max((e["id"] for e in store.events(limit=10**6)), default=0)
    emulator(lab_config, f"throttle?factor={SCALE}")
    began = time.monotonic()
    try:
        srun = subprocess.run(
            ["srun", "-p", "burst-ec2x", "-N32", "-t", "5", "hostname"],
            env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        seen = emulator(lab_config, "timeline")
    finally:
        emulator(lab_config, "throttle?factor=0")
    took = time.monotonic() - began
    assert srun.returncode == 0, srun.stderr[-3000:]
    names = srun.stdout.split()
    assert len(set(names)) == 32 and all(re.fullmatch(r"ip-10-251-0-\d+", n) for n in names)
    recs = [store.node(n) for n in WIDE]
    assert all(r is not None and r.instance_id.startswith("i-") and not r.error for r in recs)
    calls = [(action, throttled) for _, action, throttled in seen["timeline"]]
    CLOUD_JOIN["burst-ec2x-[1-32]"] = {  # the run's figures, in the session's summary
        "srun_s": f"{took:.1f}", "calls": str(len(calls)), "throttled": str(seen["throttled"]),
        **{a: str(sum(1 for b, _ in calls if b == a)) for a in sorted({a for a, _ in calls})},
    }  # fmt: skip
    assert seen["throttled"] > 0 and any(t for _, t in calls), "EC2 never throttled"
    assert sum(1 for a, t in calls if a == "RunInstances" and not t) == 1  # one batch
    # no describe per node: the booting nodes read one listing
    assert sum(1 for a, _ in calls if a == "DescribeInstances") < 32, calls
    # none replaced, released or its size cooled down on the way
    bad = [e for e in store.events(since_id=start, limit=10**6)
           if e["event"] in ("node.replaced", "node.released", "size.unavailable")]  # fmt: skip
    assert not bad, bad
    sh(env, "scontrol", "update", "nodename=burst-ec2x-[1-32]", "state=power_down")
    wait(lambda: not [v for v in ec2_vms(lab) if v in {r.instance_id for r in recs if r}], 240,
         "the 32 VMs halted")  # fmt: skip
    wait(
        lambda: all(str(getattr(store.node(n), "state", "")) == "terminated" for n in WIDE),
        120,
        "the 32 EC2 nodes torn down",
    )


SPOTS = [f"burst-spot-{i}" for i in range(1, 5)]


def _thaw_spot(store: Store) -> None:
    """End the spot size's cooldown a test before left (every test starts asking spot)."""
    store.mark_unavailable("aws", "t3.micro/spot", 0.0, "")


def _srun_with_spot(
    cfg: Config, env: dict[str, str], mode: str, count: int
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``srun -N count hostname`` on burst-spot while the emulator's spot capacity is
    ``mode`` (refuse, withhold); its spot capacity normal again after; the instances it
    withheld meanwhile."""
    emulator(cfg, f"spot?mode={mode}")
    try:
        srun = subprocess.run(
            ["srun", "-p", "burst-spot", f"-N{count}", "-t", "5", "hostname"],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        withheld = list(emulator(cfg, "market")["withheld"])
    finally:
        emulator(cfg, "spot?mode=")
    return srun, withheld


def _release(env: dict[str, str], lab: Lab, store: Store, nodes: list[str]) -> None:
    recs = [store.node(n) for n in nodes]
    ids = {r.instance_id for r in recs if r is not None}
    sh(env, "scontrol", "update", f"nodename={','.join(nodes)}", "state=power_down")
    wait(lambda: not ids & set(ec2_vms(lab)), 120, "the VMs halted")
    wait(
        lambda: all(str(getattr(store.node(n), "state", "")) == "terminated" for n in nodes),
        60,
        "the nodes torn down",
    )


def test_spot_refused_runs_a_4_node_job_on_demand_in_one_placement_group(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store
) -> None:
    """The emulator refuses spot capacity: the job's four nodes launch at once on the
    fallback group's on-demand t3.micro, into one cluster placement group made for the
    job; the node's Slurm comment and the events say why; the placement group is deleted
    once the nodes are released."""
    _thaw_spot(store)
    start = max((e["id"] for e in store.events(limit=10**6)), default=0)
    before = emulator_calls(lab_config)
    srun, _ = _srun_with_spot(lab_config, env, "refuse", 4)
    assert srun.returncode == 0, srun.stderr[-3000:]
    assert len(set(srun.stdout.split())) == 4, srun.stdout
    recs = [store.node(n) for n in SPOTS]
    assert all(r is not None and (r.market, r.size) == ("", "t3.micro") for r in recs), recs
    (placed,) = {r.placement for r in recs if r is not None}
    market = emulator(lab_config, "market")
    members = market["groups"][placed]["members"]
    assert sorted(members) == sorted(r.instance_id for r in recs if r is not None)
    calls = emulator_calls(lab_config)
    added = {
        a: calls.get(a, 0) - before.get(a, 0) for a in ("RunInstances", "CreatePlacementGroup")
    }
    # spot refused, then on-demand, into the one placement group
    assert added == {"RunInstances": 2, "CreatePlacementGroup": 1}, added
    fell = {e["node"] for e in store.events(since_id=start, limit=10**6)
            if e["event"] == "spot.fallback"}  # fmt: skip
    assert fell == set(SPOTS)
    shown = sh(env, "scontrol", "show", "node", SPOTS[0])
    assert "no spot capacity" in shown, shown
    _release(env, lab, store, SPOTS)
    wait(lambda: placed not in emulator(lab_config, "market")["groups"], 60,
         "the job's placement group deleted")  # fmt: skip


def test_spot_withheld_falls_back_after_the_wait_and_the_job_runs(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store
) -> None:
    """The emulator makes the spot instances and never runs them (capacity that does not
    arrive): after the group's spot_fallback_after (15 s) they are terminated and the
    job's nodes launch on-demand together; the job runs, no node fails."""
    _thaw_spot(store)
    nodes = SPOTS[:2]
    start = max((e["id"] for e in store.events(limit=10**6)), default=0)
    began = time.monotonic()
    srun, withheld = _srun_with_spot(lab_config, env, "withhold", 2)
    took = time.monotonic() - began
    assert srun.returncode == 0, srun.stderr[-3000:]
    assert took >= 15, took  # it waited for the spot capacity first
    recs = [store.node(n) for n in nodes]
    assert all(r is not None and r.market == "" and r.instance_id not in withheld for r in recs)
    assert len(withheld) >= 2 and not set(withheld) & set(ec2_vms(lab))
    events = store.events(since_id=start, limit=10**6)
    assert any(e["event"] == "size.unavailable" and "SpotCapacityWait" in e["detail"]
               for e in events)  # fmt: skip
    assert not [e for e in events if e["event"] in ("node.failed", "node.released")], events
    CLOUD_JOIN["spot withheld -> on-demand, job ran"] = {"srun_s": f"{took:.1f}"}
    _release(env, lab, store, nodes)


def test_an_interruption_notice_signals_the_job_which_is_requeued_and_completes_elsewhere(
    lab: Lab, lab_config: Config, env: dict[str, str], store: Store
) -> None:
    """The emulator raises EC2's spot interruption notice on the job's VM (its instance
    metadata says so, inside the VM): the node's agent tells the daemon, the job's batch
    shell gets the USR1 it asked for within seconds, the job is requeued before the
    reclaim and runs again on a replacement (on-demand: the spot size cooled down), and
    the ledger records the reclaim."""
    from tests.lab.reclaim import reclaimed_job_runs_again

    _thaw_spot(store)

    def notice(rec: NodeRecord) -> object:
        return emulator(lab_config, f"interrupt?instance={rec.instance_id}&in=30")

    took, again, _ = reclaimed_job_runs_again(lab, lab_config, env, store, "burst-spot", notice,
                                              "SpotInterruption")  # fmt: skip
    CLOUD_JOIN["interruption notice -> USR1"] = {"seconds": f"{took:.2f}"}
    _release(env, lab, store, [again.name])
