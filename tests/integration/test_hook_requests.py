"""No resume or suspend request is ever lost, and root follows nothing planted beside it.

Each case runs one hook (``slurm-burst resume|suspend HOSTLIST``) in a forked child
with a mount namespace of its own, where the state directory and the spool directory are
small tmpfs volumes put in a condition:

* the state database: fine; write-locked by another connection past
  ``daemon.hook_db_timeout``; on a full filesystem; a symlink to a victim file; its -wal a
  symlink to the victim; its directory a shared sticky 1777 one;
* the spool: fine; on a full filesystem; its path a regular file;
* the hook run as root or as ``nobody`` (SlurmUser's stand-in, group ``nogroup``).

Every combination of those conditions, both hook kinds and nine hostlists (648 hooks),
runs once, spread over forked workers that each own a site (a base directory, its fake
``scontrol``'s log, its system-log socket); then each pair of conditions as each user
once more (36). Whatever the conditions: no traceback; the exit code says what
happened (docs/operations.md, "Hook exit codes") and it is true: exit 0 means one
request more in the database, 4 one in the spool, 7 the nodes set DOWN with
``(Code:RequestNotRecorded)`` (by the fake ``scontrol``, which logs its arguments), an
error line in the system log (a socket the test reads) whenever the database failed; the
victim file and the sticky directory are unchanged. A request that a hook said it kept
and cannot be found is a lost request.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util  # imported here: a child that drops to nobody cannot read /root
import grp
import itertools
import json
import logging.handlers  # noqa: F401 - imported before a child drops to nobody (see below)
import os
import shutil
import socket
import sqlite3
import stat
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

import slurm_burst.cli.hooks_cmd
import slurm_burst.services.hooks  # noqa: F401 - nobody cannot enter /root, where Python is
from slurm_burst.adapters.state.requestspool import RequestSpool
from slurm_burst.cli.main import cli
from slurm_burst.config import Config, load_config
from slurm_burst.services.daemon import drain
from slurm_burst.trusted import Writers
from slurm_burst.wiring.light import node_store
from tests.conftest import LAB_CONFIG

HOOK_WRITERS = Writers.us(user="nobody", group="nogroup")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces and nobody: needs root"),
]

NOBODY = 65534
CLONE_NEWNS = 0x00020000
DB_CONDITIONS = ("fine", "locked", "full", "symlink", "wal-symlink", "sticky-dir")
SPOOL_CONDITIONS = ("fine", "full", "a-file")
USERS = ("root", "nobody")
KINDS = ("resume", "suspend")
HOSTLISTS = ("burst-cpu-1", "burst-cpu-[1-3]", "burst-gpu-[1-2],burst-cpu-2",
             "burst-cpu-1,other-9",  # good ones, then bad ones
             "burst-cpu-[1-", "", "burst-cpu-\n1", "other-[1-2]", "burst-cpu-[3-1]")  # fmt: skip
COMBINATIONS = list(itertools.product(KINDS, HOSTLISTS, DB_CONDITIONS, SPOOL_CONDITIONS, USERS))
WORKERS = 4  # hooks at once: many of them wait (a lock held past hook_db_timeout)
TRIED: Counter[str] = Counter()


@dataclass(frozen=True)
class Site:
    base: Path
    cfg: Config
    template: Path  # a state database with the daemon's heartbeat fresh
    victim: Path
    syslog: socket.socket


@contextlib.contextmanager
def make_site() -> Iterator[Site]:
    """A site of its own: the config, a template state database, a victim, a log."""
    base = Path(tempfile.mkdtemp(prefix="sb-hookreq-", dir="/var/tmp"))
    try:
        base.chmod(0o755)
        bin_dir = base / "slurm" / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$*" >> {base}/scontrol.log\n')
        (bin_dir / "scontrol").chmod(0o755)
        (base / "scontrol.log").write_text("")
        (base / "scontrol.log").chmod(0o666)  # the hook may run as nobody
        nogroup = grp.getgrnam("nogroup").gr_gid
        for path in ("state", "spool", "log"):
            (base / path).mkdir()
            os.chown(base / path, 0, nogroup)  # as /var/lib/slurm-burst, /run/slurm-burst
            (base / path).chmod(0o770)
        log_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        log_sock.bind(str(base / "syslog.sock"))
        os.chmod(base / "syslog.sock", 0o666)
        log_sock.setblocking(False)
        text = (
            LAB_CONFIG.read_text()
            .replace("/var/lib/slurm-burst-lab/slurm/bin", str(bin_dir))
            .replace("/var/lib/slurm-burst-lab/daemon", f"{base}/state/db")
            .replace("/var/lib/slurm-burst-lab/run/spool", f"{base}/spool/requests")
            .replace("/var/lib/slurm-burst-lab/log/hooks.log", f"{base}/log/hooks.log")
            .replace("/var/lib/slurm-burst-lab", str(base / "lab"))
            .replace('group = "root"', 'group = "nogroup"')
            .replace(
                "heartbeat_stale = 60",
                f'heartbeat_stale = 60\nhook_db_timeout = 0.3\nsyslog = "{base}/syslog.sock"',
            )
        )
        config = base / "slurm-burst.toml"
        config.write_text(text)
        config.chmod(0o644)
        cfg = load_config(config)
        template = base / "template"
        template.mkdir()
        store = node_store(cfg)  # made in the real state dir, then moved aside
        store.beat(time.time() + 10**6, {"pid": 1, "node_id": "prop"})
        store.close()
        shutil.move(f"{base}/state/db", template / "db")
        victim = base / "victim"
        victim.write_text("precious\n")
        yield Site(base, cfg, template / "db", victim, log_sock)
        log_sock.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def sites() -> Iterator[list[Site]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(make_site()) for _ in range(WORKERS)]


def _fill(directory: Path) -> None:
    """Write until the filesystem says it is full."""
    with contextlib.suppress(OSError), open(directory / "fill", "wb") as fh:
        while True:
            fh.write(b"\0" * 4096)
            fh.flush()


def _unshare_mounts() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare")


def _child(site: Site, db: str, spool: str, user: str, args: list[str]) -> dict[str, object]:
    """In a private mount namespace: the case's world, the hook (in a grandchild, as the
    case's user), then, as root again, what it left (as JSON)."""
    _unshare_mounts()
    subprocess.run(["mount", "--make-rprivate", "/"], check=True, capture_output=True)
    for vol in ("state", "spool"):
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", str(site.base / vol)],
            check=True,
            capture_output=True,
        )
    nogroup = grp.getgrnam("nogroup").gr_gid
    state = site.base / "state" / "db"
    shutil.copytree(site.template, state)
    for p in (state, *state.iterdir()):
        os.chown(p, 0, nogroup)
    state.chmod(0o770)
    held = None
    if db == "locked":
        held = sqlite3.connect(state / "state.db", isolation_level=None)
        held.execute("BEGIN IMMEDIATE")
    elif db == "full":
        _fill(site.base / "state")
    elif db == "symlink":
        (state / "state.db").unlink()
        (state / "state.db").symlink_to(site.victim)
    elif db == "wal-symlink":
        (state / "state.db-wal").unlink(missing_ok=True)
        (state / "state.db-wal").symlink_to(site.victim)
    elif db == "sticky-dir":
        state.chmod(0o1777)
    spool_dir = site.base / "spool" / "requests"
    if spool == "full":
        _fill(site.base / "spool")
    elif spool == "a-file":
        spool_dir.write_text("")
    os.chown(site.base / "spool", 0, nogroup)  # as systemd makes /run/slurm-burst
    os.chmod(site.base / "spool", 0o770)
    out = _hook(args, site.cfg.source, user, nogroup)
    if held is not None:
        held.execute("ROLLBACK")
    out |= {
        "db": _db_requests(state / "state.db") if db not in ("symlink",) else 0,
        # read as the daemon reads it: SlurmUser (nobody here) and its group trusted
        "spool": len(RequestSpool(spool_dir, writers=HOOK_WRITERS).pending())
        if spool_dir.is_dir()
        else 0,
        "state_mode": stat.S_IMODE(os.lstat(state).st_mode),
    }
    return out


def _hook(args: list[str], config: str, user: str, gid: int) -> dict[str, object]:
    """The hook, in a process of its own (dropped to nobody if asked); its result."""

    def hook() -> dict[str, object]:
        if user == "nobody":
            os.setgroups([])
            os.setgid(gid)
            os.setuid(NOBODY)
        result = CliRunner().invoke(cli, ["--config", config, *args])
        crash = result.exception is not None and not isinstance(result.exception, SystemExit)
        return {"code": result.exit_code, "output": result.output[-3000:],
                "crash": repr(result.exception) if crash else ""}  # fmt: skip

    return in_child(hook)


def in_child(fn: Callable[[], dict[str, object]]) -> dict[str, object]:
    """``fn()`` in a forked child (its JSON-able result comes back over a pipe); what it
    raised comes back as ``child_error``, a child that died says so."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            try:
                said = fn()
            except BaseException as exc:  # said to the parent, which fails the test
                said = {"child_error": repr(exc)}
            os.write(w, json.dumps(said).encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    got: dict[str, object] = json.loads(b"".join(chunks) or b'{"child_error": "it died"}')
    return got


def _db_requests(path: Path) -> int:
    uri = f"file:{path}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5)) as c:
            return int(c.execute("SELECT count(*) FROM requests").fetchone()[0])
    except sqlite3.Error:
        return -1


def run_hook_in(site: Site, db: str, spool: str, user: str, args: list[str]) -> dict[str, object]:
    (site.base / "scontrol.log").write_text("")
    got = in_child(lambda: _child(site, db, spool, user, args))
    assert "child_error" not in got, got
    log = site.base / "scontrol.log"
    got["scontrol"] = log.read_text() if log.exists() else ""
    got["syslog"] = _syslog(site.syslog)
    return got


def _syslog(sock: socket.socket) -> str:
    lines = []
    with contextlib.suppress(BlockingIOError):
        while True:
            lines.append(sock.recv(65536).decode(errors="replace"))
    return "\n".join(lines)


def check(site: Site, kind: str, hostlist: str, db: str, spool: str, user: str) -> None:
    TRIED[db] += 1
    TRIED[f"spool-{spool}"] += 1
    TRIED[user] += 1
    got = run_hook_in(site, db, spool, user, [kind, hostlist])
    shown = f"{kind} {hostlist!r} db={db} spool={spool} as {user}: {got}"
    code = got["code"]
    assert not got["crash"] and "Traceback" not in str(got["output"]), shown
    assert site.victim.read_text() == "precious\n", f"wrote through a planted link: {shown}"
    if db == "sticky-dir":
        assert got["state_mode"] == 0o1777, f"changed the mode of a shared dir: {shown}"
    added_db = int(str(got["db"]))  # the template database holds no request
    if code == 2:
        assert added_db <= 0 and got["spool"] == 0 and not got["scontrol"], shown
        return
    db_ok = db == "fine"
    spool_ok = spool == "fine"
    if db_ok:
        assert code == 0 and added_db == 1 and got["spool"] == 0, shown
        return
    assert "state database" in str(got["syslog"]) or "state.db" in str(got["syslog"]), shown
    if spool_ok:
        assert code == 4 and got["spool"] == 1 and added_db <= 0, shown
        return
    if kind == "resume":
        assert code == 7, shown
        assert "state=down" in str(got["scontrol"]) and "RequestNotRecorded" in str(
            got["scontrol"]
        ), shown
    else:
        assert code == 1 and not got["scontrol"], shown


def in_workers(sites: list[Site], cases: list[tuple[str, str, str, str, str]]) -> list[str]:
    """Each case checked once, case i by worker i mod len(sites) (a forked process that
    owns ``sites[i]``); what failed, one line a case. TRIED gets every worker's counts."""
    pipes = []
    for w, own in enumerate(sites):
        r, wr = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                TRIED.clear()
                mine = []
                for case in cases[w :: len(sites)]:
                    try:
                        check(own, *case)
                    except AssertionError as exc:
                        mine.append(str(exc).splitlines()[0][:2000])
                    except BaseException as exc:  # said to the parent, which fails the test
                        mine.append(f"{case}: {exc!r}")
                with os.fdopen(wr, "w") as out:
                    json.dump({"failed": mine, "tried": dict(TRIED)}, out)
            finally:
                os._exit(0)
        os.close(wr)
        pipes.append((pid, r))
    failed: list[str] = []
    for pid, r in pipes:
        with os.fdopen(r) as said:
            text = said.read()
        os.waitpid(pid, 0)
        got = json.loads(text or '{"failed": ["a worker died"], "tried": {}}')
        failed += got["failed"]
        TRIED.update(got["tried"])
    return failed


@pytest.mark.timeout(900)
def test_no_request_is_lost_whatever_the_disk_and_the_lock_do(sites: list[Site]) -> None:
    failed = in_workers(sites, COMBINATIONS)
    assert not failed, f"{len(failed)} of {len(COMBINATIONS)} hooks:\n" + "\n".join(failed[:20])


@pytest.mark.parametrize("db", DB_CONDITIONS)
@pytest.mark.parametrize("spool", SPOOL_CONDITIONS)
@pytest.mark.parametrize("user", USERS)
def test_each_condition_once(sites: list[Site], db: str, spool: str, user: str) -> None:
    """Every pair of conditions, as each user, once more with a hostlist of its own (on
    the first site)."""
    check(sites[0], "resume", "burst-cpu-[1-2]", db, spool, user)


def test_how_many_ran_per_class() -> None:
    """Printed for the issue's note (pytest -s): the examples each condition got."""
    print(f"\nhooks per condition: {dict(sorted(TRIED.items()))}")
    assert sum(TRIED[c] for c in DB_CONDITIONS) == len(COMBINATIONS) + 36


def test_a_spooled_request_in_the_database_too_is_acted_on_once(tmp_path: Path) -> None:
    """The hook spooled a request that its database write had in fact committed (the
    error came after): the daemon's drain adds it once, removes the file, and a second
    drain (a crash before the file's removal) adds nothing."""
    from slurm_burst.adapters.state.store import Store

    store = Store(tmp_path / "state" / "state.db")
    spool = RequestSpool(tmp_path / "spool")
    uid = "0123456789abcdef0123456789abcdef"
    store.add_request("resume", ["burst-cpu-1"], [{"job_id": 7}], 100.0, uid=uid)
    spool.put(uid, "resume", ["burst-cpu-1"], [{"job_id": 7}], 100.0)
    spool.put("f" * 32, "suspend", ["burst-cpu-2"], [], 50.0)  # older: it comes first
    (item,) = [i for i in spool.pending() if i.uid == uid]
    assert drain(spool, store, 200.0) == 2
    assert [(r.kind, r.nodes) for r in store.pending_requests()] == [
        ("suspend", ("burst-cpu-2",)),
        ("resume", ("burst-cpu-1",)),
    ]
    spool.put(uid, "resume", ["burst-cpu-1"], [{"job_id": 7}], 100.0)  # the file again
    assert drain(spool, store, 300.0) == 1 and len(store.pending_requests()) == 2
    assert spool.pending() == [] and not Path(item.path).exists()


@pytest.mark.parametrize(
    "content",
    [b"", b"\xff\xfe", b"[]", b'{"uid": "x"}', b"[" * 100_000, b'{"uid": "0123456789", '
     b'"kind": "resume", "nodes": ["a b"], "jobs": [], "created_at": 1}'],
    ids=["empty", "garbage", "list", "no-fields", "deep", "bad-node"],
)  # fmt: skip
def test_a_spool_file_that_is_no_request_is_set_aside(tmp_path: Path, content: bytes) -> None:
    spool = RequestSpool(tmp_path / "spool")
    spool.put("a" * 32, "resume", ["burst-cpu-1"], [], 1.0)
    (tmp_path / "spool" / "0-bad.request").write_bytes(content)
    (tmp_path / "spool" / "1-link.request").symlink_to("/etc/passwd")
    os.mkfifo(tmp_path / "spool" / "2-fifo.request")
    assert [i.nodes for i in spool.pending()] == [("burst-cpu-1",)]
    assert sorted(p.name for p in (tmp_path / "spool" / "rejected").iterdir()) == [
        "0-bad.request",
        "2-fifo.request",
    ]
    assert not os.path.lexists(tmp_path / "spool" / "1-link.request")
