"""Nothing is acted on from an untrusted writer (hardening round three, class 2).

The daemon's drain of the request spool, the mesh store's grant key and the config's
drop-ins, each fed files of generated owners and modes under directories of generated
owners and modes, as root (the daemon) with SlurmUser played by ``nobody``: what the
rule trusts (root, the daemon's user and SlurmUser own the file and every directory
above it; group-writable only in a trusted group; world-writable only a root-owned
sticky directory above the file's own) is taken, and anything else is never acted on
(a spooled request is set aside in rejected/ with the reason logged, a key or a
drop-in refused). The model below restates the rule independently of
``slurm_burst.trusted``.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_burst.adapters.state.requestspool import RequestSpool
from slurm_burst.adapters.state.store import Store
from slurm_burst.adapters.storage.mesh import load_key
from slurm_burst.config import load_config
from slurm_burst.config.load import check_config
from slurm_burst.core.staging import StorageUnavailable
from slurm_burst.services.daemon import drain
from slurm_burst.trusted import Writers
from tests.conftest import examples, lab_config_in

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="files of other owners: needs root")

NOBODY = pwd.getpwnam("nobody")
SLURM_UID, SLURM_GID = NOBODY.pw_uid, NOBODY.pw_gid  # SlurmUser, played by nobody
STRANGER, STRANGER_GID = 4242, 4243  # another member of the site, no name
WRITERS = Writers(frozenset({0, SLURM_UID}), frozenset({0, SLURM_GID}))
OWNERS = st.sampled_from([0, SLURM_UID, STRANGER])
GROUPS = st.sampled_from([0, SLURM_GID, STRANGER_GID])
FILE_MODES = st.sampled_from([0o600, 0o640, 0o660, 0o644, 0o664, 0o666, 0o602, 0o400])
DIR_MODES = st.sampled_from([0o700, 0o755, 0o770, 0o2770, 0o775, 0o777, 0o1777, 0o1770])


def trusted(uid: int, gid: int, mode: int, *, own_dir: bool = False, is_dir: bool = False) -> bool:
    """The rule, as the issue states it."""
    if uid not in WRITERS.uids:
        return False
    if mode & 0o002 and not (is_dir and not own_dir and uid == 0 and mode & 0o1000):
        return False
    return not (mode & 0o020 and gid not in WRITERS.gids)


def made(path: Path, uid: int, gid: int, mode: int) -> None:
    os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, mode)


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    """A root-owned 0755 directory outside /tmp's shared space."""
    d = Path(tempfile.mkdtemp(prefix="trusted-", dir="/var/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def request(uid: str, nodes: list[str], kind: str = "resume") -> bytes:
    body = {"uid": uid, "kind": kind, "nodes": nodes, "jobs": [], "created_at": time.time()}
    return json.dumps(body).encode()


@settings(max_examples=examples(1500), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    f_uid=OWNERS, f_gid=GROUPS, f_mode=FILE_MODES,
    d_uid=OWNERS, d_gid=GROUPS, d_mode=DIR_MODES,
    p_uid=OWNERS, p_gid=GROUPS, p_mode=DIR_MODES,
)  # fmt: skip
def test_a_spooled_request_is_acted_on_only_from_a_trusted_writer(
    base: Path,
    caplog: pytest.LogCaptureFixture,
    f_uid: int, f_gid: int, f_mode: int,
    d_uid: int, d_gid: int, d_mode: int,
    p_uid: int, p_gid: int, p_mode: int,
) -> None:  # fmt: skip
    work = Path(tempfile.mkdtemp(dir=base))
    try:
        parent, spool_dir = work / "run", work / "run" / "spool"
        spool_dir.mkdir(parents=True)
        uid = os.urandom(16).hex()
        file = spool_dir / f"{time.time_ns():020d}-{uid}.request"
        file.write_bytes(request(uid, ["burst-cpu-1"]))
        made(file, f_uid, f_gid, f_mode)
        made(spool_dir, d_uid, d_gid, d_mode)
        made(parent, p_uid, p_gid, p_mode)
        expect = (
            trusted(f_uid, f_gid, f_mode)
            and trusted(d_uid, d_gid, d_mode, own_dir=True, is_dir=True)
            and trusted(p_uid, p_gid, p_mode, is_dir=True)
        )
        store = Store(str(work / "state.db"), group=None)
        try:
            with caplog.at_level(logging.WARNING):
                taken = drain(RequestSpool(spool_dir, writers=WRITERS), store, time.time())
            recorded = [r.nodes for r in store.pending_requests()]
        finally:
            store.close()
        shown = f"file {f_uid}:{f_gid} {f_mode:o}, dir {d_uid}:{d_gid} {d_mode:o}, " \
                f"parent {p_uid}:{p_gid} {p_mode:o}"  # fmt: skip
        if expect:
            assert taken == 1 and recorded == [("burst-cpu-1",)], shown
            assert not file.exists(), shown
        else:
            assert taken == 0 and recorded == [], f"acted on an untrusted request: {shown}"
            assert (spool_dir / "rejected" / file.name).exists(), shown
            assert "spool.rejected" in caplog.text and "does not act on it" in caplog.text
    finally:
        caplog.clear()
        shutil.rmtree(work, ignore_errors=True)


def _as_slurm_user(spool_dir: Path, uid: str, nodes: list[str]) -> None:
    """A hook's spooling, in a child that runs as SlurmUser (nobody), as slurmctld runs
    the hooks."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(SLURM_GID)
            os.setuid(SLURM_UID)
            RequestSpool(spool_dir, SLURM_GID).put(uid, "resume", nodes, [], time.time())
            code = 0
        except BaseException as exc:
            os.write(2, f"as SlurmUser: {exc!r}\n".encode())
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_hooks_as_slurm_user_are_taken_and_a_stranger_and_a_reused_uid_are_not(
    base: Path, caplog: pytest.LogCaptureFixture
) -> None:
    work = Path(tempfile.mkdtemp(dir=base))
    work.chmod(0o755)  # SlurmUser passes through it to the spool
    spool_dir = work / "spool"
    spool_dir.mkdir(mode=0o2770)
    made(spool_dir, 0, SLURM_GID, 0o2770)  # as the daemon makes it
    store = Store(str(work / "state.db"), group=None)
    try:
        first = os.urandom(16).hex()
        _as_slurm_user(spool_dir, first, ["burst-cpu-1"])
        _as_slurm_user(spool_dir, first, ["burst-cpu-2"])  # the same uid, another request
        planted = spool_dir / f"{time.time_ns():020d}-{'a' * 32}.request"
        planted.write_bytes(request("a" * 32, ["burst-gpu-1"], "suspend"))
        made(planted, STRANGER, SLURM_GID, 0o640)  # a member of SlurmUser's group
        forged = spool_dir / f"{time.time_ns():020d}-forged.request"
        forged.write_bytes(request("b" * 16 + "\nrequest.unspooled uid=x", ["burst-cpu-3"]))
        made(forged, SLURM_UID, SLURM_GID, 0o640)
        with caplog.at_level(logging.INFO):
            taken = drain(RequestSpool(spool_dir, writers=WRITERS), store, time.time())
        assert taken == 1
        assert [r.nodes for r in store.pending_requests()] == [("burst-cpu-1",)]
        rejected = sorted(p.name for p in (spool_dir / "rejected").iterdir())
        assert len(rejected) == 3 and planted.name in rejected and forged.name in rejected
        assert f"request uid {first} already names request" in caplog.text
        assert "user" not in caplog.text or f"uid {STRANGER}" in caplog.text
        assert "request.unspooled uid=x" not in caplog.text.replace("\\n", "")  # no forged line
        assert sum("request.unspooled" in r.getMessage() for r in caplog.records) == 1
        # SlurmUser not configured: its own requests are not taken either
        _as_slurm_user(spool_dir, os.urandom(16).hex(), ["burst-cpu-4"])
        assert drain(RequestSpool(spool_dir), store, time.time()) == 0
    finally:
        store.close()
        shutil.rmtree(work, ignore_errors=True)


@settings(max_examples=examples(500), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(f_uid=OWNERS, f_gid=GROUPS, d_uid=OWNERS, d_gid=GROUPS, d_mode=DIR_MODES)
def test_a_grant_key_is_used_only_if_root_wrote_it(
    base: Path, f_uid: int, f_gid: int, d_uid: int, d_gid: int, d_mode: int
) -> None:
    work = Path(tempfile.mkdtemp(dir=base))
    try:
        state = work / "state"
        state.mkdir()
        key = state / "mesh-store-x.key"
        key.write_bytes(os.urandom(32).hex().encode())
        made(key, f_uid, f_gid, 0o600)
        made(state, d_uid, d_gid, d_mode)
        writers = Writers(frozenset({0}), frozenset({0, SLURM_GID}))  # the daemon's rule
        ok = f_uid == 0 and d_uid == 0 and not d_mode & 0o002
        ok = ok and not (d_mode & 0o020 and d_gid not in writers.gids)
        if ok:
            assert load_key(key, create=False, writers=writers) == key.read_bytes()
        else:
            with pytest.raises(StorageUnavailable, match="does not act on it"):
                load_key(key, create=False, writers=writers)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize(
    ("owner", "mode", "dir_mode", "trusted_"),
    [(0, 0o644, 0o755, True), (STRANGER, 0o644, 0o755, False), (0, 0o666, 0o755, False),
     (0, 0o644, 0o777, False), (0, 0o644, 0o1777, False), (SLURM_UID, 0o600, 0o755, False)],
    ids=["root", "stranger", "world-writable", "dir-world-writable", "dir-sticky", "slurm-user"],
)  # fmt: skip
def test_a_drop_in_from_another_writer_is_a_config_error(
    base: Path, owner: int, mode: int, dir_mode: int, trusted_: bool
) -> None:
    work = Path(tempfile.mkdtemp(dir=base))
    try:
        cfg = lab_config_in(work)
        dropins = Path(cfg.source).with_name(f"{Path(cfg.source).stem}.d")
        dropins.mkdir()
        drop = dropins / "50-site.toml"
        drop.write_text("[daemon]\npoll_period = 7\n")
        made(drop, owner, 0, mode)
        made(dropins, 0, 0, dir_mode)
        _, problems = check_config(Path(cfg.source))
        errors = [p.message for p in problems if p.severity == "error"]
        if trusted_:
            assert errors == [] and load_config(Path(cfg.source)).daemon.poll_period == 7
        else:
            assert any("the drop-in" in e and "can be changed by others" in e for e in errors)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_planted_symlink_or_fifo_in_the_spool_is_never_followed(base: Path) -> None:
    work = Path(tempfile.mkdtemp(dir=base))
    try:
        spool_dir = work / "spool"
        spool_dir.mkdir(mode=0o700)
        target = work / "target.request"
        target.write_bytes(request("c" * 32, ["burst-cpu-9"]))
        (spool_dir / f"{time.time_ns():020d}-link.request").symlink_to(target)
        os.mkfifo(spool_dir / f"{time.time_ns():020d}-fifo.request")
        store = Store(str(work / "state.db"), group=None)
        try:
            assert drain(RequestSpool(spool_dir, writers=WRITERS), store, time.time()) == 0
            assert store.pending_requests() == []
        finally:
            store.close()
        assert target.exists() and stat.S_ISREG(target.stat().st_mode)
    finally:
        shutil.rmtree(work, ignore_errors=True)
