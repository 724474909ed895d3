"""The reconcile planner, rule by rule, on snapshots built by hand."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from slurm_burst.core.cloud import Instance
from slurm_burst.core.mesh import Peer
from slurm_burst.core.nodestate import NodeState, Want
from slurm_burst.core.reconcile import Policy, Snapshot, plan
from slurm_burst.core.records import GroupHealth
from slurm_burst.core.slurm import SlurmNode

NOW = 1_000_000.0
POLICY = Policy(orphan_grace=120, resume_timeout=600, protect_after=3, protect_cooldown=900)
KEY_A = "A" * 43 + "="
KEY_B = "B" * 43 + "="


@dataclass(frozen=True)
class Rec:
    name: str
    state: NodeState
    want: Want = Want.UP
    group: str = "cpu"
    provider: str = "lab"
    size: str = "ns.cpu2"
    instance_id: str = ""
    token: str = ""
    wg_pubkey: str = ""
    requested_at: float = NOW - 30
    state_since: float = NOW - 10
    placement: str = ""


def inst(i: str, node: str, state: str = "running") -> Instance:
    return Instance(i, node, state, "lab", tags={"slurm-burst-node": node})


def snode(name: str, *flags: str, state: str = "idle", reason: str = "") -> SlurmNode:
    return SlurmNode(name, state, frozenset({"CLOUD", *flags}), reason=reason)


def snap(records: list[Rec] | None = None, **kw: object) -> Snapshot:
    return Snapshot(now=NOW, records={r.name: r for r in records or []}, **kw)  # type: ignore[arg-type]  # kw: the optional sources


def kinds(s: Snapshot) -> list[tuple[str, str, str]]:
    return [(a.kind, a.code, a.node or a.target) for a in plan(s, POLICY).actions]


CASES = [
    pytest.param(
        snap(
            [Rec("n1", NodeState.JOINED, instance_id="i-1")], instances={"lab": [inst("i-1", "n1")]}
        ),
        [],
        id="healthy-joined-node",
    ),
    pytest.param(
        snap([], instances={"lab": [inst("i-9", "n9")]}),
        [],
        id="orphan-first-seen-waits-for-grace",
    ),
    pytest.param(
        snap(
            [],
            instances={"lab": [inst("i-9", "n9")]},
            suspects={"instance:lab:i-9": NOW - 121},
        ),
        [("terminate", "Orphan", "n9")],
        id="orphan-past-grace-terminated",
    ),
    pytest.param(
        snap(
            [Rec("n1", NodeState.LAUNCHING, token="tok-1")],
            instances={
                "lab": [
                    Instance(
                        "vmss_1a2b3c4d",
                        "vmss_1a2b3c4d",
                        "pending",
                        "lab",
                        tags={"slurm-burst-token": "tok-1"},
                    )
                ]
            },
            suspects={"instance:lab:vmss_1a2b3c4d": NOW - 500},
        ),
        [],
        id="a-launch-in-flight-owns-what-carries-its-token",
    ),
    pytest.param(
        snap(
            [Rec("n1", NodeState.LAUNCHING, token="tok-2")],
            instances={
                "lab": [
                    Instance(
                        "vmss_1a2b3c4d",
                        "vmss_1a2b3c4d",
                        "pending",
                        "lab",
                        tags={"slurm-burst-token": "tok-1"},
                    )
                ]
            },
            suspects={"instance:lab:vmss_1a2b3c4d": NOW - 500},
        ),
        [("terminate", "Orphan", "vmss_1a2b3c4d")],
        id="another-launchs-token-owns-nothing",
    ),
    pytest.param(
        snap(
            [Rec("n1", NodeState.JOINED, instance_id="i-1")],
            instances={"lab": [inst("i-1", "n1"), inst("i-2", "n1")]},
            suspects={"instance:lab:i-2": NOW - 500},
        ),
        [("terminate", "Orphan", "n1")],
        id="duplicate-instance-of-a-node-terminated",
    ),
    pytest.param(
        snap(
            [Rec("n1", NodeState.LAUNCHING)],
            instances={"lab": [inst("i-1", "n1", "pending")]},
            suspects={"instance:lab:i-1": NOW - 500},
        ),
        [],
        id="instance-of-a-launch-in-flight-is-not-orphan",
    ),
    pytest.param(
        snap(
            [Rec("n1", NodeState.TERMINATED, want=Want.DOWN, instance_id="")],
            instances={"lab": [inst("i-1", "n1", "terminated")]},
            suspects={"instance:lab:i-1": NOW - 500},
        ),
        [],
        id="terminated-instance-ignored",
    ),
    pytest.param(
        snap([Rec("n1", NodeState.BOOTING, requested_at=NOW - 700)], instances={"lab": []}),
        [("fail_node", "ResumeTimeout", "n1")],
        id="stuck-past-resume-timeout",
    ),
    pytest.param(
        snap([Rec("n1", NodeState.JOINED, instance_id="i-1")], instances={"lab": []}),
        [("fail_node", "InstanceVanished", "n1")],
        id="joined-node-instance-vanished",
    ),
    pytest.param(
        snap(
            [Rec("n1", NodeState.JOINED, instance_id="i-1")],
            instances={"lab": [inst("i-1", "n1", "terminated")]},
        ),
        [("fail_node", "InstanceVanished", "n1")],
        id="joined-node-instance-terminated-spot-reclaim",
    ),
    pytest.param(
        snap([Rec("n1", NodeState.JOINED, instance_id="i-1")], instances={}),
        [],
        id="provider-unreadable-no-vanish-verdict",
    ),
    pytest.param(
        snap(
            [Rec("n1", NodeState.JOINED, instance_id="i-1")],
            instances={"lab": [inst("i-1", "n1")]},
            slurm_nodes={"n1": snode("n1", "POWERED_DOWN")},
        ),
        [("teardown", "SlurmPoweredDown", "n1")],
        id="slurm-powered-down-a-joined-node",
    ),
    pytest.param(
        snap(
            [Rec("n2", NodeState.TERMINATED, want=Want.DOWN)],
            slurm_nodes={
                "n1": snode(
                    "n1",
                    "POWERED_DOWN",
                    state="down",
                    reason="slurm-burst: daemon not running (Code:DaemonDown)",
                ),
                "n2": snode("n2", state="down", reason="x (Code:RequestNotRecorded)"),
                "n3": snode("n3", state="down", reason="admin: bad DIMM"),
                "n4": snode("n4", state="idle", reason="(Code:DaemonDown)"),
            },
        ),
        [("return_to_service", "HookRefusal", "n1"), ("return_to_service", "HookRefusal", "n2")],
        id="nodes-a-hook-set-down-go-back-to-service-others-stay",
    ),
    pytest.param(
        snap(
            [Rec("n1", NodeState.BOOTING, instance_id="i-1")],
            instances={"lab": [inst("i-1", "n1")]},
            slurm_nodes={"n1": snode("n1", state="down", reason="(Code:RequestNotRecorded)")},
        ),
        [],
        id="a-hook-set-down-node-a-spooled-request-now-serves-is-left",
    ),
    pytest.param(
        snap(
            [Rec("n1", NodeState.JOINED, instance_id="i-1", state_since=NOW - 181)],
            instances={"lab": [inst("i-1", "n1")]},
            slurm_nodes={"n1": snode("n1", "POWERING_UP")},
        ),
        [("fail_node", "SlurmdNotRegistered", "n1")],
        id="joined-but-slurmd-never-registered",
    ),
    pytest.param(
        snap(
            [Rec("n1", NodeState.JOINED, instance_id="i-1", state_since=NOW - 30)],
            instances={"lab": [inst("i-1", "n1")]},
            slurm_nodes={"n1": snode("n1", "POWERING_UP")},
        ),
        [],
        id="joined-slurmd-registering-within-its-timeout",
    ),
    pytest.param(
        snap(
            [Rec("n1", NodeState.JOINED, instance_id="i-1", state_since=NOW - 500)],
            instances={"lab": [inst("i-1", "n1")]},
            slurm_nodes={"n1": snode("n1", state="allocated")},
        ),
        [],
        id="joined-and-registered-long-ago",
    ),
    pytest.param(
        snap(
            [Rec("n1", NodeState.JOINED, instance_id="i-1", state_since=NOW - 500)],
            instances={"lab": [inst("i-1", "n1")]},
            slurm_nodes={
                "n1": snode(
                    "n1",
                    "DRAIN",
                    state="idle",
                    reason="slurm-burst: gpu 1: XID 79 event (Code:GpuUnhealthy)",
                )
            },
        ),
        [("fail_node", "GpuUnhealthy", "n1")],
        id="drained-by-the-gpu-health-check-and-idle",
    ),
    pytest.param(
        snap(
            [Rec("n1", NodeState.JOINED, instance_id="i-1", state_since=NOW - 500)],
            instances={"lab": [inst("i-1", "n1")]},
            slurm_nodes={
                "n1": snode(
                    "n1",
                    "DRAIN",
                    state="mixed",
                    reason="slurm-burst: gpu 1: XID 79 event (Code:GpuUnhealthy)",
                )
            },
        ),
        [],
        id="drained-by-the-gpu-health-check-jobs-still-running",
    ),
    pytest.param(
        snap(
            [Rec("n1", NodeState.JOINED, instance_id="i-1", state_since=NOW - 500)],
            instances={"lab": [inst("i-1", "n1")]},
            slurm_nodes={"n1": snode("n1", "DRAIN", state="idle", reason="admin: bad disk")},
        ),
        [],
        id="drained-by-an-admin-is-left-alone",
    ),
    pytest.param(
        snap(
            [],
            slurm_nodes={"n2": snode("n2", "POWERING_UP")},
            suspects={"resume-lost:n2": NOW - 61},
        ),
        [("fail_node", "ResumeLost", "n2")],
        id="slurm-powering-up-unknown-node-is-resumed-after-its-grace",
    ),
    pytest.param(
        snap([], slurm_nodes={"n2": snode("n2", "POWERING_UP")}),
        [],
        id="resume-lost-waits-its-grace",
    ),
    pytest.param(
        snap(
            [Rec("n2", NodeState.TERMINATED, want=Want.DOWN, state_since=NOW - 3600)],
            slurm_nodes={"n2": snode("n2", "POWERING_UP")},
        ),
        [],
        id="a-power-up-seen-once-is-not-lost-however-old-the-record",  # the hook is on its way
    ),
    pytest.param(
        snap(
            [Rec("n1", NodeState.JOINED, wg_pubkey=KEY_A)], peers=[Peer(KEY_A, ("10.77.0.2/32",))]
        ),
        [],
        id="live-peer-kept",
    ),
    pytest.param(
        snap([], peers=[Peer(KEY_B, ("10.77.0.3/32",), comment="n3")]),
        [],
        id="stale-peer-first-pass-waits",
    ),
    pytest.param(
        snap(
            [],
            peers=[Peer(KEY_B, ("10.77.0.3/32",), comment="n3")],
            suspects={f"peer:{KEY_B}": NOW - 10},
        ),
        [("remove_peer", "StalePeer", "n3")],
        id="stale-peer-second-pass-removed",
    ),
    pytest.param(
        snap(
            [Rec("n3", NodeState.TERMINATED, want=Want.DOWN)],
            addresses={"n3": "10.77.0.3"},
            suspects={"address:n3:10.77.0.3": NOW - 10},
        ),
        [("release_address", "LeakedAddress", "n3")],
        id="leaked-address-released",
    ),
    pytest.param(
        snap(
            [Rec("n3", NodeState.BOOTSTRAPPING)],
            addresses={"n3": "10.77.0.3"},
            suspects={"address:n3:10.77.0.3": NOW - 10},
        ),
        [],
        id="address-of-a-bootstrapping-node-kept",
    ),
    pytest.param(
        snap([], instances={"lab": []}, ledger_open={"i-7": "n7"}),
        [("close_ledger", "LedgerOpen", "n7")],
        id="ledger-row-of-vanished-instance-closed",
    ),
    pytest.param(
        snap([], instances={"lab": [inst("i-7", "n7")]}, ledger_open={"i-7": "n7"}),
        [],
        id="ledger-row-of-live-instance-kept",
    ),
    pytest.param(
        snap([], groups={"cpu": GroupHealth("cpu", failures=3)}),
        [("protect", "Protected", "cpu")],
        id="group-protected-after-failures",
    ),
    pytest.param(
        snap([], groups={"cpu": GroupHealth("cpu", failures=5, protected_until=NOW + 10)}),
        [],
        id="protected-group-stays",
    ),
    pytest.param(
        snap([], groups={"cpu": GroupHealth("cpu", failures=5, protected_until=NOW - 1)}),
        [("unprotect", "Unprotected", "cpu")],
        id="protected-group-cooldown-over",
    ),
]


@pytest.mark.parametrize(("snapshot", "expected"), CASES)
def test_plan(snapshot: Snapshot, expected: list[tuple[str, str, str]]) -> None:
    assert kinds(snapshot) == expected


def test_suspects_carry_first_seen_and_drop_what_is_gone() -> None:
    s = snap([], instances={"lab": [inst("i-9", "n9")]}, suspects={"instance:lab:gone": NOW - 5})
    p = plan(s, POLICY)
    assert p.suspects == {"instance:lab:i-9": NOW}
    p2 = plan(snap([], instances={"lab": [inst("i-9", "n9")]}, suspects=p.suspects), POLICY)
    assert p2.suspects == {"instance:lab:i-9": NOW}


def test_a_pass_is_idempotent() -> None:
    s = snap(
        [Rec("n1", NodeState.JOINED, instance_id="i-1")],
        instances={"lab": [inst("i-1", "n1"), inst("i-2", "n2")]},
        suspects={"instance:lab:i-2": NOW - 500},
    )
    assert plan(s, POLICY) == plan(s, POLICY)


def test_an_instance_slurm_names_for_a_node_other_than_ours_is_said_once_on_the_second_pass() -> (
    None
):
    """InstanceMismatch: 23.11+ slurmd told Slurm another instance than the node's."""
    recs = [Rec("n1", NodeState.JOINED, instance_id="i-1"),
            Rec("n2", NodeState.JOINED, instance_id="i-2"),
            Rec("n3", NodeState.BOOTING, instance_id="i-3")]  # fmt: skip
    nodes = {"n1": SlurmNode("n1", "idle", frozenset({"CLOUD"}), instance_id="i-9"),
             "n2": SlurmNode("n2", "idle", frozenset({"CLOUD"}), instance_id="i-2"),
             "n3": SlurmNode("n3", "idle", frozenset({"CLOUD"}), instance_id="i-8")}  # fmt: skip

    def said(suspects: dict[str, float], now: float) -> tuple[list[str], dict[str, float]]:
        s = Snapshot(now=now, records={r.name: r for r in recs}, slurm_nodes=nodes,
                     suspects=suspects)  # fmt: skip
        p = plan(s, POLICY)
        return [
            f"{a.code} {a.node} {a.message}" for a in p.actions if a.kind == "report"
        ], p.suspects

    first, carried = said({}, NOW)
    assert first == []  # a new instance's slurmd may not have registered yet
    second, carried = said(carried, NOW + 10)
    assert second == ["InstanceMismatch n1 Slurm's InstanceId is i-9, the node's instance is i-1"]
    third, carried = said(carried, NOW + 20)
    assert third == []  # said once
    nodes["n1"] = SlurmNode("n1", "idle", frozenset({"CLOUD"}), instance_id="i-1")
    assert said(carried, NOW + 30)[1] == {}  # all well again: nothing carried
