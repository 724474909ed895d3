"""The node cap through the daemon, on the fake world: each reconcile pass drains the
capped group's powered-down nodes past its room and undrains them as room comes back;
a resume that gets past the drain is refused with GroupAtCap and makes no instance;
protected mode's end hands the nodes back within the cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_burst.core.cap import MARK
from slurm_burst.core.nodestate import NodeState
from tests.fakes.world import World, make_world

CPU = [f"burst-cpu-{i}" for i in range(1, 33)]
CAP = 2


@pytest.fixture()
def w(tmp_path: Path) -> World:
    return make_world(tmp_path, edits=[("count = 32\n", f"count = 32\nmax_nodes = {CAP}\n")])


def resume(w: World, names: list[str], jobs: list[dict[str, object]] | None = None) -> None:
    """Slurm powers ``names`` up and its resume hook asks the daemon for them."""
    w.slurm.update_nodes(names, state="power_up")
    w.store.add_request("resume", names, jobs or [], w.clock.now())
    w.settle()


def ours(w: World) -> list[str]:
    return [n for n in CPU if MARK in w.slurm.node(n).reason and "DRAIN" in w.slurm.node(n).flags]


def test_the_pass_leaves_as_many_nodes_available_as_the_cap_has_room(w: World) -> None:
    assert w.cfg.node_groups["cpu"].limit == CAP
    report = w.daemon.reconciler.pass_once()
    assert report.actions.get("cap") == 1, report.errors
    assert ours(w) == CPU[CAP:]  # the first two stay available
    gpu = w.cfg.node_groups["gpu"].node_names()
    assert not any("DRAIN" in w.slurm.node(n).flags for n in gpu)  # not capped: untouched
    resume(w, CPU[:1])
    w.daemon.reconciler.pass_once()
    assert ours(w) == CPU[CAP:]  # one up, one still free: nothing changes
    resume(w, CPU[1:2])
    w.daemon.reconciler.pass_once()
    assert ours(w) == CPU[CAP:] and len(w.cloud.live()) == CAP
    w.store.add_request("suspend", CPU[:1], [], w.clock.now())
    w.settle()
    w.slurm.update_nodes(CPU[:1], state="power_down_force")  # Slurm's suspend, done
    report = w.daemon.reconciler.pass_once()
    assert ours(w) == CPU[CAP:], report  # the released node is the free one again


def test_room_taken_by_a_drained_node_powered_up_by_hand_is_made_up_elsewhere(w: World) -> None:
    w.daemon.reconciler.pass_once()
    w.slurm.update_nodes([CPU[5]], state="power_up")  # an admin, past the drain
    w.daemon.reconciler.pass_once()
    assert ours(w) == CPU[1:]  # room 1 left: CPU[0] only (CPU[5] keeps its drain)


def test_a_resume_past_the_cap_is_refused_and_makes_no_instance(w: World) -> None:
    """Two running nodes, then a third powered up by hand: refused, no instance."""
    resume(w, CPU[:2])
    resume(w, CPU[2:3])
    assert [w.rec(n).state for n in CPU[:2]] == [NodeState.JOINED] * 2
    refused = w.rec(CPU[2])
    assert (refused.state, refused.error) == (NodeState.TERMINATED, "GroupAtCap")
    assert len(w.cloud.live()) == CAP and w.cloud.calls["launch"] == CAP
    assert w.slurm.states_set(CPU[2]) == ["power_up", "down", "power_down_force"]
    events = [e for e in w.store.events() if e["event"] == "node.over_cap"]
    assert [e["node"] for e in events] == [CPU[2]]
    assert "max_nodes=2" in events[0]["detail"]


def test_a_job_too_big_for_the_room_is_refused_whole(w: World) -> None:
    """One request of three nodes for one job: the third is past the cap, so the job is
    requeued by Slurm and the other two are released with it (whole jobs)."""
    resume(w, CPU[:3], [{"job_id": 9, "nodes": "burst-cpu-[1-3]"}])
    assert w.rec(CPU[2]).error == "GroupAtCap"
    assert all(w.rec(n).state == NodeState.TERMINATED for n in CPU[:3])
    assert w.cloud.live() == []


def test_the_end_of_protected_mode_hands_back_only_the_room(w: World) -> None:
    resume(w, CPU[:1])
    for _ in range(w.cfg.daemon.protect_after):
        w.store.group_launch_result("cpu", ok=False)
    w.daemon.reconciler.pass_once()
    assert all("(Code:GroupProtected)" in w.slurm.node(n).reason for n in CPU[1:])
    undrained = w.daemon.reconciler.groups.enable("cpu")
    assert undrained == CPU[:2]  # the one up (drained with the rest), and room for one more
    assert ours(w) == CPU[2:]
