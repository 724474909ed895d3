"""The state database (SQLite) as the daemon, the hooks and the CLI use it: the store
contract, an address pool hammered from threads, a schema upgrade that keeps every node,
and the commands that read it."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_burst.adapters.state.store import SCHEMA_VERSION, Store
from slurm_burst.core.nodestate import NodeState, Want
from slurm_burst.core.records import StoreError
from tests.conftest import invoke, lab_config_in
from tests.contracts.store import StoreContract


class TestSqliteStore(StoreContract):
    @pytest.fixture()
    def store(self, tmp_path: Path) -> Iterator[Store]:
        s = Store(tmp_path / "state.db")
        yield s
        s.close()


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


OLD_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE requests (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, nodes TEXT NOT NULL,
    jobs TEXT NOT NULL DEFAULT '[]', created_at REAL NOT NULL, done_at REAL);
CREATE TABLE nodes (name TEXT PRIMARY KEY, grp TEXT NOT NULL, state TEXT NOT NULL,
    want TEXT NOT NULL, error TEXT NOT NULL DEFAULT '', message TEXT NOT NULL DEFAULT '',
    provider TEXT NOT NULL DEFAULT '', size TEXT NOT NULL DEFAULT '',
    launch_seq INTEGER NOT NULL DEFAULT 0, token TEXT NOT NULL DEFAULT '',
    instance_id TEXT NOT NULL DEFAULT '', ip TEXT NOT NULL DEFAULT '',
    host_keys TEXT NOT NULL DEFAULT '[]', wg_pubkey TEXT NOT NULL DEFAULT '',
    mesh_addr TEXT NOT NULL DEFAULT '', jobs TEXT NOT NULL DEFAULT '[]',
    requested_at REAL NOT NULL DEFAULT 0, state_since REAL NOT NULL DEFAULT 0);
CREATE TABLE mesh_addresses (address TEXT PRIMARY KEY, node TEXT NOT NULL UNIQUE,
    allocated_at REAL NOT NULL);
INSERT INTO nodes (name, grp, state, want, instance_id, mesh_addr, state_since)
    VALUES ('burst-cpu-1', 'cpu', 'joined', 'up', 'ns-1', '10.77.0.2', 5.0);
INSERT INTO mesh_addresses VALUES ('10.77.0.2', 'burst-cpu-1', 4.0);
"""


def test_a_database_of_the_previous_release_is_upgraded_keeping_every_node(
    tmp_path: Path,
) -> None:
    """The state database a daemon of the previous release left (column ``grp``, no
    groups table, schema version 0): opened, it is upgraded in place, the joined node
    and its address are still there, and the new tables exist."""
    db = tmp_path / "state.db"
    with sqlite3.connect(db) as c:
        c.executescript(OLD_SCHEMA)
    s = Store(db)
    rec = s.node("burst-cpu-1")
    assert rec is not None and (rec.group, rec.state, rec.want) == ("cpu", "joined", Want.UP)
    assert rec.instance_id == "ns-1" and s.addresses() == {"burst-cpu-1": "10.77.0.2"}
    assert rec.registered_at == 0  # the column added for the prolog, not yet seen
    s.update("burst-cpu-1", registered_at=5.5)
    assert s.nodes_named(["burst-cpu-1", "nosuch"])["burst-cpu-1"].registered_at == 5.5
    assert s.group_launch_result("cpu", ok=False) == 1  # the groups table was added
    s.transition("burst-cpu-1", NodeState.TERMINATING, 6.0)
    s.close()
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    Store(db, create=False).close()  # and a reader opens it as it is


def test_during_an_upgrade_the_hooks_leave_the_old_schema_to_the_old_daemon(
    tmp_path: Path,
) -> None:
    """The package is upgraded while the old daemon still runs: the new hooks record
    requests in the old database without changing its schema under the old daemon;
    reading nodes says to restart; the new daemon then upgrades it."""
    db = tmp_path / "state.db"
    with sqlite3.connect(db) as c:
        c.executescript(OLD_SCHEMA)
    hook = Store(db, upgrade=False)
    assert hook.outdated
    hook.add_request("resume", ["burst-cpu-2"], [], 7.0)
    assert [r.nodes for r in hook.pending_requests()] == [("burst-cpu-2",)]
    with pytest.raises(StoreError, match="restart slurm-burst"):
        hook.nodes()
    hook.close()
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == 0
        assert "grp" in {r[1] for r in c.execute("PRAGMA table_info(nodes)")}
    daemon = Store(db)  # upgrade=True: what the daemon opens
    assert daemon.node("burst-cpu-1") is not None and len(daemon.pending_requests()) == 1
    daemon.close()


def test_a_newer_schema_or_an_empty_file_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    Store(db).close()
    with sqlite3.connect(db) as c:
        c.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer than this slurm-burst"):
        Store(db)
    empty = tmp_path / "empty.db"
    empty.touch()
    with pytest.raises(StoreError, match="is empty"):
        Store(empty, create=False)
    with pytest.raises(StoreError, match="does not exist"):
        Store(tmp_path / "missing.db", create=False)


def test_nodes_and_events_commands_read_the_database(tmp_path: Path) -> None:
    cfg = lab_config_in(tmp_path)
    store = Store(Path(cfg.daemon.state_dir) / "state.db")
    store.transition("burst-cpu-1", NodeState.REQUESTED, time.time(), group="cpu", want=Want.UP)
    doc = json.loads(invoke(["--config", cfg.source, "nodes", "--json"]).stdout)
    assert [(n["name"], n["state"], n["want"]) for n in doc["nodes"]] == [
        ("burst-cpu-1", "requested", "up")
    ]
    out = invoke(["--config", cfg.source, "events"]).stdout
    assert "burst-cpu-1" in out and "node.requested" in out


def _locks_on(path: Path) -> list[str]:
    """This process's POSIX locks on ``path`` (from /proc/locks, by inode)."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    mine = str(os.getpid())
    return [
        line
        for line in Path("/proc/locks").read_text().splitlines()
        if " POSIX " in line and line.split()[4] == mine and line.split()[5] == dev
    ]


def test_opening_the_store_again_keeps_this_process_sqlite_locks(tmp_path: Path) -> None:
    """Closing any descriptor of a file drops every POSIX lock the process holds on it,
    SQLite's included: setting up the files' modes must never open an existing
    database or its -shm (a dropped -shm lock lets another process reset the WAL index
    under this connection, and its writes vanish for everyone else)."""
    path = tmp_path / "state.db"
    first = Store(path)
    first.beat(1.0, {"pid": 1})
    held = _locks_on(Path(f"{path}-shm"))
    assert held, "SQLite holds a lock on the -shm while connected"
    second = Store(path)  # what a second open (or a hook in-process) does to the files
    assert _locks_on(Path(f"{path}-shm")) == held
    second.close()
    first.beat(2.0, {"pid": 1})
    reader = Store(path, create=False)
    assert (reader.heartbeat() or {})["at"] == 2.0


def _read_until(path: str, stop: Any, out: Any) -> None:
    """What ``lab up`` does while the daemon starts: open the database for reading, over
    and over; an error other than "not there yet" is reported."""
    while not stop.is_set():
        try:
            Store(path, create=False).close()
        except StoreError as exc:
            if "locked" in str(exc):
                out.put(str(exc))
                return


def test_readers_opening_a_new_database_do_not_fail_the_daemon_creating_it(
    tmp_path: Path,
) -> None:
    """The switch to WAL takes SQLite's exclusive lock without its busy handler, and a
    reader opening the new file took the write lock to say "empty": together the
    daemon's first start failed with "database is locked" (a failed ``lab up`` in CI).
    Before the fix nearly every round failed."""
    ctx = multiprocessing.get_context("fork")
    for i in range(6):
        path = str(tmp_path / f"state-{i}.db")
        stop, out = ctx.Event(), ctx.Queue()
        readers = [ctx.Process(target=_read_until, args=(path, stop, out)) for _ in range(2)]
        for r in readers:
            r.start()
        try:
            time.sleep(0.05)
            Store(path).close()
        finally:
            stop.set()
            for r in readers:
                r.join(10)
        assert out.empty(), out.get()
