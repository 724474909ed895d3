"""A multi-node job gets all its nodes or none (node_groups.*.all_or_nothing = "job"),
on in-memory fakes: a batch the provider can only partly make serves whole jobs first
and sends the rest to the next size; a node that fails takes the other nodes of its
job down with it (after Slurm was told, so the job is requeued first), and leaves
every other job's nodes alone; "node" keeps them."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_burst.core.nodestate import NodeState, Want
from tests.fakes.world import World, make_world

CPU = [f"burst-cpu-{i}" for i in range(1, 17)]


def jobs(*spans: tuple[int, int, int]) -> list[dict[str, object]]:
    """Resume-file jobs: (job id, first node, last node)."""
    return [{"job_id": j, "nodes": f"burst-cpu-[{a}-{b}]"} for j, a, b in spans]


@pytest.fixture()
def w(tmp_path: Path) -> World:
    return make_world(tmp_path, batch_max=16)


def test_a_partial_launch_serves_whole_jobs_and_the_rest_moves_to_the_next_size(
    w: World,
) -> None:
    w.cloud.limit["ns.cpu2"] = 8  # the provider makes 8 of 16
    w.store.add_request("resume", CPU, jobs((1, 1, 5), (2, 6, 13), (3, 14, 16)), 0.0)
    w.settle()
    sizes = [w.rec(n).size for n in CPU]
    assert all(w.rec(n).state == NodeState.JOINED for n in CPU)
    # jobs 1 (5 nodes) and 3 (3) fit whole in 8; job 2 (8) goes whole to the next size
    assert sizes == ["ns.cpu2"] * 5 + ["ns.cpu4"] * 8 + ["ns.cpu2"] * 3
    assert w.cloud.calls["launch_many"] == 2
    assert ("lab", "ns.cpu2") in w.store.unavailable(w.clock.now())  # the size cools down


def test_a_partial_launch_below_the_smallest_job_makes_nothing(w: World) -> None:
    w.cloud.limit["ns.cpu2"] = 3  # fewer than any job needs: EC2 makes none
    w.store.add_request("resume", CPU[:8], jobs((1, 1, 4), (2, 5, 8)), 0.0)
    w.settle()
    assert {w.rec(n).size for n in CPU[:8]} == {"ns.cpu4"}
    assert len(w.cloud.live()) == 8  # nothing was made on ns.cpu2


def test_a_failed_node_releases_its_jobs_other_nodes_after_slurm_is_told(w: World) -> None:
    w.cloud.never_boot.add("burst-cpu-2")
    w.store.add_request("resume", CPU[:8], jobs((1, 1, 4), (2, 5, 8)), 0.0)
    w.settle()
    failed = w.rec("burst-cpu-2")
    assert (failed.state, failed.error) == (NodeState.TERMINATED, "BootTimeout")
    for n in ("burst-cpu-1", "burst-cpu-3", "burst-cpu-4"):  # job 1's others: let go
        rec = w.rec(n)
        assert (rec.state, rec.want, rec.error) == (NodeState.TERMINATED, Want.DOWN, "JobFailed")
        assert "job 1 lost burst-cpu-2 (BootTimeout)" in rec.message
        assert w.slurm.states_set(n)[-1] == "power_down_force"
        assert w.cloud.of_node(n) == []
    for n in CPU[4:8]:  # job 2 is untouched
        assert w.rec(n).state == NodeState.JOINED
    # Slurm heard of the failure (DOWN: it requeues the job) before any release
    order = [(u["nodes"], u["state"]) for u in w.slurm.updates if u["state"]]
    down = order.index((["burst-cpu-2"], "down"))
    assert all(
        order.index(([n], "power_down_force")) > down for n in ("burst-cpu-1", "burst-cpu-3")
    )
    assert [e["node"] for e in w.store.events() if e["event"] == "node.released"] != []


def test_a_node_that_also_serves_a_healthy_job_is_kept(w: World) -> None:
    w.cloud.never_boot.add("burst-cpu-1")
    w.store.add_request("resume", CPU[:4], jobs((1, 1, 2), (2, 2, 4)), 0.0)
    w.settle()
    assert w.rec("burst-cpu-1").error == "BootTimeout"
    assert [w.rec(n).state for n in CPU[1:4]] == [NodeState.JOINED] * 3  # 2 serves job 2


def test_best_effort_per_node_keeps_the_other_nodes(tmp_path: Path) -> None:
    w = make_world(
        tmp_path,
        batch_max=16,
        edits=[("memory_mb = 1000\n", 'memory_mb = 1000\nall_or_nothing = "node"\n')],
    )
    w.cloud.never_boot.add("burst-cpu-2")
    w.store.add_request("resume", CPU[:4], jobs((1, 1, 4)), 0.0)
    w.settle()
    assert [w.rec(n).state for n in ("burst-cpu-1", "burst-cpu-3", "burst-cpu-4")] == [
        NodeState.JOINED
    ] * 3


def test_a_provider_that_names_instances_at_launch_gets_them_adopted_by_name(
    w: World,
) -> None:
    """GCE names each instance of a bulk insert after its node and makes whichever of
    them it has room for: each node gets the instance named after it, whatever the
    order, and no instance is tagged afterwards (the name is its node)."""
    w.cloud.names_at_launch = True
    w.cloud.limit["ns.cpu2"] = 8  # it makes 8 of 16: the last 8 names
    w.store.add_request("resume", CPU, jobs((1, 1, 8), (2, 9, 16)), 0.0)
    w.settle()
    assert all(w.rec(n).state == NodeState.JOINED for n in CPU)
    assert [w.rec(n).size for n in CPU] == ["ns.cpu4"] * 8 + ["ns.cpu2"] * 8
    named = {vm.id: vm.name for vm in w.cloud.vms.values()}
    assert all(named[w.rec(n).instance_id] == n for n in CPU)  # each its own
    assert w.cloud.calls["tag"] == 0
