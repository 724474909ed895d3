"""The state database and the hooks, on a real SQLite file (no Slurm needed)."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from slurm_burst.adapters.state.store import Store, StoreError
from slurm_burst.config import load_config
from slurm_burst.core.nodestate import NodeState as S
from slurm_burst.core.nodestate import TransitionError
from slurm_burst.services.hooks import run_hook
from tests.conftest import invoke

LAB = Path(__file__).resolve().parents[2] / "slurm-conf" / "lab" / "slurm-burst.toml"


def test_address_pool_never_hands_out_an_address_twice(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    Store(db).close()
    got: dict[str, str] = {}
    lock = threading.Lock()

    def worker(i: int) -> None:
        s = Store(db)  # one connection per thread: like separate processes
        for j in range(10):
            addr = s.allocate_address(f"n{i}-{j}", "10.9.0.0/24", time.time())
            with lock:
                got[f"n{i}-{j}"] = addr
        s.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 80 and len(set(got.values())) == 80
    assert "10.9.0.1" not in got.values()  # the hub's
    s = Store(db)
    assert s.allocate_address("n0-0", "10.9.0.0/24", 0) == got["n0-0"]  # stable per node
    assert s.release_address("n0-0") == got["n0-0"] and s.release_address("n0-0") is None
    assert s.allocate_address("again", "10.9.0.0/24", 0) == got["n0-0"]  # reused once free


def test_pool_exhaustion_is_a_clear_error(tmp_path: Path) -> None:
    s = Store(tmp_path / "state.db")
    s.allocate_address("a", "10.9.0.0/30", 0)  # .1 hub, .2 a
    with pytest.raises(StoreError, match="no free address"):
        s.allocate_address("b", "10.9.0.0/30", 0)


def test_transitions_are_checked_and_logged_as_events(tmp_path: Path) -> None:
    s = Store(tmp_path / "state.db")
    s.transition("n1", S.REQUESTED, 1.0, grp="g", want="up")
    s.transition("n1", S.LAUNCHING, 2.0, token="t-1")
    with pytest.raises(TransitionError):
        s.transition("n1", S.JOINED, 3.0)
    rec = s.node("n1")
    assert rec is not None and rec.state == S.LAUNCHING and rec.token == "t-1"
    assert rec.state_since == 2.0 and rec.want == "up"
    assert [e["event"] for e in s.events()] == ["node.requested", "node.launching"]
    with pytest.raises(ValueError, match="unknown node columns"):
        s.transition("n1", S.BOOTING, 3.0, bogus=1)


@pytest.fixture()
def cfg_and_store(tmp_path: Path) -> tuple[object, Store]:
    text = (
        LAB.read_text()
        .replace(
            'state_dir = "/var/lib/slurm-burst-lab/daemon"', f'state_dir = "{tmp_path}/daemon"'
        )
        .replace(
            'socket = "/var/lib/slurm-burst-lab/run/daemon.sock"',
            f'socket = "{tmp_path}/daemon.sock"',
        )
    )
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    cfg = load_config(path)
    return cfg, Store(tmp_path / "daemon" / "state.db")


def no_slurm() -> object:
    raise AssertionError("this hook must not call Slurm")


def test_resume_hook_records_the_request_and_wakes_the_daemon(
    cfg_and_store: tuple, tmp_path: Path
) -> None:
    cfg, store = cfg_and_store
    store.beat(time.time(), {"pid": 1})
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(cfg.daemon.socket)
    listener.settimeout(2)
    resume_file = tmp_path / "resume.json"
    resume_file.write_text(
        '{"all_nodes":"burst-cpu-[1-2]","jobs":[{"job_id":42,"nodes":"burst-cpu-[1-2]"}]}'
    )
    r = run_hook(
        "resume",
        "burst-cpu-[1-2],other-1",
        cfg,
        store,
        no_slurm,
        time.time(),
        env={"SLURM_RESUME_FILE": str(resume_file)},
    )
    assert r.code == 0 and r.accepted == ("burst-cpu-1", "burst-cpu-2")
    assert r.unknown == ("other-1",)
    assert listener.recv(16) == b"wake"
    (req,) = store.pending_requests()
    assert req.kind == "resume" and req.nodes == ("burst-cpu-1", "burst-cpu-2")
    assert req.jobs[0]["job_id"] == 42


def test_malformed_resume_file_falls_back_to_the_argument(
    cfg_and_store: tuple, tmp_path: Path
) -> None:
    cfg, store = cfg_and_store
    store.beat(time.time(), {})
    bad = tmp_path / "resume.json"
    bad.write_text("{not json")
    r = run_hook(
        "resume",
        "burst-gpu-1",
        cfg,
        store,
        no_slurm,
        time.time(),
        env={"SLURM_RESUME_FILE": str(bad)},
    )
    assert r.code == 0
    (req,) = store.pending_requests()
    assert req.nodes == ("burst-gpu-1",) and req.jobs == []


def test_bad_hostlist_or_foreign_nodes_record_nothing(cfg_and_store: tuple) -> None:
    cfg, store = cfg_and_store
    store.beat(time.time(), {})
    assert run_hook("resume", "burst-cpu-[1-", cfg, store, no_slurm, time.time()).code == 2
    r = run_hook("suspend", "other-[1-3]", cfg, store, no_slurm, time.time())
    assert r.code == 2 and r.unknown == ("other-1", "other-2", "other-3")
    assert store.pending_requests() == []


def test_suspend_with_a_stale_heartbeat_is_still_recorded(cfg_and_store: tuple) -> None:
    cfg, store = cfg_and_store
    store.beat(time.time() - 3600, {})
    r = run_hook("suspend", "burst-cpu-3", cfg, store, no_slurm, time.time())
    assert r.code == 1 and "heartbeat" in r.message
    assert [q.kind for q in store.pending_requests()] == ["suspend"]


def test_nodes_and_events_commands_read_the_database(cfg_and_store: tuple, tmp_path: Path) -> None:
    cfg, store = cfg_and_store
    store.transition("burst-cpu-1", S.REQUESTED, time.time(), grp="cpu", want="up")
    doc = json.loads(invoke(["--config", cfg.source, "nodes", "--json"]).stdout)
    assert [(n["name"], n["state"], n["want"]) for n in doc["nodes"]] == [
        ("burst-cpu-1", "requested", "up")
    ]
    out = invoke(["--config", cfg.source, "events"]).stdout
    assert "burst-cpu-1" in out and "node.requested" in out
