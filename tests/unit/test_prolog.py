"""The PrologSlurmctld: its verdict on a job's nodes, its wait, and the daemon's watch for
registrations that it waits on."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from slurm_burst.adapters.slurm.cli import parse_oneliners
from slurm_burst.core.nodestate import NodeState, Want
from slurm_burst.core.prolog import FAIL, READY, WAIT, judge
from slurm_burst.core.records import NodeRecord, StageRecord
from slurm_burst.core.slurm import JobOwner, SlurmNode, parse_state_field
from slurm_burst.services.lifecycle import Lifecycle
from slurm_burst.services.prolog import EXIT_FAILED, EXIT_OK, deadline_seconds, run_prolog
from slurm_burst.services.registration import Registrations
from tests.conftest import lab_config_in
from tests.fakes.clock import FakeClock
from tests.fakes.slurm import FakeScheduler
from tests.fakes.store import MemoryStore

T0 = 1_790_000_000.0


def rec(
    name: str, state: NodeState, since: float = T0, want: Want = Want.UP, **kw: object
) -> NodeRecord:
    return NodeRecord(name, "cpu", state, want, state_since=since, **kw)  # type: ignore[arg-type]


JOINED_REGISTERED = rec("a", NodeState.JOINED, registered_at=T0 + 3)


@pytest.mark.parametrize(
    ("records", "expected", "says"),
    [
        ({"a": JOINED_REGISTERED}, READY, ""),
        ({"a": rec("a", NodeState.JOINED)}, WAIT, ""),  # slurmd started, not registered
        ({}, WAIT, ""),  # the resume hook has not run yet
        ({"a": rec("a", NodeState.BOOTSTRAPPING)}, WAIT, ""),
        # an earlier life's end: this job's resume is still to come
        ({"a": rec("a", NodeState.TERMINATED, since=T0 - 60, want=Want.DOWN)}, WAIT, ""),
        ({"a": rec("a", NodeState.FAILED, since=T0 + 5, error="BootTimeout", message="slow")},
         FAIL, "node a BootTimeout: slow"),
        ({"a": rec("a", NodeState.TERMINATING, since=T0 + 5, want=Want.DOWN)}, FAIL,
         "node a terminating"),
        ({"a": rec("a", NodeState.JOINED, registered_at=T0, want=Want.DOWN)}, WAIT, ""),
        # torn down and still wanted up: a new instance comes (Provisioner._replace)
        ({"a": rec("a", NodeState.TERMINATING, since=T0 + 5, want=Want.UP)}, WAIT, ""),
        ({"a": rec("a", NodeState.TERMINATED, since=T0 + 5, want=Want.UP)}, WAIT, ""),
    ],
    ids=["ready", "not-registered", "no-record", "bootstrapping", "old-life", "failed",
         "suspended-meanwhile", "joined-but-wanted-down", "replacing", "replaced"],
)  # fmt: skip
def test_verdict_on_one_node(records: dict[str, NodeRecord], expected: str, says: str) -> None:
    v = judge(["a"], records, T0, daemon_age=1.0, stale_after=30)
    assert v.kind == expected
    assert v.message == says


def test_every_node_must_be_ready_and_one_failure_is_enough() -> None:
    ready = {"a": JOINED_REGISTERED, "b": JOINED_REGISTERED._replace(name="b")}
    assert judge(["a", "b"], ready, T0, 1.0, 30).kind == READY
    one_late = {**ready, "b": rec("b", NodeState.BOOTING)}
    assert judge(["a", "b"], one_late, T0, 1.0, 30).waiting == ("b",)
    one_failed = {**one_late, "a": rec("a", NodeState.FAILED, since=T0 + 1, error="SshUnreachable")}
    assert judge(["a", "b"], one_failed, T0, 1.0, 30).message == "node a SshUnreachable"


@pytest.mark.parametrize(("age", "says"), [(None, "never ran"), (31.0, "heartbeat 31 s old")])
def test_a_stale_daemon_fails_the_wait(age: float | None, says: str) -> None:
    v = judge(["a"], {}, T0, daemon_age=age, stale_after=30)
    assert v.kind == FAIL and says in v.message


@pytest.mark.parametrize(
    ("field", "state", "flags"),
    [
        ("IDLE+CLOUD+POWERING_UP", "idle", {"CLOUD", "POWERING_UP"}),
        ("MIXED+CLOUD", "mixed", {"CLOUD"}),
        ("IDLE*+CLOUD", "idle", {"CLOUD", "NOT_RESPONDING"}),
        ("ALLOCATED#", "allocated", {"POWERING_UP"}),
        ("DOWN+CLOUD+POWERED_DOWN", "down", {"CLOUD", "POWERED_DOWN"}),
    ],
)
def test_scontrol_state_field(field: str, state: str, flags: set[str]) -> None:
    assert parse_state_field(field) == (state, frozenset(flags))


def test_oneliners_read_name_and_state_only_before_the_reason() -> None:
    text = (
        "NodeName=burst-cpu-1 Arch=x86_64 CoresPerSocket=1 State=MIXED+CLOUD Weight=1 "
        "Reason=oops State=IDLE [root@2026-11-23T10:00:00]\n"
        "NodeName=burst-cpu-2 State=IDLE+CLOUD+POWERING_UP Partitions=burst-cpu\n"
        "Node nosuch not found\n"
        "NodeName=burst-cpu-3 State=IDLE+CLOUD+NOT_RESPONDING\n"
    )
    nodes = parse_oneliners(text)
    assert sorted(nodes) == ["burst-cpu-1", "burst-cpu-2", "burst-cpu-3"]
    assert nodes["burst-cpu-1"].state == "mixed"
    assert [n for n, node in nodes.items() if node.registered] == ["burst-cpu-1"]


# -- the daemon's watch -------------------------------------------------------------------


def watch_world() -> tuple[Registrations, MemoryStore, FakeScheduler, FakeClock]:
    clock = FakeClock()
    store = MemoryStore()
    slurm = FakeScheduler.cloud_nodes(["n1", "n2", "n3"])
    regs = Registrations(
        store, slurm, clock, threading.Event(), give_up=60, lifecycle=Lifecycle(store, clock)
    )
    for n in ("n1", "n2", "n3"):
        store.transition(n, NodeState.REQUESTED, clock.now(), group="cpu", want=Want.UP)
        for s in (NodeState.LAUNCHING, NodeState.BOOTING, NodeState.BOOTSTRAPPING,
                  NodeState.JOINED):  # fmt: skip
            store.transition(n, s, clock.now())
    return regs, store, slurm, clock


def registers(slurm: FakeScheduler, name: str) -> None:
    node = slurm.node(name)
    slurm._nodes[name] = node._replace(flags=node.flags - {"POWERED_DOWN", "POWERING_UP"})


def test_the_watch_publishes_registrations_with_one_slurm_call_a_look() -> None:
    regs, store, slurm, clock = watch_world()
    assert regs.poll_once() == set()  # nothing watched: no Slurm call at all
    assert slurm.registered_calls == 0
    for n in ("n1", "n2", "n3"):
        regs.watch(n)
    registers(slurm, "n1")
    registers(slurm, "n3")
    assert regs.poll_once() == {"n1", "n3"}
    assert slurm.registered_calls == 1
    assert store.node("n1").registered_at == clock.now()  # type: ignore[union-attr]
    assert store.node("n2").registered_at == 0  # type: ignore[union-attr]
    registers(slurm, "n2")
    assert regs.poll_once() == {"n2"}  # only n2 was still watched
    assert regs.poll_once() == set() and slurm.registered_calls == 2


def test_a_node_torn_down_or_never_registering_stops_being_watched() -> None:
    regs, store, slurm, clock = watch_world()
    regs.watch("n1")
    regs.watch("n2")
    store.transition("n1", NodeState.TERMINATING, clock.now(), want=Want.DOWN)
    regs.poll_once()
    clock.advance(61)
    regs.poll_once()
    assert regs.poll_once() == set()
    assert slurm.registered_calls == 2  # n1 dropped at once, n2 after give_up


def test_seed_watches_joined_nodes_a_restarted_daemon_has_not_seen_register() -> None:
    regs, store, slurm, _ = watch_world()
    store.update("n2", registered_at=5.0)
    regs.seed()
    registers(slurm, "n1")
    registers(slurm, "n2")
    registers(slurm, "n3")
    assert regs.poll_once() == {"n1", "n3"}


# -- the prolog's wait ----------------------------------------------------------------------


class Beating(MemoryStore):
    """A store whose daemon beats on every heartbeat read, and whose node ``ready_after``
    reads registers (or fails, with ``fail``)."""

    def __init__(self, clock: FakeClock, ready_after: int = 3, fail: str = "") -> None:
        super().__init__()
        self.clock, self.reads, self.ready_after, self.fail = clock, 0, ready_after, fail

    def heartbeat(self) -> dict[str, float]:
        self.reads += 1
        now = self.clock.now()
        if self.reads == self.ready_after:
            name = "burst-cpu-2"
            if self.fail:
                self.transition(name, NodeState.REQUESTED, now, group="cpu", want=Want.UP)
                self.transition(name, NodeState.FAILED, now, error=self.fail)
            else:
                for s in (NodeState.REQUESTED, NodeState.LAUNCHING, NodeState.BOOTING,
                          NodeState.BOOTSTRAPPING, NodeState.JOINED):  # fmt: skip
                    self.transition(name, s, now, group="cpu", want=Want.UP)
                self.update(name, registered_at=now)
        return {"at": now}


def prolog(tmp_path: Path, nodelist: str, store: MemoryStore | None, clock: FakeClock) -> object:
    cfg = lab_config_in(tmp_path)

    def opened() -> MemoryStore:
        assert store is not None, "the state store was opened for a job without burst nodes"
        return store

    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": nodelist}
    return run_prolog(env, cfg, opened, now=clock.now, sleep=clock.sleep)


def test_a_job_without_burst_nodes_passes_at_once(tmp_path: Path) -> None:
    result = prolog(tmp_path, "onprem-1", None, FakeClock())
    assert result.code == EXIT_OK and result.nodes == ()  # type: ignore[attr-defined]


def test_the_prolog_returns_once_the_node_registered(tmp_path: Path) -> None:
    clock = FakeClock()
    store = Beating(clock, ready_after=4)
    result = prolog(tmp_path, "onprem-1,burst-cpu-2", store, clock)
    assert (result.code, result.nodes) == (EXIT_OK, ("burst-cpu-2",))  # type: ignore[attr-defined]
    assert result.waited == pytest.approx(0.6)  # type: ignore[attr-defined]  # 3 polls of 0.2 s


def test_a_node_failing_fails_the_prolog_with_its_code(tmp_path: Path) -> None:
    clock = FakeClock()
    result = prolog(tmp_path, "burst-cpu-2", Beating(clock, fail="SshUnreachable"), clock)
    assert result.code == EXIT_FAILED  # type: ignore[attr-defined]
    assert result.message == "node burst-cpu-2 SshUnreachable"  # type: ignore[attr-defined]


def test_the_wait_ends_after_resume_timeout_plus_the_margin(tmp_path: Path) -> None:
    clock = FakeClock()
    result = prolog(tmp_path, "burst-cpu-[2-3]", Beating(clock, ready_after=10**9), clock)
    cfg = lab_config_in(tmp_path)
    assert result.code == EXIT_FAILED  # type: ignore[attr-defined]
    assert "burst-cpu-[2-3] not ready 150 s after" in result.message  # type: ignore[attr-defined]
    assert deadline_seconds(cfg) == 150
    assert result.waited == pytest.approx(150, abs=0.3)  # type: ignore[attr-defined]


def test_a_malformed_nodelist_fails_with_a_message(tmp_path: Path) -> None:
    result = prolog(tmp_path, "burst-cpu-[2-", None, FakeClock())
    assert result.code == EXIT_FAILED  # type: ignore[attr-defined]
    assert "SLURM_JOB_NODELIST not understood" in result.message  # type: ignore[attr-defined]


def test_slurm_node_registered_property() -> None:
    assert SlurmNode("a", "mixed", frozenset({"CLOUD"})).registered
    assert not SlurmNode("a", "down", frozenset({"CLOUD"})).registered
    assert not SlurmNode("a", "idle", frozenset({"CLOUD", "POWERING_UP"})).registered


def test_a_state_store_it_cannot_read_does_not_hold_the_job(tmp_path: Path) -> None:
    """An upgrade's old schema, a lost file: the job goes on as without a prolog."""
    from slurm_burst.core.records import StoreError

    class Unreadable(MemoryStore):
        def heartbeat(self) -> dict[str, float]:
            raise StoreError("state database x has an older release's schema")

    result = prolog(tmp_path, "burst-cpu-2", Unreadable(), FakeClock())
    assert result.code == EXIT_OK  # type: ignore[attr-defined]
    assert result.message.endswith("; job not held")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("state", "daemon_says", "code", "says"),
    [("staged", "ok", EXIT_OK, ""),
     ("staged", "fail", EXIT_FAILED, "burst-cpu-2: StagePull: disk full"),
     ("staged", None, EXIT_FAILED, "job 7's data not on burst-cpu-2 150 s after"),
     ("kept_home", None, EXIT_FAILED, "stays on-prem (StageSensitive: x); it may not run")],
    ids=["pulled", "pull-failed", "never-pulled", "kept-home"],
)  # fmt: skip
def test_a_staged_job_on_a_node_up_already_waits_for_its_data_there(
    tmp_path: Path, state: str, daemon_says: str | None, code: int, says: str
) -> None:
    """The node joined before (for another job): the prolog asks the daemon for the pull
    (a meta key) and lets the job go once the data is there."""
    clock = FakeClock()
    store = Beating(clock, ready_after=1)
    store.add_stage(StageRecord(
        owner=JobOwner(7, "games", 5, 60, "physics", "", ("burst-cpu",)), burst_only=True,
        stages=[{"src": "/d", "dst": "d"}], state=state,
        message="StageSensitive: x",
    ))  # fmt: skip
    woken: list[bool] = []

    def daemon() -> None:  # what the daemon's stage thread does when woken
        woken.append(True)
        if (7, "burst-cpu-2") not in store.pulls_asked():
            return
        if daemon_says == "ok":
            store.pulled(7, "burst-cpu-2", clock.now(), 3)
            store.pull_done(7, "burst-cpu-2")
        elif daemon_says == "fail":
            store.pull_done(7, "burst-cpu-2", "StagePull: disk full")

    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "burst-cpu-2"}
    result = run_prolog(env, lab_config_in(tmp_path), lambda: store, now=clock.now,
                        sleep=clock.sleep, wake=daemon)  # fmt: skip
    assert result.code == code and says in result.message, result
    assert woken == ([] if state == "kept_home" else [True])
