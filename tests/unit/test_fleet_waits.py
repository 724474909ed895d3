"""Booting and attesting nodes hold no thread, read one shared listing, and read their
consoles when the keys are expected: a thousand-node burst within a provider's limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_burst.core.nodestate import NodeState
from slurm_burst.services.fleetview import FleetView
from slurm_burst.services.provisioner import SCOUTS, Later
from tests.conftest import wait
from tests.fakes.world import World, make_world

pytestmark = pytest.mark.unit

N = "burst-cpu-1"


def test_a_booting_node_waits_on_a_timer_not_in_a_sleep(tmp_path: Path) -> None:
    w = make_world(tmp_path)
    w.request(N)
    with pytest.raises(Later) as got:
        w.prov.drive(N, blocking=False)
    assert w.rec(N).state == NodeState.BOOTING and w.rec(N).instance_id
    assert 0 < got.value.seconds <= 1.0 and w.clock.slept == 0  # nothing slept in a worker
    w.clock.advance(3.0)  # booted (2 s): running, the console read at once (none learned)
    w.prov.drive(N, blocking=False, join=True)
    assert w.rec(N).state == NodeState.JOINED


def test_a_node_ready_to_bootstrap_asks_for_a_join_slot(tmp_path: Path) -> None:
    from slurm_burst.services.provisioner import NeedsJoinSlot

    w = make_world(tmp_path)
    w.request(N)
    w.cloud.boot_seconds = 0.0
    with pytest.raises(NeedsJoinSlot):
        w.prov.drive(N, blocking=False, join=False)
    assert w.rec(N).state == NodeState.BOOTSTRAPPING


def many(w: World, count: int) -> list[str]:
    names = w.cfg.node_groups["cpu"].node_names()[:count]
    w.store.add_request("resume", names, [], w.clock.now())
    return names


def test_many_nodes_boot_on_two_workers_and_one_listing(tmp_path: Path) -> None:
    """Two workers, twenty nodes: waits hold no thread, so all boot at once; booting
    nodes read the shared listing (no describe each) and every node joins."""
    w = make_world(tmp_path, lists_fleet=True, edits=[("[daemon]\n", "[daemon]\nworkers = 2\n")])
    names = many(w, 20)
    w.settle()
    assert {w.rec(n).state for n in names} == {NodeState.JOINED}
    assert w.cloud.calls["get"] == 0  # one listing for all, never one describe per node
    views = w.prov.views
    assert isinstance(views["lab"], FleetView) and views["lab"].listings >= 1
    assert w.cloud.calls["host_keys"] <= 20 + SCOUTS * 3


def test_consoles_are_read_when_their_keys_are_expected(tmp_path: Path) -> None:
    """Consoles that print their keys 20 s after boot: a few scouts poll; the rest wait
    for what they learn and read about once each."""
    w = make_world(tmp_path, lists_fleet=True)
    w.cloud.console_seconds = 20.0
    names = many(w, 40)
    w.settle()
    assert {w.rec(n).state for n in names} == {NodeState.JOINED}
    reads = w.cloud.calls["host_keys"]
    # scouts read every few seconds for the 20 s; a fixed 0.5 s poll would read ~40 x 40
    assert reads <= 40 + SCOUTS * 10, reads


def test_the_timers_wake_a_waiting_node_for_a_suspend(tmp_path: Path) -> None:
    """A node waiting on its timer is driven at once when Slurm suspends it (the fake
    clock runs ahead while nodes wait: the boot timeout is made far away)."""
    w = make_world(tmp_path, edits=[("boot_timeout = 30", "boot_timeout = 1e9"),
                                    ('spot_fallback = "ec2"', 'spot_fallback = ""'),
                                    ('spot_fallback = "ec2"', 'spot_fallback = ""'),  # train
                                    ('spot_fallback = "gce"', 'spot_fallback = ""'),
                                    ('spot_fallback = "az"', 'spot_fallback = ""')])  # fmt: skip
    w.cloud.never_boot.add(N)
    w.store.add_request("resume", [N], [], w.clock.now())
    w.daemon.handle_requests()
    wait(lambda: w.daemon.workers.waiting() == 1, 10, "the node to wait on a timer", every=0.01)
    w.store.add_request("suspend", [N], [], w.clock.now())
    w.settle()
    assert w.rec(N).state == NodeState.TERMINATED
