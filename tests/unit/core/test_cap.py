"""The node cap's plan: what holds a place, which powered-down nodes stay available, and
which resumes are past it."""

from __future__ import annotations

from slurm_burst.core.cap import MARK, cap_reason, holding, over_cap, plan_cap
from slurm_burst.core.nodestate import NodeState
from slurm_burst.core.slurm import SlurmNode

NAMES = [f"n{i}" for i in range(1, 7)]
DOWN = frozenset({"CLOUD", "POWERED_DOWN"})


def view(**special: SlurmNode) -> dict[str, SlurmNode]:
    out = {n: SlurmNode(n, "idle", DOWN) for n in NAMES}
    out.update(special)
    return out


def test_records_and_slurm_both_say_what_holds_a_place() -> None:
    states = {"n1": NodeState.JOINED, "n2": NodeState.REQUESTED, "n3": NodeState.TERMINATING,
              "n4": NodeState.FAILED}  # fmt: skip
    slurm = view(
        n5=SlurmNode("n5", "idle", frozenset({"CLOUD", "POWERING_UP"})),  # resume not seen yet
        n6=SlurmNode("n6", "idle", frozenset({"CLOUD", "POWERING_DOWN"})),  # going
    )
    assert holding(NAMES, states, slurm) == {"n1", "n2", "n5"}
    up = view(n3=SlurmNode("n3", "idle", frozenset({"CLOUD"})))  # idle, still up: holds
    assert holding(NAMES, {}, up) == {"n3"}


def test_past_the_room_the_powered_down_nodes_are_drained_the_lowest_kept() -> None:
    p = plan_cap(NAMES, 3, {"n2": NodeState.JOINED}, view())
    assert (p.holding, p.room) == (1, 2)
    assert p.drain == ("n4", "n5", "n6") and p.release == ()


def test_our_drain_is_lifted_as_room_comes_back_and_not_set_twice() -> None:
    ours = SlurmNode("x", "idle", DOWN | {"DRAIN"}, reason=cap_reason("cpu", 2))
    slurm = view(**{n: ours._replace(name=n) for n in ("n3", "n4", "n5", "n6")})
    p = plan_cap(NAMES, 2, {"n1": NodeState.JOINED}, slurm)  # n2 free: room 1, taken by n2
    assert p.room == 1 and p.drain == () and p.release == ()
    p = plan_cap(NAMES, 4, {"n1": NodeState.JOINED}, slurm)  # room 3: n2, then n3 and n4
    assert p.drain == () and p.release == ("n3", "n4")


def test_a_drain_or_down_of_someone_else_is_left_alone() -> None:
    admin = SlurmNode("n1", "idle", DOWN | {"DRAIN"}, reason="disk check")
    failed = SlurmNode("n2", "down", DOWN, reason="slurm-burst: x (Code:LaunchFailed)")
    p = plan_cap(NAMES, 2, {}, view(n1=admin, n2=failed))
    assert p.drain == ("n5", "n6") and MARK not in admin.reason


def test_the_warm_pool_takes_the_room_first() -> None:
    p = plan_cap(NAMES, 2, {}, view(), first=["n5", "n6"])
    assert p.drain == ("n1", "n2", "n3", "n4")


def test_a_full_group_drains_every_powered_down_node() -> None:
    states = {n: NodeState.BOOTING for n in NAMES[:2]}
    assert plan_cap(NAMES, 2, states, view()).drain == tuple(NAMES[2:])
    assert plan_cap(NAMES, 0, {}, view()).drain == tuple(NAMES)


def test_a_resume_past_the_cap_is_refused_in_request_order() -> None:
    states = {"n1": NodeState.JOINED, "n2": NodeState.TERMINATING, "n3": NodeState.REQUESTED,
              "n4": NodeState.REQUESTED}  # fmt: skip
    assert over_cap(states, 2, ["n3", "n4"]) == ["n4"]
    assert over_cap(states, 3, ["n3", "n4"]) == []
    assert over_cap(states, 1, ["n3", "n4"]) == ["n3", "n4"]


def test_a_powered_down_node_given_a_job_holds_a_place_and_is_never_drained() -> None:
    taken = SlurmNode("n1", "allocated", DOWN)  # its resume is on the way
    assert holding(NAMES, {}, view(n1=taken)) == {"n1"}
    p = plan_cap(NAMES, 2, {}, view(n1=taken))
    assert p.room == 1 and p.drain == ("n3", "n4", "n5", "n6")


def test_a_node_powering_down_is_drained_on_its_way_the_powered_down_kept_first() -> None:
    going = frozenset({"CLOUD", "POWERING_DOWN"})
    slurm = view(n1=SlurmNode("n1", "idle", going), n2=SlurmNode("n2", "idle", going))
    p = plan_cap(NAMES, 2, {}, slurm)
    assert p.drain == ("n5", "n6", "n1", "n2")  # it comes out of its power-down available
