"""The daemon's stage-out decisions (services/outputs.py) with the state store, the
queue and the clock faked: which job is synced, sealed, held for, reopened; and what a
record says was lost. The syncs themselves (node program, store, promotion) are tested
against a real S3 server (tests/integration/test_stageout.py) and in the lab."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, cast

import pytest

from slurm_burst.adapters.metrics.prom import Metrics
from slurm_burst.adapters.storage.tree import LocalTree
from slurm_burst.core.nodestate import NodeState, Want
from slurm_burst.core.records import OutputRecord, OutputState, StageRecord, StageState
from slurm_burst.core.remote import RemoteError
from slurm_burst.core.slurm import JobOwner, SlurmJob
from slurm_burst.core.staging import (
    CorruptOutput,
    Layout,
    StorageError,
    namespace,
    output_manifest,
)
from slurm_burst.services.outputs import OutputPorts, Outputs, OutputSettings
from slurm_burst.services.staging import Stager, StagingSettings
from slurm_burst.services.transfers import StorePrices, TransferBook
from tests.fakes.clock import FakeClock
from tests.fakes.ledger import FakeLedger
from tests.fakes.slurm import FakeScheduler
from tests.fakes.store import MemoryStore
from tests.unit.test_transfers import MemoryObjects

HOME = "/results/42"
VERSION = "ab" * 32


class Unreachable:
    """A connector to nodes that never answer (the sync fails as SSH would)."""

    def __init__(self) -> None:
        self.tried: list[str] = []

    def connect(self, host: str, host_keys: Sequence[tuple[str, str]], deadline: float) -> Any:
        self.tried.append(host)
        raise RemoteError(f"{host}: no answer", "SshUnreachable")


class Promoter:
    def __init__(self, gate: threading.Event | None = None) -> None:
        self.calls: list[tuple[str, str, str, str]] = []
        self.gate = gate

    def promote(self, user: str, account: str, manifest: str, home: str) -> dict[str, Any]:
        self.calls.append((user, account, manifest, home))
        if self.gate is not None:
            self.gate.wait(10)
        return {"files": 3, "bytes": 300}


def setup(
    jobs: Sequence[SlurmJob] = (), node_state: NodeState | None = NodeState.JOINED,
    promoter: Promoter | None = None, deadline: float = 120.0,
) -> tuple[Outputs, MemoryStore, FakeClock, Unreachable, Promoter]:  # fmt: skip
    clock, store = FakeClock(), MemoryStore()
    owner = JobOwner(42, "alice", 1000, 1000, "physics", "", ("burst-cpu",))
    store.add_stage(StageRecord(owner, True, [], StageState.STAGED, created_at=clock.now()))
    store.add_outputs([OutputRecord(42, "ckpt", HOME, sync=60, updated_at=clock.now())])
    if node_state is not None:
        store.transition("burst-1", NodeState.REQUESTED, clock.now(), group="cpu", want=Want.UP)
        if node_state != NodeState.REQUESTED:
            for s in (NodeState.LAUNCHING, NodeState.BOOTING, NodeState.BOOTSTRAPPING):
                store.transition("burst-1", s, clock.now())
            store.transition("burst-1", NodeState.JOINED, clock.now(), ip="10.0.0.5")
    connector, promoter = Unreachable(), promoter or Promoter()
    stager = Stager(settings=StagingSettings(prefix="sb/"), store=cast(Any, MemoryObjects()),
                    tree=LocalTree(), clock=clock)  # fmt: skip
    ports = OutputPorts(store=store, stager=stager, clock=clock, connector=connector,
                        scheduler=FakeScheduler(jobs=jobs), promoter=promoter)  # fmt: skip
    outputs = Outputs(OutputSettings(node_dir="/stage", release_deadline=deadline), ports)
    return outputs, store, clock, connector, promoter


def running(state: str = "RUNNING") -> SlurmJob:
    return SlurmJob(42, "train", state, "burst-cpu", nodes="burst-[1-2]")


def started(outputs: Outputs) -> list[tuple[int, bool]]:
    """What a pass starts, without the threads: (job, final) each."""
    calls: list[tuple[int, bool]] = []

    def start(job_id: int, final: bool) -> int:
        calls.append((job_id, final))
        return 1

    outputs._start = start  # type: ignore[method-assign]
    return calls


def test_a_running_job_has_its_first_node_noted_and_is_synced_when_due() -> None:
    outputs, store, clock, _, _ = setup([running()])
    calls = started(outputs)
    assert outputs.pass_once() == 0
    [out] = store.outputs(42)
    assert (out.node, out.state) == ("burst-1", OutputState.WAITING)
    clock.advance(30)
    assert outputs.pass_once() == 0 and calls == []  # sync=60: not yet
    clock.advance(31)
    outputs.pass_once()
    assert calls == [(42, False)]


def test_a_sync_that_fails_keeps_the_last_version_and_says_why() -> None:
    outputs, store, _, connector, _ = setup([running()])
    outputs.pass_once(force=True)
    store.update_output(42, "ckpt", 0, state=OutputState.SYNCED, manifest=VERSION, files=3)
    outputs.sync_job(42)
    [out] = store.outputs(42)
    assert connector.tried == ["10.0.0.5"]
    assert (out.state, out.manifest) == (OutputState.SYNCED, VERSION)
    assert out.message.startswith("last sync failed: SshUnreachable")


def test_a_sync_on_notice_is_tried_at_once_and_gives_up_at_its_deadline() -> None:
    """A reclaim's last sync (services/interruptions.py): tried at once whatever sync=
    says, a failed one not counted as done; one under way is waited for only until the
    deadline; a job without running outputs is not tried."""
    outputs, store, _, connector, _ = setup([running()])
    outputs.pass_once(force=True)  # the output's node noted: burst-1
    assert outputs.sync_now([42, 43], 5.0) == []  # the node does not answer: not done
    assert connector.tried == ["10.0.0.5"]
    [out] = store.outputs(42)
    assert out.message.startswith("last sync failed: SshUnreachable"), out
    outputs._busy.add(42)  # a periodic sync under way, that does not end in time
    assert outputs.sync_now([42], 1.0) == []
    assert connector.tried == ["10.0.0.5"]  # not tried again past its deadline
    assert outputs._busy == {42}  # the periodic one's still


def test_an_ended_job_whose_node_is_gone_brings_its_last_version_home_and_says_what_is_lost(
) -> None:  # fmt: skip
    outputs, store, _, _, promoter = setup([], node_state=None)
    store.update_output(42, "ckpt", 0, state=OutputState.SYNCED, manifest=VERSION, files=3,
                        node="burst-1", synced_at=1_790_000_100)  # fmt: skip
    calls = started(outputs)
    outputs.pass_once(force=True)
    assert calls == [(42, True)]  # gone from the queue: over
    outputs.seal(42)
    assert promoter.calls == [("alice", "physics", VERSION, HOME)]
    [out] = store.outputs(42)
    assert out.state == OutputState.LOST
    assert f"{HOME} holds the version synced at 1790000100 (3 files)" in out.message
    assert "what the job wrote after it is lost" in out.message
    assert [e["event"] for e in store.events()][-1] == "output.lost"


def test_a_promotion_that_fails_is_tried_again_until_it_is_home() -> None:
    class Flaky(Promoter):
        def promote(self, user: str, account: str, manifest: str, home: str) -> dict[str, Any]:
            self.calls.append((user, account, manifest, home))
            if len(self.calls) == 1:
                raise StorageError("store s3: GET ...: HTTP 503", "ServiceUnavailable")
            return {"files": 3, "bytes": 300}

    outputs, store, clock, _, promoter = setup([], node_state=None, promoter=Flaky())
    store.update_output(42, "ckpt", 0, state=OutputState.ENDED, manifest=VERSION, files=3,
                        node="burst-1")  # fmt: skip
    calls = started(outputs)
    outputs.pass_once(force=True)
    outputs.seal(42)
    [out] = store.outputs(42)
    assert out.state == OutputState.ENDED and "to be tried again: ServiceUnavailable" in out.message
    calls.clear()
    clock.advance(5)
    outputs.pass_once(force=True)
    assert calls == []  # not before RETRY
    clock.advance(11)
    outputs.pass_once(force=True)
    assert calls == [(42, True)]
    outputs.seal(42)
    assert store.outputs(42)[0].state == OutputState.SEALED and len(promoter.calls) == 2


def test_a_version_brought_home_is_in_the_ledger_at_the_stores_egress_price() -> None:
    outputs, store, clock, _, _ = setup([], node_state=None)
    ledger = FakeLedger()
    outputs.book = TransferBook("lab", StorePrices(store="s3", egress_per_gb=0.09), clock,
                                ledger)  # fmt: skip
    store.update_output(42, "ckpt", 0, state=OutputState.SYNCED, manifest=VERSION, files=3,
                        node="burst-1")  # fmt: skip
    outputs.seal(42)
    outputs.seal(42)  # sealed already: nothing again
    [t] = ledger.moved.values()
    assert (t.direction, t.job_id, t.account, t.user, t.node) == ("out", 42, "physics",
                                                                 "alice", "burst-1")  # fmt: skip
    assert (t.bytes_sent, t.manifest, t.per_gb) == (300, VERSION, 0.09)


def test_a_job_that_never_ran_on_a_cloud_node_has_nothing_to_bring_home() -> None:
    outputs, store, _, _, promoter = setup([SlurmJob(42, "t", "CANCELLED", "burst-cpu")])
    outputs.seal(42)
    [out] = store.outputs(42)
    assert (out.state, promoter.calls) == (OutputState.SEALED, [])
    assert "ran on no cloud node" in out.message


def test_a_job_over_before_a_pass_saw_it_is_sealed_from_the_node_it_joined_on() -> None:
    outputs, store, clock, connector, _ = setup([])
    for node in ("burst-10", "burst-9", "burst-1"):  # each made the job's directories
        store.pulled(42, node, 0.0, 0)
    store.pulled(420, "burst-0", 0.0, 0)  # another job's
    outputs.seal(42)
    [out] = store.outputs(42)
    assert out.node == "burst-1" and connector.tried == ["10.0.0.5"]
    assert out.state == OutputState.WAITING  # the final sync failed: tried again later
    assert out.message.startswith("the final sync failed, to be tried again: SshUnreachable")
    clock.advance(121)  # past staging.release_deadline since the first try
    outputs.seal(42)
    [out] = store.outputs(42)
    assert out.state == OutputState.LOST and "no version was synced" in out.message
    assert "no final sync: SshUnreachable" in out.message


def test_a_requeued_job_running_again_opens_its_sealed_outputs() -> None:
    outputs, store, clock, _, _ = setup([running()])
    store.update_output(42, "ckpt", clock.now(), state=OutputState.SEALED, manifest=VERSION,
                        node="burst-1")  # fmt: skip
    started(outputs)
    outputs.pass_once(force=True)
    assert store.outputs(42)[0].state == OutputState.SYNCED  # and resumes from VERSION
    clock.advance(86401)  # sealed a day ago: its job is no longer looked for
    store.update_output(42, "ckpt", clock.now() - 86401, state=OutputState.SEALED)
    assert outputs.pass_once(force=True) == 0
    assert store.outputs(42)[0].state == OutputState.SEALED


def test_a_suspended_node_is_held_until_its_outputs_are_home_or_the_deadline() -> None:
    gate = threading.Event()  # the node is gone: its last version's promotion hangs
    outputs, store, clock, _, promoter = setup(
        [], node_state=NodeState.REQUESTED, promoter=Promoter(gate), deadline=120
    )
    outputs.metrics = metrics = Metrics()
    store.update_output(42, "ckpt", 0, state=OutputState.SYNCED, manifest=VERSION, files=3,
                        node="burst-1", synced_at=1_790_000_100)  # fmt: skip
    node = store.node("burst-1")
    assert node is not None and [r.job_id for r in outputs.holding("burst-1")] == [42]
    try:
        assert outputs.hold(node, lambda: False) is True  # the promotion hangs: deadline
    finally:
        gate.set()
    assert clock.monotonic() >= 120
    [out] = store.outputs(42)
    assert out.state == OutputState.LOST and "staging.release_deadline (120 s)" in out.message
    assert "the version synced at 1790000100 (3 files) is in the store" in out.message
    events = [e["event"] for e in store.events()]
    assert "node.held_for_outputs" in events and events[-1] == "output.lost"
    assert promoter.calls  # the seal had started: it was what the node waited for
    assert outputs.holding("burst-1") == []
    said = metrics.text().decode()
    assert "slurm_burst_outputs_lost_total 1.0" in said
    assert "slurm_burst_outputs_held_nodes 0.0" in said  # let go: none held now
    assert "slurm_burst_outputs_release_seconds_left +Inf" in said


def test_a_daemon_that_stops_leaves_a_held_node_as_it_is() -> None:
    outputs, store, _, _, _ = setup([running()])
    node = store.node("burst-1")
    assert node is not None
    store.update_output(42, "ckpt", 0, node="burst-1")
    assert outputs.hold(node, lambda: True) is False
    assert store.outputs(42)[0].state == OutputState.WAITING


@pytest.mark.parametrize("state", ["PENDING", "REQUEUED", "SUSPENDED", "CONFIGURING"])
def test_a_job_that_is_not_over_is_neither_synced_nor_sealed(state: str) -> None:
    outputs, _, _, _, _ = setup([running(state)])
    calls = started(outputs)
    outputs.pass_once(force=True)
    assert calls == []


class Corrupt(Promoter):
    """A promotion that finds ``bad`` came back from the store wrong (nothing replaced)."""

    def __init__(self, bad: list[str]) -> None:
        super().__init__()
        self.bad = bad

    def promote(self, user: str, account: str, manifest: str, home: str) -> dict[str, Any]:
        self.calls.append((user, account, manifest, home))
        raise CorruptOutput(f"{home}: {len(self.bad)} files came back wrong", bad=self.bad)


def ended_with_a_version(outputs: Outputs, store: MemoryStore) -> tuple[Any, MemoryObjects]:
    """The output's version in the store (its manifest and objects), the job over."""
    a, b = "aa" * 32, "bb" * 32
    manifest = output_manifest(HOME, [["a", 1, a, False], ["b", 2, b, False]], "test")
    outputs.stager.commit("physics", manifest)
    objects = cast(MemoryObjects, outputs.stager.store)
    layout = Layout("sb/", namespace("physics"))
    for e in manifest.entries:
        objects.write_bytes(layout.object(e.object_name()), b"stored")
    store.update_output(42, "ckpt", 0, state=OutputState.ENDED, manifest=manifest.id,
                        node="burst-1", files=2)  # fmt: skip
    return manifest, objects


def test_a_version_that_comes_back_wrong_is_sent_again_from_its_held_node() -> None:
    outputs, store, _, connector, promoter = setup([], promoter=Corrupt(["a"]))
    manifest, objects = ended_with_a_version(outputs, store)
    layout = Layout("sb/", namespace("physics"))
    outputs.seal(42)
    assert len(promoter.calls) == 1
    [out] = store.outputs(42)
    assert (out.state, out.manifest) == (OutputState.SYNCED, "")  # synced again, then home
    assert "1 files came back from the store wrong: 1 objects dropped" in out.message
    assert [e["event"] for e in store.events()][-1] == "output.sent_again"
    kept = {e.path for e in manifest.entries if layout.object(e.object_name()) in objects.objects}
    assert kept == {"b"}  # the bad one dropped: the node's sync sends it again
    outputs.seal(42)  # the next pass: the final sync again, from the node
    assert connector.tried == ["10.0.0.5"]


def test_a_version_that_comes_back_wrong_after_its_node_is_gone_is_never_promoted() -> None:
    outputs, store, clock, _, promoter = setup([], node_state=None, promoter=Corrupt(["a"]),
                                               deadline=60)  # fmt: skip
    ended_with_a_version(outputs, store)
    outputs.seal(42)
    [out] = store.outputs(42)
    assert out.state == OutputState.ENDED and "not home yet" in out.message
    clock.advance(61)
    outputs.seal(42)
    [out] = store.outputs(42)
    assert out.state == OutputState.LOST and "StageOutCorrupt" in out.message
    assert len(promoter.calls) == 2
