"""The NodeStore contract."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurm_burst.core.nodestate import NodeState, TransitionError, Want
from slurm_burst.core.records import StageRecord, StageState, StoreError
from slurm_burst.core.slurm import JobOwner
from slurm_burst.ports import NodeStore


class StoreContract:
    """Subclasses provide a fixture ``store`` returning an empty store."""

    def test_transitions_are_checked_and_logged_as_events(self, store: NodeStore) -> None:
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

    def test_a_new_node_starts_requested_or_terminated_only(self, store: NodeStore) -> None:
        with pytest.raises(TransitionError):
            store.transition("n1", NodeState.JOINED, 1.0, group="g")
        rec = store.transition("n2", NodeState.TERMINATED, 1.0, group="g")
        assert rec.want == Want.DOWN and store.node("n1") is None

    def test_state_since_moves_only_with_the_state(self, store: NodeStore) -> None:
        store.transition("n1", NodeState.REQUESTED, 1.0, group="g", want=Want.UP)
        store.transition("n1", NodeState.LAUNCHING, 2.0)
        store.transition("n1", NodeState.FAILED, 3.0, error="BootTimeout")
        rec = store.transition("n1", NodeState.FAILED, 4.0, error="Second")  # a second error
        assert rec.state_since == 3.0 and rec.error == "Second"
        assert store.events()[-1]["detail"] == "Second"

    def test_update_sets_fields_but_never_the_state(self, store: NodeStore) -> None:
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

    def test_nodes_are_listed_by_name(self, store: NodeStore) -> None:
        for name in ("n3", "n1", "n2"):
            store.transition(name, NodeState.TERMINATED, 1.0, group="g")
        assert [r.name for r in store.nodes()] == ["n1", "n2", "n3"]
        assert store.node("n9") is None

    def test_requests_are_kept_until_finished(self, store: NodeStore) -> None:
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
        self, store: NodeStore
    ) -> None:
        """A spooled request drained after it reached the database too is acted on
        once; drained late, it keeps its place among the others."""
        late = store.add_request("suspend", ["n2"], [], 5.0)
        a = store.add_request("resume", ["n1"], [], 2.0, uid="hook-0001")
        assert store.add_request("resume", ["n1"], [], 2.0, uid="hook-0001") == a
        b = store.add_request("resume", ["n3"], [], 1.0, uid="hook-0002")
        assert [r.id for r in store.pending_requests()] == [b, a, late]

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

    def test_heartbeat_and_meta(self, store: NodeStore) -> None:
        assert store.heartbeat() is None and store.meta_get("x") is None
        store.beat(5.0, {"pid": 42})
        assert store.heartbeat() == {"at": 5.0, "pid": 42}
        store.meta_set("batch.t1", {"nodes": ["a", "b"]})
        store.meta_set("batch.t2", {"nodes": []})
        store.meta_set("other", 1)
        assert store.meta_get("batch.t1") == {"nodes": ["a", "b"]}
        assert set(store.meta_items("batch.")) == {"batch.t1", "batch.t2"}
        store.meta_delete("batch.t1")
        store.meta_delete("batch.t1")  # twice is fine
        assert store.meta_get("batch.t1") is None

    def test_group_health_and_unavailable_sizes(self, store: NodeStore) -> None:
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

    def test_address_pool(self, store: NodeStore) -> None:
        a = store.allocate_address("a", "10.9.0.0/29", 0)
        b = store.allocate_address("b", "10.9.0.0/29", 0)
        assert (a, b) == ("10.9.0.2", "10.9.0.3")  # .1 is the hub's
        assert store.allocate_address("a", "10.9.0.0/29", 0) == a  # stable per node
        assert store.addresses() == {"a": a, "b": b}
        assert store.release_address("a") == a and store.release_address("a") is None
        assert store.allocate_address("c", "10.9.0.0/29", 0) == a  # reused once free

    def test_many_addresses_at_once_are_the_ones_given_one_by_one(self, store: NodeStore) -> None:
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

    def test_pool_exhaustion_is_a_clear_error(self, store: NodeStore) -> None:
        store.allocate_address("a", "10.9.0.0/30", 0)  # .1 hub, .2 a
        with pytest.raises(StoreError, match="no free address"):
            store.allocate_address("b", "10.9.0.0/30", 0)

    def test_a_stage_is_recorded_once_and_moves_only_from_what_it_expects(
        self, store: NodeStore
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
