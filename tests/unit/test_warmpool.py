"""The warm pool keeper on the fake Slurm: the first nodes of the pool powered up when a
window opens (or an override asks), the others powered down after their partition's
SuspendTime idle, nothing asked twice; the slurm.conf exclusion; the ledger's rule; and
``slurm-burst group warm``."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest

from slurm_burst.adapters.state.store import Store
from slurm_burst.config.load import parse_config
from slurm_burst.core.records import WarmOverride
from slurm_burst.core.slurm import SlurmNode
from slurm_burst.core.warm import PoolNode, pool_moves
from slurm_burst.services.slurmconf import render
from slurm_burst.services.warmpool import WarmKeeper
from slurm_burst.wiring.daemon import warm_settings
from slurm_burst.wiring.ledger import chargeback_settings
from tests.conftest import invoke
from tests.fakes.clock import FakeClock
from tests.fakes.slurm import FakeScheduler
from tests.fakes.store import MemoryStore
from tests.unit.test_config import GOOD, write

WARM = """
[partitions.burst-gpu]
suspend_time = 300

[node_groups.gpu.warm.day]
nodes = 2
days = "mon-fri"
start = "08:00"
end = "20:00"
"""
CFG, _ = parse_config(GOOD + WARM)
NODES = ["gpu-01", "gpu-02", "gpu-03"]


def at(weekday: int, hour: int) -> time.struct_time:  # 2026-11-23 was a Monday
    return time.localtime(time.mktime((2026, 11, 23 + weekday, hour, 0, 0, 0, 0, -1)))


def keeper(local: time.struct_time) -> tuple[WarmKeeper, FakeScheduler, MemoryStore, FakeClock]:
    assert CFG is not None
    sched = FakeScheduler.cloud_nodes(NODES, "burst-gpu")
    store, clock = MemoryStore(), FakeClock()
    keeper = WarmKeeper(warm_settings(CFG), sched, store, clock, local=lambda _t: local)
    return keeper, sched, store, clock


def joined(sched: FakeScheduler, *names: str) -> None:
    for n in names:  # registered, idle, up
        sched._nodes[n] = SlurmNode(n, "idle", frozenset({"CLOUD"}), ("burst-gpu",))


def test_pool_moves() -> None:
    pool = [PoolNode("a", False, False, True), PoolNode("b", True, True, True),
            PoolNode("c", True, True, True), PoolNode("d", False, False, False)]  # fmt: skip
    assert pool_moves(pool, 2, {"b": 999, "c": 299}, 300) == (["a"], [])
    assert pool_moves(pool, 1, {"b": 300, "c": 300}, 300) == (["a"], ["b", "c"])
    assert pool_moves(pool, 4, {}, 300) == (["a"], [])  # d is down: the reconcile loop's


def test_a_window_powers_the_first_nodes_up_once_and_its_end_powers_them_down() -> None:
    k, sched, store, clock = keeper(at(0, 9))  # Monday 09:00
    assert k.pools == {"gpu": ["gpu-02", "gpu-03"]}  # the group's last nodes
    assert k.pass_once() == {"gpu": (2, ["gpu-02", "gpu-03"], [])}
    assert sched.updates == [{"nodes": ["gpu-02", "gpu-03"], "state": "power_up",
                              "reason": None, "addrs": None}]  # fmt: skip
    assert k.pass_once() == {"gpu": (2, [], [])}  # powering up: not asked again
    joined(sched, "gpu-02", "gpu-03")
    k.local = lambda _t: at(0, 21)  # the window is over: idle for the partition's 300 s
    assert k.pass_once() == {"gpu": (0, [], [])}
    clock.advance(299)
    assert k.pass_once() == {"gpu": (0, [], [])}
    clock.advance(1)
    assert k.pass_once() == {"gpu": (0, [], ["gpu-02", "gpu-03"])}
    assert [e["event"] for e in store.events()] == ["warm.power_up"] * 2 + ["warm.power_down"] * 2


def test_a_busy_pool_node_stays_and_an_override_keeps_nodes_up() -> None:
    k, sched, store, clock = keeper(at(5, 12))  # Saturday: no window
    joined(sched, "gpu-02")
    sched._nodes["gpu-03"] = SlurmNode("gpu-03", "allocated", frozenset({"CLOUD"}), ())
    clock.advance(1000)
    k.pass_once()
    clock.advance(400)
    assert k.pass_once() == {"gpu": (0, [], ["gpu-02"])}  # gpu-03 runs a job: it stays
    store.set_warm_override("gpu", WarmOverride(2, clock.now() + 3600))
    k2, _sched, _s, _c = keeper(at(5, 12))
    k2.store, k2.clock = store, clock
    assert k2.pass_once() == {"gpu": (2, ["gpu-02", "gpu-03"], [])}
    clock.advance(3601)
    assert k2.want("gpu", clock.now()) == 0


def test_the_pool_is_excluded_from_slurms_suspend_and_its_window_idle_is_the_sites() -> None:
    assert CFG is not None
    fragment = render(CFG, "22.05")["slurm-burst.conf"]
    assert "\nSuspendExcNodes=gpu-[02-03]\n" in fragment
    from slurm_burst.services.chargeback import Chargeback

    cb = Chargeback(chargeback_settings(CFG), None, None, None)  # type: ignore[arg-type]
    monday_9 = datetime(2026, 11, 23, 9, 0).astimezone()
    assert cb._warm_launch("gpu-03", monday_9)
    assert not cb._warm_launch("gpu-01", monday_9)  # not in the pool
    assert not cb._warm_launch("gpu-03", datetime(2026, 11, 28, 9, 0).astimezone())  # Sat


def test_group_warm_cli(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cfg = write(tmp_path, GOOD + WARM + f'\n[daemon]\nstate_dir = "{state}"\n')
    Store(state / "state.db")  # as the daemon makes it
    r = invoke(["--config", str(cfg), "group", "warm", "gpu", "--nodes", "2", "--for", "2h"])
    assert "2 of gpu-[02-03] kept up until" in r.stdout
    shown = invoke(["--config", str(cfg), "group", "list"]).stdout
    assert "2/2" in shown
    for args, said in [
        (["--nodes", "3", "--for", "2h"], "the warm pool of gpu has 2 (gpu-[02-03])"),
        (["--nodes", "1", "--for", "2w"], "a whole number and s, m, h or d"),
        (["--nodes", "1", "--for", "31d"], "between a minute and 30 days"),
        (["--nodes", "1"], "give --nodes and --for (or --off)"),
    ]:
        r = invoke(["--config", str(cfg), "group", "warm", "gpu", *args], expect=2)
        assert said in r.stderr, r.stderr
    assert (
        "override ended" in invoke(["--config", str(cfg), "group", "warm", "gpu", "--off"]).stdout
    )


@pytest.mark.parametrize("group", ["nope"])
def test_group_warm_names_an_unknown_group(tmp_path: Path, group: str) -> None:
    cfg = write(tmp_path, GOOD + WARM + f'\n[daemon]\nstate_dir = "{tmp_path}"\n')
    Store(tmp_path / "state.db")
    r = invoke(["--config", str(cfg), "group", "warm", group, "--off"], expect=2)
    assert "no node group 'nope'" in r.stderr
