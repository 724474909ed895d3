"""One owner of node state: every write of a node record goes through
``services.lifecycle``; its steps keep a record to what each state may hold."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from slurm_burst.core.cloud import Instance
from slurm_burst.core.nodestate import NodeState, TransitionError, Want
from slurm_burst.services import lifecycle as lifecycle_module
from slurm_burst.services.lifecycle import Lifecycle
from tests.fakes.clock import FakeClock
from tests.fakes.store import MemoryStore

PRODUCT = Path(lifecycle_module.__file__).parents[1]  # slurm_burst/
WRITES = {"transition", "update"}  # the node book's writes
OWNERS = {PRODUCT / "services" / "lifecycle.py"}  # and the store adapter, which is the book


def _receiver(node: ast.expr) -> str:
    """The last name of what a method is called on: ``self.store`` -> 'store'."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def test_no_module_but_the_lifecycle_writes_a_node_record() -> None:
    found = []
    seen = 0
    for path in sorted(PRODUCT.rglob("*.py")):
        if path in OWNERS or path.parent.name == "state":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr == "transition" or (
                node.func.attr in WRITES and _receiver(node.func.value) in {"store", "db"}
            ):
                found.append(f"{path.relative_to(PRODUCT)}:{node.lineno}")
        seen += 1
    assert seen > 100  # the walk sees the package
    assert found == []


def test_every_service_that_moves_nodes_asks_the_lifecycle() -> None:
    for name in ("daemon", "launcher", "provisioner", "reconciler", "registration"):
        text = (PRODUCT / "services" / f"{name}.py").read_text()
        assert "self.lifecycle." in text, name


@pytest.fixture()
def life() -> tuple[Lifecycle, MemoryStore, FakeClock]:
    store, clock = MemoryStore(), FakeClock()
    return Lifecycle(store, clock), store, clock


def test_a_node_lives_requested_to_terminated_and_keeps_nothing_of_its_instance(
    life: tuple[Lifecycle, MemoryStore, FakeClock],
) -> None:
    lc, store, clock = life
    rec = lc.asked_up("n1", "cpu", None, clock.now(), '[{"job_id": 7}]')
    assert (rec.state, rec.want, rec.launch_seq, rec.group) == ("requested", Want.UP, 1, "cpu")
    rec = lc.launching(rec, token="t-1", provider="lab", size="s", market="", placement="")
    assert rec.state == NodeState.LAUNCHING and rec.token == "t-1"
    lc.booting([(rec, Instance("i-1", "n1", "pending", "lab", "s", private_ips=("10.0.0.5",)))])
    booted = store.node("n1")
    assert booted is not None and (booted.instance_id, booted.ip) == ("i-1", "10.0.0.5")
    lc.bootstrapping("n1", "10.0.0.5", [("ssh-ed25519", "AAAA")])
    lc.meshed("n1", "pub=", "10.77.0.2")
    lc.joined("n1")
    clock.sleep(3)
    lc.registered("n1", clock.now())
    got = store.node("n1")
    assert got is not None and got.state == NodeState.JOINED and got.registered_at > 0
    assert got.host_key_list() == [("ssh-ed25519", "AAAA")] and got.instance_id == "i-1"
    got = lc.terminating(got, replacing=False)
    assert got.want == Want.DOWN and lc.terminating(got, replacing=False) == got  # once
    lc.terminated("n1")
    end = store.node("n1")
    assert end is not None and end.state == NodeState.TERMINATED
    assert (end.ip, end.wg_pubkey, end.mesh_addr, end.host_keys) == ("", "", "", "[]")
    states = [e["event"] for e in store.events() if e["event"].startswith("node.")]
    assert states == ["node.requested", "node.launching", "node.booting",
                      "node.bootstrapping", "node.joined", "node.terminating",
                      "node.terminated"]  # fmt: skip
    again = lc.asked_up("n1", "cpu", end, clock.now(), "[]")
    assert again.launch_seq == 2 and again.error == ""


def test_a_relaunch_writes_only_what_changed_and_a_failure_is_wanted_down(
    life: tuple[Lifecycle, MemoryStore, FakeClock],
) -> None:
    lc, store, clock = life
    rec = lc.asked_up("n1", "cpu", None, clock.now(), "[]")
    rec = lc.launching(rec, token="t-1", provider="lab", size="a", market="", placement="")
    same = lc.launching(rec, token="t-1", provider="lab", size="a", market="", placement="")
    assert same == rec
    nxt = lc.launching(rec, token="t-2", provider="lab", size="b", market="", placement="")
    assert (nxt.state, nxt.token, nxt.size) == (NodeState.LAUNCHING, "t-2", "b")
    assert store.node("n1") == nxt  # what it returns is what it wrote
    with pytest.raises(TransitionError):
        lc.joined("n1")  # the machine still holds: launching cannot join
    failed = lc.failed("n1", "BootTimeout", "x" * 2000)
    assert failed.want == Want.DOWN and len(failed.message) == 500


def test_a_released_node_says_why_and_is_wanted_down(
    life: tuple[Lifecycle, MemoryStore, FakeClock],
) -> None:
    lc, store, clock = life
    lc.asked_up("n2", "cpu", None, clock.now(), "[]")
    lc.released("n2", "JobFailed", "job 7 lost n1 (BootTimeout)")
    rec = store.node("n2")
    assert rec is not None and (rec.want, rec.error) == (Want.DOWN, "JobFailed")
    assert store.events()[-1]["event"] == "node.released"
    lc.first_seen_down("n3", "cpu")
    n3 = store.node("n3")
    assert n3 is not None and (n3.state, n3.want) == (NodeState.TERMINATED, Want.DOWN)
