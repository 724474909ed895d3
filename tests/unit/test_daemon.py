"""The daemon's request handling and worker pool on in-memory fakes: a request becomes each
node's want, new nodes are launched in batches where the provider batches and one by one
where it does not, a duplicate resume does nothing, a resume-fail returns the node to
service, and a restart picks up every node where it was."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from slurm_burst.core.nodestate import NodeState, Want, needs_work
from slurm_burst.core.records import NodeRecord, StoreError
from tests.conftest import wait
from tests.fakes.host import FakeHost
from tests.fakes.world import World, make_world

CPU = [f"burst-cpu-{i}" for i in range(1, 9)]


@pytest.fixture()
def w(tmp_path: Path) -> World:
    return make_world(tmp_path)


@pytest.fixture()
def wb(tmp_path: Path) -> World:
    """A world whose provider launches up to 4 instances per call."""
    return make_world(tmp_path, batch_max=4)


def test_a_resume_on_a_batching_provider_is_launched_in_batches(wb: World) -> None:
    wb.store.add_request("resume", CPU, [{"job_id": 7, "nodes": "burst-cpu-[1-8]"}], wb.clock.now())
    wb.settle()
    assert wb.cloud.calls["launch_many"] == 2 and wb.cloud.calls["launch"] == 0
    assert all(wb.rec(n).state == NodeState.JOINED for n in CPU)

    def named() -> bool:  # names are tagged in the background, off the way to joining
        return sorted(i.tags.get("slurm-burst-node", "") for i in wb.cloud.live()) == sorted(CPU)

    wait(named, 10, "every instance named after its node")
    assert wb.store.pending_requests() == []
    assert wb.rec(CPU[0]).job_list() == [{"job_id": 7, "nodes": "burst-cpu-[1-8]"}]


def test_a_chunks_nodes_boot_while_the_next_chunk_still_launches(wb: World) -> None:
    """8 nodes in two launch calls of 4, the second held back (as EC2's instance bucket
    holds the later calls of a 5,000-node burst for minutes): the first call's nodes
    join meanwhile; they waited for the last call before."""
    held = threading.Event()
    launch_many = wb.cloud.launch_many

    def slow_second(spec: Any) -> Any:
        if CPU[4] in spec.names:
            assert held.wait(30), "the held launch was never let go"
        return launch_many(spec)

    wb.cloud.launch_many = slow_second  # type: ignore[method-assign]
    wb.store.add_request("resume", CPU, [], wb.clock.now())
    wb.daemon.handle_requests()
    try:
        wait(lambda: all(wb.rec(n).state == NodeState.JOINED for n in CPU[:4]), 5,
             "the first call's nodes joined while the second is held")  # fmt: skip
        assert all(wb.rec(n).state == NodeState.LAUNCHING for n in CPU[4:])
    finally:
        held.set()
    wb.settle()
    assert all(wb.rec(n).state == NodeState.JOINED for n in CPU)


def test_a_resume_on_a_provider_without_batches_goes_straight_to_the_workers(w: World) -> None:
    w.store.add_request("resume", CPU, [], w.clock.now())
    w.settle()
    assert w.cloud.calls["launch"] == 8 and w.cloud.calls["launch_many"] == 0
    assert all(w.rec(n).state == NodeState.JOINED for n in CPU)


def test_a_batch_refused_for_capacity_moves_to_the_next_size(wb: World) -> None:
    wb.cloud.capacity.add("ns.cpu2")
    wb.store.add_request("resume", CPU[:4], [], wb.clock.now())
    wb.settle()
    assert {wb.rec(n).size for n in CPU[:4]} == {"ns.cpu4"}
    assert wb.cloud.calls["launch_many"] == 2  # refused once, made once


def test_a_duplicate_resume_launches_nothing_more(w: World) -> None:
    w.store.add_request("resume", CPU[:2], [], w.clock.now())
    w.settle()
    w.store.add_request("resume", CPU[:2], [], w.clock.now())
    w.settle()
    assert w.cloud.calls["launch"] == 2 and len(w.cloud.live()) == 2


def test_a_suspend_releases_and_a_resume_fail_also_returns_the_node_to_service(
    w: World,
) -> None:
    w.store.add_request("resume", CPU[:2], [], w.clock.now())
    w.settle()
    w.store.add_request("suspend", [CPU[0]], [], w.clock.now())
    w.store.add_request("resume-fail", [CPU[1]], [], w.clock.now())
    w.settle()
    for n in CPU[:2]:
        assert (w.rec(n).state, w.rec(n).want) == (NodeState.TERMINATED, Want.DOWN)
    assert w.cloud.live() == [] and w.mesh.peers() == []
    assert "power_down_force" not in w.slurm.states_set(CPU[0])
    assert w.slurm.states_set(CPU[1])[-1] == "power_down_force"


def test_a_suspend_of_a_node_never_seen_is_recorded_and_harmless(w: World) -> None:
    w.store.add_request("suspend", ["burst-gpu-2"], [], w.clock.now())
    w.settle()
    assert w.rec("burst-gpu-2").state == NodeState.TERMINATED and w.cloud.calls["launch"] == 0


def test_names_in_no_node_group_are_skipped(w: World) -> None:
    w.store.add_request("resume", ["onprem-1", CPU[0]], [], w.clock.now())
    w.settle()
    assert w.store.node("onprem-1") is None and w.rec(CPU[0]).state == NodeState.JOINED


def test_a_restart_picks_up_every_node_where_it_was(w: World) -> None:
    """Nodes left mid-way by a dead daemon: one requested, one booting, one being torn
    down. recover() hands each to a worker; each ends where its want says."""
    w.store.add_request("resume", CPU[:3], [], w.clock.now())
    w.daemon.handle_requests()  # the daemon "dies" here: no worker ran yet
    wait(w.daemon.workers.idle, 10, "the workers")
    w.store.update(CPU[2], want=Want.DOWN)
    w.daemon.workers.recover()
    wait(w.daemon.workers.idle, 10, "the recovered workers")
    assert [w.rec(n).state for n in CPU[:3]] == [
        NodeState.JOINED, NodeState.JOINED, NodeState.TERMINATED
    ]  # fmt: skip
    assert len(w.cloud.live()) == 2


def test_the_heartbeat_says_who_leads_and_how_much_is_in_flight(w: World) -> None:
    w.daemon.beat()
    beat = w.store.heartbeat()
    assert beat is not None and beat["node_id"] == "test" and beat["in_flight"] == 0
    assert beat["at"] == w.clock.now()


def test_a_request_is_written_whole_or_not_at_all(
    wb: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store error half-way through a resume (disk full, say) leaves no node written,
    the request pending and no node claimed; the next wake-up does the whole request."""
    wb.store.add_request("resume", CPU, [], wb.clock.now())
    real, calls = wb.store.transition, []

    def third_fails(*args: Any, **kwargs: Any) -> NodeRecord:
        calls.append(args[0])
        if len(calls) == 3:
            raise StoreError("database or disk is full")
        return real(*args, **kwargs)

    monkeypatch.setattr(wb.store, "transition", third_fails)
    with pytest.raises(StoreError):
        wb.daemon.handle_requests()
    assert wb.store.nodes() == [] and len(wb.store.pending_requests()) == 1
    assert wb.daemon.workers.idle()  # the request's claims were released
    monkeypatch.setattr(wb.store, "transition", real)
    wb.settle()
    assert all(wb.rec(n).state == NodeState.JOINED for n in CPU)
    assert wb.cloud.calls["launch_many"] == 2


def test_a_duplicate_resume_brings_the_jobs_a_first_one_lacked(w: World) -> None:
    """The reconcile loop resumes a node Slurm powers up without a request (ResumeLost,
    no jobs); the hook's own request, arriving after, still says which job waits."""
    w.store.add_request("resume", CPU[:2], [], w.clock.now())
    w.daemon.handle_requests()
    job = {"job_id": 9, "nodes": "burst-cpu-[1-2]"}
    w.store.add_request("resume", CPU[:2], [job], w.clock.now())
    w.settle()
    assert [w.rec(n).job_list() for n in CPU[:2]] == [[job], [job]]
    assert w.cloud.calls["launch"] == 2


def test_each_reconcile_pass_gives_the_free_heap_back(w: World) -> None:
    """The daemon returns glibc's free pages after every pass (the soak's RSS figure)."""
    host = w.daemon.host
    assert isinstance(host, FakeHost)
    w.daemon.warm = None
    w.daemon.workers.rescan = w.daemon.stop.set  # type: ignore[method-assign]  # one pass
    w.daemon._reconcile_loop()
    assert host.released == 1


def test_a_resume_gives_slurm_every_new_nodes_mesh_address_in_one_update(w: World) -> None:
    """Before any node boots: a node powering up is never addressed by its (unresolvable)
    name, and one scontrol update carries them all."""
    w.store.add_request("resume", CPU, [], w.clock.now())
    w.daemon.handle_requests()
    first = w.slurm.updates[0]
    assert first["nodes"] == CPU and first["state"] is None
    assert first["addrs"] == [w.store.addresses()[n] for n in CPU]
    assert len(set(first["addrs"])) == 8 and all(a.startswith("10.77.0.") for a in first["addrs"])
    wait(w.daemon.workers.idle, 10, "the workers to finish")
    assert {w.rec(n).mesh_addr for n in CPU} == set(first["addrs"])  # the same in bootstrap


def test_a_node_a_hook_set_down_is_returned_even_when_slurm_refuses_the_power_down(
    w: World,
) -> None:
    """Slurm 22.05 may refuse power_down_force for a node the resume left powered down:
    the node is back in service all the same, and the repair is recorded (HookRefusal)."""
    node = "burst-cpu-3"
    w.slurm.update_nodes([node], state="down", reason="no daemon (Code:DaemonDown)")

    def refuse(nodes: Sequence[str], change: dict[str, Any]) -> str | None:
        return "Invalid node state transition" if change["state"] == "power_down_force" else None

    w.slurm.refuse = refuse
    report = w.daemon.reconciler.pass_once()
    assert report.actions == {"return_to_service": 1}, report.errors
    assert w.slurm.node(node).state != "down"
    events = [e for e in w.store.events(0) if e["node"] == node]
    assert [e["event"] for e in events] == ["reconcile.return_to_service"]
    assert events[0]["detail"].startswith("HookRefusal: ")


def test_the_reconcile_loop_protects_a_group_through_the_daemons_own_scheduler(
    w: World,
) -> None:
    """Protected mode drains the group in the Slurm the daemon was given (here the fake),
    never in one built aside from the config."""
    for _ in range(w.cfg.daemon.protect_after):  # the lab config's
        w.store.group_launch_result("cpu", ok=False)
    report = w.daemon.reconciler.pass_once()
    assert report.actions == {"protect": 1}, report.errors
    names = w.cfg.node_groups["cpu"].node_names()
    assert all("DRAIN" in w.slurm.node(n).flags for n in names)


class Served:
    """A mesh store's server whose address comes up late (the hub's, after the daemon)."""

    def __init__(self, fails: int) -> None:
        self.fails, self.tries, self.up, self.closed = fails, 0, False, False

    def start(self) -> None:
        self.tries += 1
        if self.tries <= self.fails:
            raise OSError(99, "Cannot assign requested address")
        self.up = True

    def close(self) -> None:
        self.up, self.closed = False, True


def test_a_mesh_store_is_served_once_its_address_is_up_and_closed_at_shutdown(
    tmp_path: Path,
) -> None:
    from slurm_burst.services.daemon import SERVE_RETRY

    served = Served(fails=1)
    w = make_world(tmp_path, served=[served])
    w.daemon.serve_stores()  # as lead() and each round of the main loop do
    assert served.tries == 1 and not served.up  # said, and tried again later
    w.daemon.serve_stores()
    assert served.tries == 1  # not before SERVE_RETRY
    w.clock.advance(SERVE_RETRY)
    w.daemon.serve_stores()
    assert served.tries == 2 and served.up
    w.clock.advance(SERVE_RETRY)
    w.daemon.serve_stores()
    assert served.tries == 2  # up: left alone
    w.daemon.stop.set()
    w.daemon.shutdown()
    assert served.closed


@pytest.mark.parametrize("batch_max", [1, 4])
def test_the_pool_is_never_idle_while_a_node_is_on_its_way(tmp_path: Path, batch_max: int) -> None:
    """A node whose want is written, or handed from a worker to its timer (its instance
    boots), or from a batch to a worker of its own, is held all the way: ``idle()`` never
    says done while a node is short of where it should be (it did, for an instant, and a
    test's settle read a booting node as finished)."""
    world = make_world(tmp_path, batch_max=batch_max)
    lies: list[tuple[str, str, str]] = []
    stop = threading.Event()

    def short() -> set[tuple[str, str, str]]:
        return {
            (r.name, r.state, r.want) for r in world.store.nodes() if needs_work(r.state, r.want)
        }

    def watch() -> None:
        # a node short before and after an idle() that said done was short all along
        # (the next request is made only once the pool is idle, so none in between)
        while not stop.is_set() and not lies:
            before = short()
            if before and world.daemon.workers.idle():
                lies.extend(before & short())

    watcher = threading.Thread(target=watch, daemon=True)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads change often: a gap between two holds shows
    watcher.start()
    try:
        for i in range(8):
            world.store.add_request(("resume", "suspend")[i % 2], CPU[:4], [], world.clock.now())
            world.settle()
    finally:
        stop.set()
        watcher.join(10)
        sys.setswitchinterval(switch)
    assert lies == []
