"""Spot that falls back and placement per job, against the EC2 emulator: libcloud's EC2
driver over HTTP to moto behind the emulator's wrapper, which adds EC2's placement groups
and spot capacity a test refuses or withholds (lab/slurm_burst_lab/ec2market.py).

Covered: a job's nodes launched into one cluster placement group (CreatePlacementGroup,
``Placement.GroupName``), the group deleted by the reconcile pass once its instances are
gone and kept while one runs; a spot refusal launching the job on the fallback group's
on-demand capacity at once (same placement group, no second create); spot capacity
withheld falling back once ``spot_fallback_after`` has passed, the job's nodes in one
RunInstances; and the reason in the events and the Slurm node.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_burst.config import Config
from slurm_burst.core.nodestate import NodeState, Want
from tests.conftest import invoke, wait
from tests.integration.test_ec2 import (
    aws_instances,
    daemon,
    launch_batch,
    provisioner,
    requested,
    running,
)

pytest.importorskip("moto", reason="the EC2 emulator needs moto[server] (make test installs it)")

from slurm_burst_lab.ec2emu import Ec2Emulator

# A spot group whose fallback is the test config's on-demand group "cpu" (same shape).
SPOT = """
[node_groups.spot]
pattern = "spot-{{n}}"
count = 8
partition = "burst-spot"
providers = ["aws"]
sizes = ["c5.large"]
image = "ami-12345678"
cpus = 2
memory_mb = 3500
spot = true
spot_fallback = "cpu"
spot_fallback_after = {wait}
placement = "cluster"
"""
JOB = [{"job_id": 7, "nodes": "spot-[1-4]"}]
NODES = [f"spot-{i}" for i in range(1, 5)]


def make(cfg_factory: Callable[..., Config], wait_s: float) -> Config:
    return cfg_factory(extra=SPOT.format(wait=wait_s), slurm="resume_timeout = 900")


def market(emulator: Ec2Emulator) -> dict[str, object]:
    return emulator.market.snapshot()


def test_a_jobs_nodes_launch_into_one_placement_group_deleted_once_none_remain(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = make(cfg_factory, 30)
    d = daemon(cfg, tmp_path)
    prov = d.prov
    requested(prov, *NODES, jobs=JOB)
    emulator.calls.clear()
    launch_batch(prov, NODES)
    assert emulator.calls["CreatePlacementGroup"] == 1 and emulator.calls["RunInstances"] == 1
    recs = [prov.store.node(n) for n in NODES]
    (pg,) = {r.placement for r in recs if r is not None}
    assert pg and all(r is not None and r.market == "spot" for r in recs)
    groups = market(emulator)["groups"]
    assert isinstance(groups, dict) and groups[pg]["strategy"] == "cluster"
    assert sorted(groups[pg]["members"]) == sorted(r.instance_id for r in recs if r)
    live = {n.id: n for n in aws_instances(emulator, cfg.cluster.name)}
    assert {live[r.instance_id].extra["instance_lifecycle"] for r in recs if r} == {"spot"}

    # three released: the group stays while the fourth holds an instance in it
    for n in NODES[:3]:
        prov.store.update(n, want=Want.DOWN)
        prov.drive(n)
    d.reconciler.pass_once()
    assert pg in market(emulator)["groups"]  # type: ignore[operator]
    assert "DeletePlacementGroup" not in emulator.calls
    prov.store.update(NODES[3], want=Want.DOWN)
    prov.drive(NODES[3])
    d.reconciler.pass_once()
    assert pg not in market(emulator)["groups"]  # type: ignore[operator]
    assert emulator.calls["DeletePlacementGroup"] == 1
    assert prov.store.placements() == {}
    assert any(e["event"] == "placement.deleted" for e in prov.store.events())
    d.reconciler.pass_once()  # nothing left to delete: no call
    assert emulator.calls["DeletePlacementGroup"] == 1


def test_a_delete_refused_while_an_instance_shuts_down_is_tried_again(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    """EC2 refuses to delete a placement group an instance is still in (shutting-down
    too): the pass keeps it and a later pass deletes it."""
    cfg = make(cfg_factory, 30)
    d = daemon(cfg, tmp_path)
    requested(d.prov, *NODES[:2], jobs=[{"job_id": 8, "nodes": "spot-[1-2]"}])
    launch_batch(d.prov, NODES[:2])
    rec = d.prov.store.node(NODES[0])
    assert rec is not None and rec.placement
    for n in NODES[:2]:  # our records say terminated; one instance lives on at EC2
        d.prov.store.transition(n, NodeState.TERMINATING, time.time(), want=Want.DOWN)
        d.prov.store.transition(n, NodeState.TERMINATED, time.time())
    d.reconciler.pass_once()
    assert rec.placement in market(emulator)["groups"]  # type: ignore[operator]
    for inst in aws_instances(emulator, cfg.cluster.name):
        emulator.driver().destroy_node(inst)
    d.reconciler.pass_once()
    assert rec.placement not in market(emulator)["groups"]  # type: ignore[operator]


def test_spot_refused_falls_back_to_on_demand_at_once_in_the_same_placement_group(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = make(cfg_factory, 30)
    prov = provisioner(cfg, tmp_path)
    requested(prov, *NODES, jobs=JOB)
    emulator.market.set_spot("refuse")
    emulator.calls.clear()
    launch_batch(prov, NODES)
    # spot refused, then the fallback group's first size on-demand: one placement group
    assert emulator.calls["RunInstances"] == 2 and emulator.calls["CreatePlacementGroup"] == 1
    recs = [prov.store.node(n) for n in NODES]
    assert all(r is not None and (r.state, r.market, r.size) == (NodeState.BOOTING, "", "c5.large")
               for r in recs)  # fmt: skip
    live = {n.id: n for n in aws_instances(emulator, cfg.cluster.name)}
    assert {live[r.instance_id].extra.get("instance_lifecycle") for r in recs if r} == {None}
    assert ("aws", "c5.large/spot") in prov.store.unavailable(time.time())
    assert ("aws", "c5.large") not in prov.store.unavailable(time.time())  # on-demand apart
    fell = [e["node"] for e in prov.store.events() if e["event"] == "spot.fallback"]
    assert sorted(fell) == NODES
    said = [u for u in prov.scheduler.updates if u.get("comment")]  # type: ignore[attr-defined]
    assert said and said[-1]["comment"] == "slurm-burst: no spot capacity, on-demand c5.large"
    assert sorted(said[-1]["nodes"]) == NODES
    prov.store.update(NODES[0], want=Want.DOWN)
    prov.drive(NODES[0])  # released: the comment goes with the instance
    last = [u for u in prov.scheduler.updates if NODES[0] in u["nodes"]][-1]  # type: ignore[attr-defined]
    assert last.get("comment") == "", last


def test_spot_capacity_withheld_falls_back_after_the_wait_in_one_launch(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    """The spot instances are made and stay pending (capacity that never arrives): once
    ``spot_fallback_after`` has passed, the daemon terminates them and launches the job's
    nodes on-demand together (one RunInstances), and no node fails. One node's wait is
    set to have begun 1.9 s before the others' (records written that far apart on a
    loaded controller, as in a CI run): the others follow it at once."""
    cfg = make(cfg_factory, 2)
    emulator.market.set_spot("withhold")
    with running(cfg, tmp_path, emulator) as prov:
        prov.store.add_request("resume", NODES, JOB, time.time())

        def spot_launched() -> set[str]:
            recs = [prov.store.node(n) for n in NODES]
            ids = {r.instance_id for r in recs if r and r.instance_id and r.market == "spot"}
            return ids if len(ids) == len(NODES) else set()

        spot_ids = wait(spot_launched, 30, "four spot instances")
        assert spot_ids <= set(emulator.market.withheld)
        first = prov.store.node(NODES[0])
        assert first is not None
        prov.store.update(NODES[0], state_since=first.state_since - 1.9)

        def on_demand() -> bool:
            recs = [prov.store.node(n) for n in NODES]
            return all(r is not None and bool(r.instance_id) and r.instance_id not in spot_ids
                       and r.market == "" for r in recs)  # fmt: skip

        wait(on_demand, 60, "the job's nodes on on-demand instances")
        assert emulator.calls["RunInstances"] == 2  # the spot launch, then one fallback
        live = {n.id for n in aws_instances(emulator, cfg.cluster.name)}
        assert not spot_ids & live  # the pending spot instances are terminated
        assert not [e for e in prov.store.events() if e["event"] == "node.failed"]
        waited = [e for e in prov.store.events() if e["event"] == "size.unavailable"]
        assert any("SpotCapacityWait" in e["detail"] for e in waited)


def test_config_check_refuses_a_fallback_that_cannot_be_one(
    cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = make(cfg_factory, 30)
    path = Path(cfg.source)
    text = path.read_text()
    bad = text.replace("spot_fallback_after = 30", "spot_fallback_after = 800").replace(
        "memory_mb = 3500\nspot = true", "memory_mb = 7000\nspot = true"
    )
    path.write_text(bad)
    result = invoke(["--config", str(path), "config", "check"], expect=2)
    out = result.stdout + result.stderr
    assert "spot_fallback_after" in out and "resume_timeout" in out, out
    assert "has memory_mb 3500" in out, out


def test_a_job_that_does_not_fit_its_placement_group_is_never_split(
    emulator: Ec2Emulator, cfg_factory: Callable[..., Config], tmp_path: Path
) -> None:
    """The job's cluster placement group has room for 2 of its 4 instances (a full
    spine): every size on the provider is refused in that group (MinCount is the whole
    job), nothing is made, and the job's nodes fail together: none runs apart from the
    others."""
    cfg = make(cfg_factory, 30)
    prov = provisioner(cfg, tmp_path)
    requested(prov, *NODES, jobs=JOB)
    recs = [r for r in map(prov.store.node, NODES) if r is not None]
    emulator.market.room(prov.launcher.placement_name(recs, "aws"), 2)
    emulator.calls.clear()
    launch_batch(prov, NODES)
    # spot c5.large, then the fallback's c5.large and c5.xlarge: all refused, all or none
    assert emulator.calls["RunInstances"] == 3 and emulator.calls["CreatePlacementGroup"] == 1
    assert aws_instances(emulator, cfg.cluster.name) == []
    for n in NODES:  # their workers: every size is cooling down, no launch on its own
        prov.drive(n)
    assert emulator.calls["RunInstances"] == 3 and aws_instances(emulator, cfg.cluster.name) == []
    recs = [r for r in map(prov.store.node, NODES) if r is not None]
    # the first fails for want of capacity, the job's others are released with it
    assert {r.state for r in recs} == {NodeState.TERMINATED}, recs
    assert sorted(r.error for r in recs) == ["InsufficientInstanceCapacity", *["JobFailed"] * 3]
