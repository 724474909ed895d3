"""What the hooks do, on an in-memory store: record the request and wake the daemon, or
refuse with the right exit code and record nothing."""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurm_burst.adapters.state.requestspool import RequestSpool
from slurm_burst.config import Config
from slurm_burst.core.records import StoreError
from slurm_burst.core.slurm import SchedulerError
from slurm_burst.ports import Scheduler
from slurm_burst.services.hooks import (
    EXIT_FAILED,
    EXIT_NOT_RECORDED,
    EXIT_RECORDED_STALE,
    EXIT_SPOOLED,
    run_hook,
)
from tests.conftest import lab_config_in
from tests.fakes.store import MemoryStore


@pytest.fixture()
def cfg_and_store(tmp_path: Path) -> tuple[Config, MemoryStore]:
    return lab_config_in(tmp_path), MemoryStore()


def no_slurm() -> Scheduler:
    raise AssertionError("this hook must not call Slurm")


def test_resume_hook_records_the_request_and_wakes_the_daemon(
    cfg_and_store: tuple[Config, MemoryStore], tmp_path: Path
) -> None:
    cfg, store = cfg_and_store
    store.beat(time.time(), {"pid": 1})
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    Path(cfg.daemon.socket).parent.mkdir(parents=True)
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
    cfg_and_store: tuple[Config, MemoryStore], tmp_path: Path
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


def test_bad_hostlist_or_foreign_nodes_record_nothing(
    cfg_and_store: tuple[Config, MemoryStore],
) -> None:
    cfg, store = cfg_and_store
    store.beat(time.time(), {})
    assert run_hook("resume", "burst-cpu-[1-", cfg, store, no_slurm, time.time()).code == 2
    r = run_hook("suspend", "other-[1-3]", cfg, store, no_slurm, time.time())
    assert r.code == 2 and r.unknown == ("other-1", "other-2", "other-3")
    assert store.pending_requests() == []


def test_suspend_with_a_stale_heartbeat_is_still_recorded(
    cfg_and_store: tuple[Config, MemoryStore],
) -> None:
    cfg, store = cfg_and_store
    store.beat(time.time() - 3600, {})
    r = run_hook("suspend", "burst-cpu-3", cfg, store, no_slurm, time.time())
    assert r.code == EXIT_RECORDED_STALE and "heartbeat" in r.message
    assert [q.kind for q in store.pending_requests()] == ["suspend"]


class BrokenStore(MemoryStore):
    """A state database that is locked or on a full disk: reads work (WAL), writes fail."""

    def add_request(self, *args: Any, **kwargs: Any) -> int:
        raise StoreError("state database x.db: database or disk is full")


class Marks:
    """A Slurm that records what the hook asked of it (or refuses, like a dead slurmctld)."""

    def __init__(self, refuse: bool = False) -> None:
        self.calls: list[tuple[tuple[str, ...], str | None, str | None]] = []
        self.refuse = refuse

    def __call__(self) -> Scheduler:
        return self  # type: ignore[return-value]

    def update_nodes(self, names: Any, *, state: str | None = None, reason: str | None = None,
                     **_: Any) -> None:  # fmt: skip
        if self.refuse:
            raise SchedulerError("slurm_update error: Unable to contact slurm controller")
        self.calls.append((tuple(names), state, reason))


def test_a_resume_the_database_cannot_take_is_spooled_and_drained_once(
    tmp_path: Path,
) -> None:
    """Database full: the request lands in the spool (exit 4, nodes untouched); the
    daemon's drain moves it into the database once, even if it was recorded there too."""
    cfg = lab_config_in(tmp_path)
    store = BrokenStore()
    store.beat(time.time(), {})
    spool = RequestSpool(tmp_path / "spool")
    slurm = Marks()
    r = run_hook("resume", "burst-cpu-[1-2]", cfg, store, slurm, time.time(), spool=spool)
    assert r.code == EXIT_SPOOLED and "disk is full" in r.message and slurm.calls == []
    (item,) = spool.pending()
    assert item.kind == "resume" and item.nodes == ("burst-cpu-1", "burst-cpu-2")
    assert stat.S_IMODE(os.stat(item.path).st_mode) == 0o640
    good = MemoryStore()
    good.add_request(item.kind, item.nodes, item.jobs, item.created_at, uid=item.uid)  # twice
    for it in spool.pending():  # what the daemon's drain does
        good.add_request(it.kind, it.nodes, it.jobs, it.created_at, uid=it.uid)
        spool.remove(it)
    assert [q.nodes for q in good.pending_requests()] == [("burst-cpu-1", "burst-cpu-2")]
    assert spool.pending() == []


def test_a_database_that_cannot_be_opened_spools_too(tmp_path: Path) -> None:
    cfg = lab_config_in(tmp_path)
    spool = RequestSpool(tmp_path / "spool")
    r = run_hook("suspend", "burst-cpu-1", cfg, None, Marks(), time.time(), spool=spool,
                 store_error="state.db is a symbolic link")  # fmt: skip
    assert r.code == EXIT_SPOOLED and "symbolic link" in r.message
    assert [i.kind for i in spool.pending()] == ["suspend"]


@pytest.mark.parametrize(
    ("kind", "refuse", "code", "marked"),
    [
        ("resume", False, EXIT_NOT_RECORDED, True),
        ("resume", True, EXIT_FAILED, False),
        ("suspend", False, EXIT_FAILED, False),
    ],
    ids=["resume-nodes-down", "resume-slurm-down-too", "suspend-left-to-reconcile"],
)
def test_recorded_nowhere_a_resume_sets_its_nodes_down_naming_the_cause(
    tmp_path: Path, kind: str, refuse: bool, code: int, marked: bool
) -> None:
    """Database full and the spool unwritable: a resume's nodes go DOWN with a reason
    naming the cause (Slurm requeues now); never exit 0, never silence."""
    cfg = lab_config_in(tmp_path)
    store = BrokenStore()
    store.beat(time.time(), {})
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")  # the spool's directory is a file: nothing can be written
    slurm = Marks(refuse)
    r = run_hook(kind, "burst-cpu-1", cfg, store, slurm, time.time(),
                 spool=RequestSpool(blocked / "spool"))  # fmt: skip
    assert r.code == code
    if marked:
        ((names, state, why),) = slurm.calls
        assert names == ("burst-cpu-1",) and state == "down"
        assert why is not None and "(Code:RequestNotRecorded)" in why and "disk is full" in why
    else:
        assert slurm.calls == []


def _huge_file(path: Path) -> None:
    with path.open("wb") as fh:
        fh.truncate(9 * 1024 * 1024)  # sparse: over the cap without writing it


RESUME_FILES = [
    ("not-utf8", lambda p: p.write_bytes(b'{"all_nodes": "burst-cpu-1\xff\xfe"}')),
    ("deep-nesting", lambda p: p.write_text("[" * 100_000 + "]" * 100_000)),
    (
        "huge-number",
        lambda p: p.write_text(
            '{"all_nodes":"burst-cpu-1","jobs":[{"job_id":'
            + "9" * 5000
            + ',"nodes":"burst-cpu-1"}]}'
        ),
    ),
    (
        "huge-host-number",
        lambda p: p.write_text('{"all_nodes":"burst-cpu-[1-' + "9" * 5000 + ']","jobs":[]}'),
    ),
    (
        "job-id-out-of-range",
        lambda p: p.write_text(
            '{"all_nodes":"burst-cpu-1","jobs":[{"job_id":4294967296,"nodes":"burst-cpu-1"}]}'
        ),
    ),
    ("fifo", lambda p: os.mkfifo(p)),
    ("directory", lambda p: p.mkdir()),
    ("oversized", _huge_file),
    ("empty", lambda p: p.write_bytes(b"")),
    ("missing", lambda p: None),
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("make", [m for _, m in RESUME_FILES], ids=[n for n, _ in RESUME_FILES])
def test_a_resume_is_recorded_whatever_the_resume_file_holds(
    cfg_and_store: tuple[Config, MemoryStore], tmp_path: Path, make: Callable[[Path], object]
) -> None:
    """The file only adds the jobs; the argument is Slurm's own list of nodes. A file
    that is not UTF-8, nests deeply, holds huge numbers, is a FIFO (which must not hang
    slurmctld's power-save thread), a directory or over the size cap: the request is
    recorded from the argument, with no jobs."""
    cfg, store = cfg_and_store
    store.beat(time.time(), {})
    path = tmp_path / "resume.json"
    make(path)
    r = run_hook("resume", "burst-cpu-1", cfg, store, no_slurm, time.time(),
                 env={"SLURM_RESUME_FILE": str(path)})  # fmt: skip
    assert r.code == 0, r
    (req,) = store.pending_requests()
    assert req.nodes == ("burst-cpu-1",) and req.jobs == []


def test_on_disagreement_the_argument_wins_and_only_its_jobs_are_kept(
    cfg_and_store: tuple[Config, MemoryStore], tmp_path: Path
) -> None:
    cfg, store = cfg_and_store
    store.beat(time.time(), {})
    path = tmp_path / "resume.json"
    path.write_text(
        '{"all_nodes":"burst-cpu-[1-3]","jobs":[{"job_id":41,"nodes":"burst-cpu-[1-2]"},'
        '{"job_id":42,"nodes":"burst-cpu-3"}]}'
    )
    r = run_hook("resume", "burst-cpu-[1-2]", cfg, store, no_slurm, time.time(),
                 env={"SLURM_RESUME_FILE": str(path)})  # fmt: skip
    assert r.code == 0
    (req,) = store.pending_requests()
    assert req.nodes == ("burst-cpu-1", "burst-cpu-2")
    assert [j["job_id"] for j in req.jobs] == [41]  # job 42's node was not asked for


def test_a_hostlist_with_a_huge_host_number_is_bad_input(
    cfg_and_store: tuple[Config, MemoryStore],
) -> None:
    cfg, store = cfg_and_store
    store.beat(time.time(), {})
    r = run_hook("resume", "burst-cpu-[1-" + "9" * 5000 + "]", cfg, store, no_slurm, time.time())
    assert r.code == 2 and "more than 18 digits" in r.message and len(r.message) < 400
    assert store.pending_requests() == []
