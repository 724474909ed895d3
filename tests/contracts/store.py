"""The NodeStore contract, part by part: what every implementation of a part of the
state port does (the SQLite store passes all of it; each in-memory part its own)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurm_burst.core.nodestate import NodeState, TransitionError, Want
from slurm_burst.core.records import (
    Batch,
    Placement,
    StageRecord,
    StageState,
    StoreError,
    WarmOverride,
)
from slurm_burst.core.slurm import JobOwner
from slurm_burst.ports import (
    AddressPool,
    GroupBook,
    LaunchBook,
    Leadership,
    NodeBook,
    NodeStore,
    PassBook,
    RequestBook,
    StageBook,
)


class NodeBookContract:
    """Subclasses provide a fixture ``store`` returning an empty one."""

    def test_transitions_are_checked_and_logged_as_events(self, store: NodeBook) -> None:
        rec = store.transition("n1", NodeState.REQUESTED, 1.0, group="g", want=Want.UP)
        assert (rec.group, rec.state, rec.want, rec.state_since) == ("g", "requested", "up", 1.0)
        store.transition("n1", NodeState.LAUNCHING, 2.0, token="t-1")
        with pytest.raises(TransitionError):
            store.transition("n1", NodeState.JOINED, 3.0)
        rec2 = store.node("n1")
        assert rec2 is not None and rec2.state == NodeState.LAUNCHING and rec2.token == "t-1"
        assert rec2.state_since == 2.0 and rec2.want == Want.UP and rec2.group == "g"
        assert [e["event"] for e in store.events()] == ["node.requested", "node.launching"]
        with pytest.raises(ValueError, match="unknown node fields"):
            store.transition("n1", NodeState.BOOTING, 3.0, bogus=1)

    def test_a_new_node_starts_requested_or_terminated_only(self, store: NodeBook) -> None:
        with pytest.raises(TransitionError):
            store.transition("n1", NodeState.JOINED, 1.0, group="g")
        rec = store.transition("n2", NodeState.TERMINATED, 1.0, group="g")
        assert rec.want == Want.DOWN and store.node("n1") is None

    def test_state_since_moves_only_with_the_state(self, store: NodeBook) -> None:
        store.transition("n1", NodeState.REQUESTED, 1.0, group="g", want=Want.UP)
        store.transition("n1", NodeState.LAUNCHING, 2.0)
        store.transition("n1", NodeState.FAILED, 3.0, error="BootTimeout")
        rec = store.transition("n1", NodeState.FAILED, 4.0, error="Second")  # a second error
        assert rec.state_since == 3.0 and rec.error == "Second"
        assert store.events()[-1]["detail"] == "Second"

    def test_update_sets_fields_but_never_the_state(self, store: NodeBook) -> None:
        store.transition("n1", NodeState.REQUESTED, 1.0, group="g", want=Want.UP)
        store.update("n1", want=Want.DOWN, ip="10.0.0.9", host_keys='[["ssh-ed25519", "AAAA"]]')
        rec = store.node("n1")
        assert rec is not None and (rec.want, rec.ip) == (Want.DOWN, "10.0.0.9")
        assert rec.host_key_list() == [("ssh-ed25519", "AAAA")]
        with pytest.raises(ValueError, match="update cannot set"):
            store.update("n1", state=NodeState.JOINED)
        with pytest.raises(ValueError, match="update cannot set"):
            store.update("n1", bogus="x")
        assert len(store.events()) == 1  # an update is not an event

    def test_nodes_are_listed_by_name(self, store: NodeBook) -> None:
        for name in ("n3", "n1", "n2"):
            store.transition(name, NodeState.TERMINATED, 1.0, group="g")
        assert [r.name for r in store.nodes()] == ["n1", "n2", "n3"]
        assert store.node("n9") is None


class RequestBookContract:
    def test_requests_are_kept_until_finished(self, store: RequestBook) -> None:
        a = store.add_request("resume", ["n1", "n2"], [{"job_id": 7}], 1.0)
        b = store.add_request("suspend", ["n3"], [], 2.0)
        assert a != b
        pending = store.pending_requests()
        assert [(r.id, r.kind, r.nodes) for r in pending] == [
            (a, "resume", ("n1", "n2")),
            (b, "suspend", ("n3",)),
        ]
        assert pending[0].jobs == [{"job_id": 7}] and pending[0].created_at == 1.0
        store.finish_request(a, 3.0)
        assert [r.id for r in store.pending_requests()] == [b]

    def test_one_uid_is_one_request_and_requests_come_in_the_order_made(
        self, store: RequestBook
    ) -> None:
        """A spooled request drained after it reached the database too is acted on
        once; drained late, it keeps its place among the others."""
        late = store.add_request("suspend", ["n2"], [], 5.0)
        a = store.add_request("resume", ["n1"], [], 2.0, uid="hook-0001")
        assert store.add_request("resume", ["n1"], [], 2.0, uid="hook-0001") == a
        b = store.add_request("resume", ["n3"], [], 1.0, uid="hook-0002")
        assert [r.id for r in store.pending_requests()] == [b, a, late]


class StageBookContract:
    def test_a_stage_is_recorded_once_and_moves_only_from_what_it_expects(
        self, store: StageBook
    ) -> None:
        rec = StageRecord(
            owner=JobOwner(42, "alice", 1001, 1001, "phys", "", ("burst-gpu",)), burst_only=True,
            stages=[{"src": "/d/a", "dst": "a"}],
            state=StageState.REQUESTED, created_at=1.0, updated_at=1.0,
        )  # fmt: skip
        assert store.add_stage(rec) == rec
        # asked again (a slurmctld restart re-runs stage-in): the record stays as it is
        assert store.update_stage(42, 2.0, state=StageState.PUSHING)
        assert store.add_stage(replace(rec, state=StageState.REQUESTED)).state == "pushing"
        assert not store.update_stage(42, 3.0, expect=[StageState.REQUESTED], state="staged")
        datasets = [{"dst": "a", "manifest": "ab" * 32, "bytes": 3}]
        assert store.update_stage(42, 4.0, expect=["pushing"], state="staged", datasets=datasets)
        got = store.stage(42)
        assert got is not None and got.datasets == datasets and got.updated_at == 4.0
        assert [s.job_id for s in store.stages(["staged"])] == [42] and not store.stages(["failed"])
        # a failed stage asked again starts over
        assert store.update_stage(42, 5.0, state=StageState.FAILED, message="store down")
        again = store.add_stage(replace(rec, updated_at=6.0))
        assert again.state == StageState.REQUESTED and again.message == "" and not again.datasets
        assert store.stage(7) is None
        assert store.forget_stages(5.0) == 0 and store.forget_stages(7.0) == 1
        assert store.stages() == []

    def test_pulls_are_asked_answered_and_forgotten_with_their_stage(
        self, store: StageBook
    ) -> None:
        owner = JobOwner(42, "alice", 1001, 1001, "phys", "", ("burst-gpu",))
        staged = StageState.STAGED
        store.add_stage(StageRecord(owner, True, [], staged, created_at=1.0, updated_at=1.0))
        assert store.pulled_on(42) == [] and store.pulls_asked() == []
        store.pulled(42, "burst-2", 2.0, 10)
        store.pulled(42, "burst-10", 2.0, 10)
        store.pulled(420, "burst-1", 2.0, 10)  # another job's (no stage of its own)
        assert store.pulled_on(42) == ["burst-10", "burst-2"]
        store.ask_pull(42, "burst-3", 3.0)
        store.ask_pull(42, "burst-4", 3.0)
        assert store.pulls_asked() == [(42, "burst-3"), (42, "burst-4")]
        store.pull_done(42, "burst-3", "StagePull: disk full")
        store.pull_done(42, "burst-4")
        store.pull_done(42, "burst-4")  # twice is fine
        assert store.pulls_asked() == [] and store.pull_failure(42, "burst-4") == ""
        assert store.pull_failure(42, "burst-3") == "StagePull: disk full"
        assert store.forget_stages(0.5) == 0  # the stage stays: so do its pulls
        assert store.pulled_on(42) == ["burst-10", "burst-2"] and store.pulled_on(420) == []
        assert store.forget_stages(5.0) == 1
        assert store.pulled_on(42) == [] and store.pull_failure(42, "burst-3") == ""


class AddressPoolContract:
    def test_address_pool(self, store: AddressPool) -> None:
        a = store.allocate_address("a", "10.9.0.0/29", 0)
        b = store.allocate_address("b", "10.9.0.0/29", 0)
        assert (a, b) == ("10.9.0.2", "10.9.0.3")  # .1 is the hub's
        assert store.allocate_address("a", "10.9.0.0/29", 0) == a  # stable per node
        assert store.addresses() == {"a": a, "b": b}
        assert store.release_address("a") == a and store.release_address("a") is None
        assert store.allocate_address("c", "10.9.0.0/29", 0) == a  # reused once free

    def test_many_addresses_at_once_are_the_ones_given_one_by_one(self, store: AddressPool) -> None:
        assert store.allocate_address("b", "10.9.0.0/29", 0) == "10.9.0.2"
        got = store.allocate_addresses(["a", "b", "c", "d", "e", "f", "g"], "10.9.0.0/29", 0)
        # b keeps its own; the others take .3 to .6 in order; f and g find the pool full
        assert got == {"a": "10.9.0.3", "b": "10.9.0.2", "c": "10.9.0.4", "d": "10.9.0.5",
                       "e": "10.9.0.6"}  # fmt: skip
        assert store.addresses() == got
        assert store.release_address("c") == "10.9.0.4"
        assert store.allocate_addresses(["g", "a"], "10.9.0.0/29", 0) == {
            "g": "10.9.0.4", "a": "10.9.0.3"
        }  # fmt: skip

    def test_pool_exhaustion_is_a_clear_error(self, store: AddressPool) -> None:
        store.allocate_address("a", "10.9.0.0/30", 0)  # .1 hub, .2 a
        with pytest.raises(StoreError, match="no free address"):
            store.allocate_address("b", "10.9.0.0/30", 0)


class GroupBookContract:
    def test_group_health_and_unavailable_sizes(self, store: GroupBook) -> None:
        assert [store.group_launch_result("cpu", ok=False) for _ in range(3)] == [1, 2, 3]
        assert store.group_launch_result("cpu", ok=True) == 0
        store.protect_group("cpu", 2000.0, "why")
        g = store.groups()["cpu"]
        assert g.protected(1999.0) and not g.protected(2001.0) and g.reason == "why"
        store.unprotect_group("cpu")
        assert not store.groups()["cpu"].protected(0)
        store.mark_unavailable("lab", "ns.cpu2", 100.0, "InsufficientInstanceCapacity")
        assert store.unavailable(50.0) == {
            ("lab", "ns.cpu2"): (100.0, "InsufficientInstanceCapacity")
        }
        assert store.unavailable(150.0) == {}

    def test_a_warm_override_is_kept_until_ended(self, store: GroupBook) -> None:
        assert store.warm_override("gpu") is None
        store.set_warm_override("gpu", WarmOverride(2, 100.0))
        assert store.warm_override("gpu") == WarmOverride(2, 100.0)
        assert store.warm_override("cpu") is None
        store.set_warm_override("gpu", None)
        store.set_warm_override("gpu", None)  # twice is fine
        assert store.warm_override("gpu") is None


class LaunchBookContract:
    def test_the_installation_id_is_made_once(self, store: LaunchBook) -> None:
        first = store.installation(lambda: "abcd1234")
        assert first == "abcd1234" and store.installation(lambda: "other") == first

    def test_a_batch_is_kept_until_it_ends(self, store: LaunchBook) -> None:
        b = Batch("t-1", ("a", "b"), "aws", "c5.large", "cpu", 2, "spot", "fleet", "pg-1")
        assert store.batch("t-1") is None
        store.begin_batch(b)
        store.begin_batch(Batch("t-2", (), "aws", "c5.large", "cpu"))
        assert store.batch("t-1") == b and store.batch("t-2") is not None
        store.end_batch("t-1")
        store.end_batch("t-1")  # twice is fine
        assert store.batch("t-1") is None and store.batch("t-2") is not None

    def test_placement_groups_are_known_before_they_are_made(self, store: LaunchBook) -> None:
        store.set_placement(Placement("pg-1", "aws"))
        assert store.placements() == {"pg-1": Placement("pg-1", "aws", made=False)}
        store.set_placement(Placement("pg-1", "aws", made=True))
        store.set_placement(Placement("pg-2", "gce"))
        assert store.placements()["pg-1"].made and not store.placements()["pg-2"].made
        store.forget_placement("pg-1")
        assert list(store.placements()) == ["pg-2"]

    def test_a_notice_is_acted_on_once_and_a_replacement_remembered(
        self, store: LaunchBook
    ) -> None:
        assert store.notice_seen("i-1", "n1", "terminate", 5.0)
        assert not store.notice_seen("i-1", "n1", "terminate", 6.0)
        assert store.notice_seen("i-2", "n1", "stop", 6.0)
        assert store.replaced("n1") is None
        store.set_replaced("n1", 1.0, 2.0)
        assert store.replaced("n1") == (1.0, 2.0) and store.replaced("n2") is None


class LeadershipContract:
    def test_heartbeat_and_followers(self, store: Leadership) -> None:
        assert store.heartbeat() is None and store.followers() == {}
        store.beat(5.0, {"pid": 42})
        assert store.heartbeat() == {"at": 5.0, "pid": 42}
        store.follower("b", {"at": 6.0, "pid": 7, "leader": "a"})
        store.follower("c", {"at": 6.0, "pid": 8, "leader": "a"})
        assert store.followers() == {"b": {"at": 6.0, "pid": 7, "leader": "a"},
                                     "c": {"at": 6.0, "pid": 8, "leader": "a"}}  # fmt: skip
        store.follower("b", None)
        store.follower("b", None)  # twice is fine
        assert list(store.followers()) == ["c"]


class PassBookContract:
    def test_the_last_passes_are_kept(self, store: PassBook) -> None:
        assert store.last_pass() is None and store.suspects() == {}
        assert store.policy_report() is None
        store.record_pass({"ended": 5.0, "actions": {"terminate": 1}})
        store.set_suspects({"instance:lab:i-1": 3.0})
        store.set_policy_report({"jobs": [{"job": 7}]})
        assert store.last_pass() == {"ended": 5.0, "actions": {"terminate": 1}}
        assert store.suspects() == {"instance:lab:i-1": 3.0}
        assert store.policy_report() == {"jobs": [{"job": 7}]}
        store.set_suspects({})
        assert store.suspects() == {}


class StoreContract(
    NodeBookContract,
    RequestBookContract,
    StageBookContract,
    AddressPoolContract,
    GroupBookContract,
    LaunchBookContract,
    LeadershipContract,
    PassBookContract,
):
    """The whole port: every part, and writes to several parts as one."""

    def test_atomically_lands_all_or_nothing(self, store: NodeStore) -> None:
        with store.atomically():
            store.transition("n1", NodeState.REQUESTED, 1.0, group="g", want=Want.UP)
            store.transition("n2", NodeState.REQUESTED, 1.0, group="g", want=Want.UP)
            with pytest.raises(TransitionError):  # a failed write inside is undone alone
                store.transition("n1", NodeState.JOINED, 2.0)
            store.update("n2", jobs="[1]")
        assert [(r.name, r.state, r.jobs) for r in store.nodes()] == [
            ("n1", NodeState.REQUESTED, "[]"),
            ("n2", NodeState.REQUESTED, "[1]"),
        ]
        with pytest.raises(RuntimeError), store.atomically():
            store.transition("n3", NodeState.REQUESTED, 3.0, group="g")
            store.update("n1", want=Want.DOWN)
            raise RuntimeError("the daemon fails half-way through a request")
        assert [(r.name, r.want) for r in store.nodes()] == [("n1", Want.UP), ("n2", Want.UP)]
        assert [e["node"] for e in store.events()] == ["n1", "n2"]
        store.set_warm_override("gpu", WarmOverride(1, 9.0))
        with pytest.raises(RuntimeError), store.atomically():  # across parts
            store.begin_batch(Batch("t-9", ("n1",), "aws", "c5.large", "g"))
            store.set_warm_override("gpu", None)
            store.allocate_address("n1", "10.9.0.0/29", 0)
            raise RuntimeError("the daemon fails half-way")
        assert store.batch("t-9") is None and store.addresses() == {}
        assert store.warm_override("gpu") == WarmOverride(1, 9.0)
