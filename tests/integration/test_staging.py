"""Stage-in against a real S3-compatible server (rclone serve s3, which checks every
signature): push, dedup, resume, refusals, and the node's pull with its verification
(node/stagein.py run as a program, as the daemon runs it over SSH)."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import pwd
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from slurm_burst.adapters.clock import SystemClock
from slurm_burst.adapters.storage.s3 import S3Store
from slurm_burst.adapters.storage.tree import LocalTree
from slurm_burst.core.staging import (
    KeptHome,
    Layout,
    SensitiveData,
    StagingError,
    StorageError,
    namespace,
)
from slurm_burst.services.staging import Stager, StagingSettings
from tests.s3server import KEY, SECRET, S3Server

STAGEIN = Path(__file__).resolve().parents[2] / "slurm_burst" / "node" / "stagein.py"
PREFIX = "sb/"


def store(server: S3Server, secret: str = SECRET) -> S3Store:
    keys = {"key": KEY, "secret": secret}
    return S3Store("test", bucket=server.bucket, region="us-east-1", keys=keys,
                   endpoint=server.endpoint, secure=False)  # fmt: skip


def stager(server: S3Server, **kw: Any) -> Stager:
    settings = StagingSettings(prefix=PREFIX, transfers=kw.pop("transfers", 4),
                               grant_seconds=kw.pop("grant_seconds", 300))  # fmt: skip
    return Stager(settings=settings, store=kw.pop("store", None) or store(server),
                  tree=LocalTree(), clock=SystemClock(), **kw)  # fmt: skip


def tree(root: Path) -> dict[str, bytes]:
    """A dataset: nested, an empty file, an executable, text that compresses, random
    bytes that do not, and the same bytes under two names."""
    files = {
        "a/b/text.csv": b"id,value\n" + b"".join(b"%d,%d\n" % (i, i * i) for i in range(20000)),
        "a/empty": b"",
        "bin/run.sh": b"#!/bin/sh\necho hi\n",
        "random.bin": os.urandom(300_000),
        "copy1": b"same bytes" * 100,
        "c/copy2": b"same bytes" * 100,
    }
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (root / "bin/run.sh").chmod(0o755)
    return files


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path / "data" / "set1"
    return root, tree(root)


def test_a_push_stores_each_content_once_and_a_second_push_of_the_same_tree_sends_nothing(
    server: S3Server, dataset: tuple[Path, dict[str, bytes]]
) -> None:
    root, files = dataset
    first = stager(server).push(str(root), "physics")
    assert (first.files, first.bytes) == (6, sum(map(len, files.values())))
    assert first.objects == 5 and first.objects_sent == 5  # copy1 and c/copy2: one object
    text_object = [k for k in server.objects() if k.endswith(".z")]
    assert len(text_object) == 1, server.objects()  # only the CSV paid for compressing
    assert first.bytes_sent < first.bytes  # the CSV went compressed
    again = stager(server).push(str(root), "physics")
    assert again.unchanged and again.bytes_sent == 0 and again.requests <= 3, again
    assert again.manifest == first.manifest


def test_a_changed_tree_sends_only_what_changed_and_another_account_shares_nothing(
    server: S3Server, tmp_path: Path
) -> None:
    root = tmp_path / "data" / "set2"
    files = tree(root)
    stager(server).push(str(root), "physics")
    (root / "random.bin").write_bytes(os.urandom(1000))
    (root / "new.txt").write_bytes(b"new")
    changed = stager(server).push(str(root), "physics")
    assert changed.objects_sent == 2 and not changed.unchanged, changed
    assert changed.bytes_sent < 2000 + 2048  # two small objects, a manifest, a pointer
    other = stager(server).push(str(root), "chemistry")  # a namespace of its own
    assert other.objects_sent == other.objects == 6
    assert files  # the tree was written


def test_a_push_cut_off_halfway_sends_only_the_rest_when_run_again(
    server: S3Server, tmp_path: Path
) -> None:
    root = tmp_path / "data" / "big"
    root.mkdir(parents=True)
    for i in range(8):
        (root / f"part{i}").write_bytes(os.urandom(100_000 + i))

    class Breaks:
        """The real store, failing for good after three objects (a daemon killed)."""

        def __init__(self, real: S3Store) -> None:
            self.real, self.name, self.writes = real, real.name, 0

        def __getattr__(self, attr: str) -> Any:
            return getattr(self.real, attr)

        def write(self, key: str, body: BinaryIO, size: int, pace: Any = None) -> int:
            self.writes += 1
            if self.writes > 3:
                raise StorageError("cut off", "StorageUnreachable")
            return self.real.write(key, body, size, pace)

    with pytest.raises(StorageError):
        stager(server, store=Breaks(store(server)), transfers=1).push(str(root), "physics")
    rest = stager(server).push(str(root), "physics")
    assert rest.objects_sent == 5 and rest.objects == 8, rest
    assert rest.bytes_sent < 5 * 100_010 + 4096


class Flaky:
    """The real store, answering the first ``fails`` calls of each kind with an error."""

    def __init__(self, real: S3Store, fails: int, retryable: bool) -> None:
        self.real, self.name = real, real.name
        self.fails, self.retryable = fails, retryable
        self.calls: dict[str, int] = {}

    def __getattr__(self, attr: str) -> Any:
        real = getattr(self.real, attr)
        if attr not in ("has", "read", "write", "write_bytes", "keys"):
            return real

        def call(*args: Any, **kw: Any) -> Any:
            self.calls[attr] = self.calls.get(attr, 0) + 1
            if self.calls[attr] <= self.fails:
                raise StorageError("HTTP 503 SlowDown", "SlowDown", retryable=self.retryable)
            return list(real(*args, **kw)) if attr == "keys" else real(*args, **kw)

        return call


def test_a_store_that_says_slow_down_is_asked_again_and_a_refusal_is_not(
    server: S3Server, tmp_path: Path
) -> None:
    from tests.fakes.clock import FakeClock

    root = tmp_path / "data" / "flakystore"
    tree(root)
    clock = FakeClock()
    flaky = Flaky(store(server), fails=2, retryable=True)
    settings = StagingSettings(prefix=PREFIX, transfers=1)
    done = Stager(settings=settings, store=flaky, tree=LocalTree(), clock=clock).push(
        str(root), "retry"
    )
    assert done.objects_sent == 5 and clock.slept > 0, (done, flaky.calls)
    refused = Flaky(store(server), fails=1, retryable=False)
    with pytest.raises(StorageError):
        Stager(settings=settings, store=refused, tree=LocalTree(), clock=clock).push(
            str(root), "refused"
        )
    assert refused.calls == {"read": 1}  # the pointer's read, once


def test_uploads_keep_to_the_bandwidth_limit(server: S3Server, tmp_path: Path) -> None:
    from tests.fakes.clock import FakeClock

    root = tmp_path / "data" / "paced"
    root.mkdir(parents=True)
    for i in range(3):
        (root / f"f{i}").write_bytes(os.urandom(400_000))
    clock = FakeClock()
    settings = StagingSettings(prefix=PREFIX, transfers=3, bandwidth=100_000.0)  # 100 kB/s
    done = Stager(settings=settings, store=store(server), tree=LocalTree(), clock=clock).push(
        str(root), "paced"
    )
    burst = 65_536  # the bucket starts full: that much goes at once
    assert done.bytes_sent >= 1_200_000
    assert clock.slept == pytest.approx((1_200_000 - burst) / 100_000, rel=0.02), clock.slept


def test_sensitive_data_is_refused_before_a_byte_leaves(server: S3Server, tmp_path: Path) -> None:
    medical = tmp_path / "data" / "medical"
    tree(medical)
    (tmp_path / "data" / "public").mkdir()
    (tmp_path / "data" / "public" / "link").symlink_to(medical)
    marked = tmp_path / "data" / "marked"
    tree(marked / "sub")
    (marked / ".slurm-burst-onprem-only").write_bytes(b"")
    kept = KeptHome(paths=(str(medical),), accounts=frozenset({"medgen"}), qos=frozenset({"hipaa"}))
    before = server.objects()
    cases = [
        (str(tmp_path / "data" / "public" / "link"), "physics", ""),  # a way round the rule
        (str(medical / "a"), "physics", ""),
        (str(marked / "sub"), "physics", ""),  # marked above
        (str(tmp_path / "data" / "public"), "medgen", ""),
        (str(tmp_path / "data" / "public"), "physics", "hipaa"),
    ]
    for src, account, qos in cases:
        with pytest.raises(SensitiveData):
            stager(server, kept=kept).push(src, account, qos)
    inside = tmp_path / "data" / "open"
    tree(inside / "x")
    (inside / "x" / "a" / ".slurm-burst-onprem-only").write_bytes(b"")  # marked below
    with pytest.raises(SensitiveData):
        stager(server, kept=kept).push(str(inside), "physics")
    assert server.objects() == before  # nothing left the site


def test_a_directory_swapped_for_a_symlink_after_the_scan_is_not_followed(
    tmp_path: Path,
) -> None:
    root = tmp_path / "data" / "swap"
    tree(root)
    secret = tmp_path / "secret"
    (secret / "b").mkdir(parents=True)
    (secret / "b" / "text.csv").write_bytes(b"patient records")
    lt = LocalTree()
    real = lt.resolve(str(root))
    listing = {p: size for p, size, _ in lt.files(real)}
    (root / "a").rename(tmp_path / "moved")
    (root / "a").symlink_to(secret)  # the same names, somewhere the rules keep home
    with pytest.raises(StagingError, match="symlink"):
        lt.digest(real, "a/b/text.csv", listing["a/b/text.csv"])
    with pytest.raises(StagingError, match="symlink"), lt.body(real, "a/b/text.csv", "0" * 64, ""):
        pass
    os.unlink(root / "a")
    (tmp_path / "moved").rename(root / "a")
    root.rename(tmp_path / "data" / "elsewhere")  # the source itself swapped: refused too
    (tmp_path / "data" / "swap").symlink_to(secret)
    with pytest.raises(StagingError, match="symlink"):
        LocalTree().digest(real, "b/text.csv", 15)


@pytest.mark.parametrize("kind", ["fifo", "symlink", "socket"])
def test_a_tree_with_anything_but_files_and_directories_is_refused_by_name(
    server: S3Server, tmp_path: Path, kind: str
) -> None:
    root = tmp_path / "data" / "odd"
    tree(root)
    odd = root / "a" / "odd"
    if kind == "fifo":
        os.mkfifo(odd)
    elif kind == "symlink":
        odd.symlink_to(root / "random.bin")
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(odd))
        sock.close()
    with pytest.raises(StagingError, match=str(odd)):
        stager(server).push(str(root), "physics")


def test_bad_paths_and_credentials_say_what_is_wrong(server: S3Server, tmp_path: Path) -> None:
    for src in ("relative/path", "/a/../b", "/with space", "/a//b", str(tmp_path / "missing")):
        with pytest.raises(StagingError):
            stager(server).push(src, "physics")
    root = tmp_path / "data" / "ok"
    tree(root)
    with pytest.raises(StorageError) as refused:
        stager(server, store=store(server, secret="wrong")).push(str(root), "physics")
    assert refused.value.code == "AccessDenied" and "wrong" not in str(refused.value)


# -- the node's pull -------------------------------------------------------------------


def pull(plan: dict[str, Any], *args: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, str(STAGEIN), "--retries", "2", "--timeout", "10", *args],
        input=json.dumps(plan).encode(), capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout)


def plan_for(
    server: S3Server, root: Path, dest: Path, account: str = "physics", **kw: Any
) -> dict[str, Any]:
    st = stager(server, **kw)
    st.push(str(root), account)
    manifest = st.manifest(account, str(root))
    assert manifest is not None
    uid = 65534 if os.geteuid() == 0 else os.geteuid()
    return st.node_plan(account, manifest, str(dest), uid, uid)


def test_a_node_pulls_every_file_verified_read_only_and_the_users(
    server: S3Server, dataset: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    root, files = dataset
    node = tmp_path / "node"  # open to all, as a node's stage directory is
    node.mkdir(mode=0o755)
    node.chmod(0o755)
    for p in (tmp_path, *tmp_path.parents):  # pytest's own are root's alone: let others by
        if p.stat().st_mode & 0o001 == 0:
            p.chmod(p.stat().st_mode | 0o001)
    dest = node / "job1" / "set1"
    plan = plan_for(server, root, dest)
    assert all("X-Amz-Signature=" in f["url"] and SECRET not in f["url"] for f in plan["files"])
    code, out = pull(plan)
    assert code == 0 and out["ok"] and out["files"] == 6, out
    for rel, data in files.items():
        p = dest / rel
        assert p.read_bytes() == data
        st = p.stat()
        assert st.st_mode & 0o777 == (0o555 if rel == "bin/run.sh" else 0o444), rel
        assert st.st_uid == plan["uid"]
    assert (dest / "a").stat().st_mode & 0o777 == 0o555
    top = dest.stat()
    assert (top.st_mode & 0o777, top.st_uid) == (0o500, plan["uid"])  # the user's alone
    if os.geteuid() == 0:  # another user on the node (the next job's) cannot look in
        rel = next(r for r in files if "/" not in r)
        as_other = ["setpriv", "--reuid=1", "--regid=1", "--clear-groups", "cat", str(dest / rel)]
        other = subprocess.run(as_other, capture_output=True, text=True, timeout=30)
        assert other.returncode != 0 and "Permission denied" in other.stderr, other
    assert not [p for p in dest.parent.iterdir() if p.name != "set1"]  # no work dir left
    code, again = pull(plan)  # asked again (a slurmctld restart re-runs stage-in)
    assert code == 0 and again["present"], again


def test_a_corrupt_or_truncated_object_is_never_accepted(server: S3Server, tmp_path: Path) -> None:
    root = tmp_path / "data" / "bad"
    root.mkdir(parents=True)
    (root / "f").write_bytes(os.urandom(50_000))
    (root / "g").write_bytes(os.urandom(50_000))
    dest = tmp_path / "node" / "bad"
    plan = plan_for(server, root, dest, account="corrupt")
    layout = Layout(PREFIX, namespace("corrupt"))
    objects = [
        server.object_file(layout.object(f"o/{f['sha256'][:2]}/{f['sha256']}"))
        for f in plan["files"]
    ]
    flipped = bytearray(objects[0].read_bytes())
    flipped[1234] ^= 0x40
    objects[0].write_bytes(bytes(flipped))
    objects[1].write_bytes(objects[1].read_bytes()[:-1])
    code, out = pull(plan)
    assert code == 1 and not out["ok"] and "not fetched whole" in out["error"], out
    assert not dest.exists()  # the dataset never appears partly
    # every fetch of both came back wrong: the store's copies are bad, named for the daemon
    assert out["corrupt"] == sorted(f["sha256"] for f in plan["files"]) and out["exit"] == 1
    code, said = pull(plan, "--exit-zero")  # the daemon's way: the JSON says how it ended
    assert code == 0 and said["exit"] == 1 and said["corrupt"] == out["corrupt"]
    # dropped from the store, the next push sends them again and the pull succeeds
    st = stager(server)
    manifest = st.manifest("corrupt", str(root))
    assert manifest is not None and st.drop("corrupt", str(root), manifest, out["corrupt"]) == 2
    again = st.push(str(root), "corrupt")
    assert not again.unchanged and again.objects_sent == 2
    code, out = pull(plan)
    assert code == 0 and (dest / "f").read_bytes() == (root / "f").read_bytes(), out


def test_bytes_flipped_on_the_way_are_fetched_again(server: S3Server, tmp_path: Path) -> None:
    root = tmp_path / "data" / "flaky"
    root.mkdir(parents=True)
    for i in range(4):
        (root / f"f{i}").write_bytes(os.urandom(70_000))
    dest = tmp_path / "node" / "flaky"
    plan = plan_for(server, root, dest, account="flaky")
    with FlippingProxy(server.port) as proxy:
        for f in plan["files"]:
            f["url"] = f["url"].replace(f":{server.port}/", f":{proxy.port}/")
        code, out = pull(plan)
    assert code == 0 and out["refetched"] == 4 and proxy.flipped == 4, out
    for i in range(4):
        assert (dest / f"f{i}").read_bytes() == (root / f"f{i}").read_bytes()


def test_an_answer_that_stops_coming_is_a_bad_copy_and_the_pull_answers_in_time(
    tmp_path: Path,
) -> None:
    """A store that promises the whole object, sends a little and stalls (a copy cut
    short behind a stale size): each fetch gives up after --timeout, every answer was
    wrong, so the object is named bad; --deadline stops new fetches so the answer comes
    before the daemon's SSH session gives up."""
    body = os.urandom(200_000)

    class Stalls(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[:1000])
            self.wfile.flush()
            time.sleep(3)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stalls)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    sha = hashlib.sha256(body).hexdigest()
    plan = {"v": 1, "dest": str(tmp_path / "node" / "stall"), "manifest": "0" * 64,
            "uid": os.geteuid(), "gid": os.getegid(),
            "files": [{"path": "f", "size": len(body), "sha256": sha, "executable": False,
                       "encoding": "", "url": f"http://127.0.0.1:{srv.server_port}/"}]}  # fmt: skip
    try:
        t = time.monotonic()
        code, out = pull(plan, "--timeout", "0.5", "--deadline", "2")
        took = time.monotonic() - t
    finally:
        srv.shutdown()
    assert code == 1 and out["corrupt"] == [sha] and "the answer stopped" in out["error"], out
    assert took < 6, took  # not 3 tries x 3 s of stalling
    assert not (tmp_path / "node" / "stall").exists()


def test_a_grant_that_expired_or_was_altered_is_refused_by_the_store(
    server: S3Server, tmp_path: Path
) -> None:
    root = tmp_path / "data" / "grant"
    root.mkdir(parents=True)
    (root / "f").write_bytes(b"x" * 10)
    st = stager(server)
    st.push(str(root), "physics")
    key = Layout(PREFIX, namespace("physics")).object(
        "o/"
        + hashlib.sha256(b"x" * 10).hexdigest()[:2]
        + "/"
        + hashlib.sha256(b"x" * 10).hexdigest()
    )
    good = store(server).grant(key, 60)
    assert urllib.request.urlopen(good).read() == b"x" * 10
    for bad in (good.replace("X-Amz-Signature=", "X-Amz-Signature=0"),
                store(server, secret="wrong").grant(key, 60),
                good.replace(key, key[:-1] + "0")):  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(bad)
        assert refused.value.code == 403


def test_a_node_without_room_fetches_nothing(server: S3Server, tmp_path: Path) -> None:
    root = tmp_path / "data" / "room"
    root.mkdir(parents=True)
    (root / "f").write_bytes(b"y" * 1000)
    plan = plan_for(server, root, tmp_path / "node" / "room")
    plan["files"][0]["size"] = 2**50  # a petabyte, said the plan
    code, out = pull(plan)
    assert code == 3 and "free" in out["error"], out
    assert not (tmp_path / "node" / "room").exists()


@pytest.mark.parametrize(
    "change",
    [
        {"dest": "relative"},
        {"dest": "/a/../b"},
        {"manifest": "x"},
        {"uid": -1},
        {
            "files": [
                {
                    "path": "../etc/passwd",
                    "size": 1,
                    "sha256": "0" * 64,
                    "encoding": "",
                    "executable": False,
                    "url": "http://x/",
                }
            ]
        },
        {
            "files": [
                {
                    "path": "a",
                    "size": 1,
                    "sha256": "0" * 64,
                    "encoding": "",
                    "executable": False,
                    "url": "file:///etc/shadow",
                }
            ]
        },
    ],
    ids=["relative-dest", "dotdot-dest", "manifest", "uid", "dotdot-file", "file-url"],
)
def test_a_bad_plan_is_refused_before_anything_is_written(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    plan = {
        "v": 1,
        "dest": str(tmp_path / "d"),
        "manifest": "a" * 64,
        "uid": 0,
        "gid": 0,
        "files": [],
    }
    plan.update(change)
    code, out = pull(plan)
    assert code == 2 and not out["ok"], out
    assert not (tmp_path / "d").exists()


class FlippingProxy:
    """An HTTP proxy in front of the store that flips one byte of the first answer for
    each object (corruption above TCP, which TCP's checksum does not catch)."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.flipped = 0
        self.seen: set[str] = set()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> FlippingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            path = head.split(b" ", 2)[1].split(b"?")[0].decode()
            head = head.replace(b"Connection: keep-alive", b"Connection: close").replace(
                f"Host: 127.0.0.1:{self.port}".encode(), f"Host: 127.0.0.1:{self.upstream}".encode()
            )  # the host the URL was signed for: a middlebox passes it on as it was
            with socket.create_connection(("127.0.0.1", self.upstream)) as up:
                up.sendall(head)
                answer = io.BytesIO()
                while chunk := up.recv(65536):
                    answer.write(chunk)
            data = bytearray(answer.getvalue())
            body_at = data.find(b"\r\n\r\n") + 4
            if path not in self.seen and len(data) > body_at + 100:
                self.seen.add(path)
                self.flipped += 1
                data[body_at + 50] ^= 0x01
            conn.sendall(bytes(data))


# -- the command line ------------------------------------------------------------------


def test_the_command_line_pushes_and_reports_and_says_what_is_wrong(
    server: S3Server, tmp_path: Path
) -> None:
    from tests.conftest import invoke

    root = tmp_path / "data" / "cli"
    tree(root)
    conf = tmp_path / "slurm-burst.toml"
    conf.write_text(
        '[cluster]\nname = "c"\ncontroller_host = "h"\ncontroller_addr = "10.0.0.1"\n'
        f'[stores.lab]\nbucket = "{server.bucket}"\nendpoint = "{server.endpoint}"\n'
        'secure = false\nprefix = "cli/"\n'
        'credentials = { key_env = "SB_S3_KEY", secret_env = "SB_S3_SECRET" }\n'
        "upload_per_gb = 0.5\nstorage_per_gb_month = 0.25\n"
        '[staging]\nstore = "lab"\nonprem_only_paths = ["/srv/medical"]\n'
        f'[ledger]\nurl = "sqlite:///{tmp_path}/ledger.db"\n'
        f'[daemon]\nstate_dir = "{tmp_path}/state"\n'
    )
    conf.chmod(0o600)
    env = {"SB_S3_KEY": KEY, "SB_S3_SECRET": SECRET}
    invoke(["--config", str(conf), "db", "upgrade"])
    base = ["--config", str(conf), "stage"]
    me = ["--as-user", pwd.getpwuid(os.geteuid()).pw_name]
    first = json.loads(
        invoke([*base, "push", str(root), "-A", "physics", *me, "--json"], env=env).stdout
    )
    assert first["files"] == 6 and first["objects_sent"] == 5 and not first["unchanged"]
    again = json.loads(
        invoke([*base, "push", str(root), "-A", "physics", *me, "--json"], env=env).stdout
    )
    assert again["unchanged"] and again["bytes_sent"] == 0 and again["requests"] == 2
    # an admin's pushes are in the ledger's transfers (job 0): the first paid its bytes at
    # the upload price; the unchanged one, nothing (storage is gc's to book, below)
    moved = json.loads(invoke(["--config", str(conf), "ledger", "transfers", "--json"]).stdout)
    assert sorted((t["bytes_sent"], t["cost_micros"], t["job"]) for t in moved) == [
        (0, 0, 0), (sent := first["bytes_sent"], round(sent * 0.5e6 / 2**30), 0)
    ]  # fmt: skip
    assert {(t["direction"], t["store"], t["account"]) for t in moved} == {("in", "lab", "physics")}
    shown = json.loads(invoke([*base, "status", "-A", "physics", "--json"], env=env).stdout)
    assert [d["src"] for d in shown["datasets"]] == [str(root)]
    assert shown["datasets"][0]["manifest"] == first["manifest"]
    table = invoke([*base, "status", str(root), "-A", "physics"], env=env).stdout
    assert str(root) in table and first["manifest"][:16] in table
    # gc: nothing is garbage yet (one version, just pushed); no daemon here: that is said
    gc = invoke([*base, "gc", "--dry-run", "--json"], env=env)
    swept = json.loads(gc.stdout)
    assert swept["dry_run"] and swept["total"]["objects"] == 0, swept
    assert swept["total"]["objects_kept"] == 5 and "no state database" in gc.stderr
    # ... and what the namespace held is what gc books: its 7 keys since written
    [held] = swept["storage"]
    assert (held["account"], held["namespace"], held["start"], held["keys"]) == (
        "physics", "acct-physics", None, 7)  # fmt: skip
    assert held["bytes"] == first["bytes_sent"]  # all the push wrote: objects, manifest, pointer
    ledger = ["--config", str(conf), "ledger", "storage", "--json"]
    assert json.loads(invoke(ledger).stdout) == []  # a dry run books nothing
    table = invoke([*base, "gc"], env=env).stdout
    assert "removed" in table and "acct-physics" in table and "storage booked" in table
    [one] = json.loads(invoke(ledger).stdout)
    again = json.loads(invoke([*base, "gc", "--json"], env=env).stdout)["storage"]
    assert [s["start"] for s in again] == [datetime.fromisoformat(one["at"]).timestamp()]
    assert [r["start"] for r in json.loads(invoke(ledger).stdout)] == [one["at"], None]
    assert json.loads(invoke([*base, "gc", "--no-book", "--json"], env=env).stdout)["storage"] == []
    assert len(json.loads(invoke(ledger).stdout)) == 2
    refusals = [
        (["push", "relative", "-A", "physics", *me], env, 2, "absolute path"),
        (["push", str(root), "-A", "bad account", *me], env, 2, "not a Slurm account"),
        (["push", str(root), "-A", "physics", "--store", "nope", *me], env, 3, "no store 'nope'"),
        (["push", str(root), "-A", "physics", *me], {"SB_S3_KEY": KEY}, 2, "SB_S3_SECRET is not"),
        (["push", str(root), "-A", "physics", *me], {**env, "SB_S3_SECRET": "x"}, 1, "denied"),
        (["push", str(root), "-A", "physics", "--as-user", "no-such-user"], env, 2, "no user"),
        (["gc", "--keep-days", "0"], env, 2, "--keep-days"),
        (["gc", "--grace-hours", "nan"], env, 2, "--grace-hours"),
    ]
    if os.geteuid() == 0:
        refusals.append((["push", str(root), "-A", "physics"], env, 2, "--as-user USER"))
        private = tmp_path / "data" / "private"
        private.mkdir()
        (private / "only-root").write_bytes(b"root's")
        (private / "only-root").chmod(0o600)
        refusals.append(
            (["push", str(private), "-A", "physics", "--as-user", "nobody"], env, 2, "Permission")
        )
    for args, environ, code, says in refusals:
        out = invoke([*base, *args], expect=code, env=environ)
        assert says in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert SECRET not in out.stderr + out.stdout


def test_an_object_gone_from_the_store_is_named_for_the_daemon_to_send_again(
    server: S3Server, tmp_path: Path
) -> None:
    """A grant that answers 404 (the object collected, or lost) is a bad copy like a
    corrupt one: the pull names it, the daemon drops and pushes it again."""
    root = tmp_path / "data" / "gone"
    root.mkdir(parents=True)
    (root / "f").write_bytes(os.urandom(40_000))
    dest = tmp_path / "node" / "gone"
    plan = plan_for(server, root, dest, account="gone")
    [f] = plan["files"]
    store(server).delete(
        Layout(PREFIX, namespace("gone")).object(f"o/{f['sha256'][:2]}/{f['sha256']}")
    )  # deleted as gc does: through the API
    code, out = pull(plan)
    assert code == 1 and out.get("corrupt") == [f["sha256"]], out


def gc_stager(server: S3Server, clock: Any) -> Stager:
    """A stager of its own prefix (the module's server holds the other tests' data)."""
    return Stager(settings=StagingSettings(prefix="gc/"), store=store(server),
                  tree=LocalTree(), clock=clock)  # fmt: skip


def test_gc_removes_what_no_kept_version_names_and_nothing_else(
    server: S3Server, tmp_path: Path
) -> None:
    from tests.fakes.clock import FakeClock

    now = time.time()
    pushing = gc_stager(server, SystemClock())
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
    shared = os.urandom(20_000)
    (a / "shared").write_bytes(shared)
    (a / "old").write_bytes(os.urandom(30_000))
    (b / "shared").write_bytes(shared)  # the same bytes: one object for both
    (b / "only-b").write_bytes(os.urandom(10_000))
    first = pushing.push(str(a), "gcacct")
    pushing.push(str(b), "gcacct")
    (a / "old").unlink()
    (a / "new").write_bytes(os.urandom(25_000))
    second = pushing.push(str(a), "gcacct")  # a's new version: its old one is garbage
    foreign = "gc/not-staging/readme.txt"
    store(server).write_bytes(foreign, b"someone else's")
    bucket = set(server.objects())
    layout = Layout("gc/", namespace("gcacct"))
    old_object = layout.object(next(
        e.object_name() for e in pushing.manifest_of("gcacct", first.manifest).entries
        if e.path == "old"))  # fmt: skip
    # an hour on, within keep_days: a's old manifest and its own object go; the rest stays
    later = gc_stager(server, FakeClock(now + 3600))
    booked = {layout.ns: now + 1800}  # storage booked half an hour ago: from then on
    dry_report = later.gc(keep_days=30, live={}, grace=60, dry_run=True, booked=booked)
    dry = dry_report.as_dict()
    assert set(server.objects()) == bucket  # a dry run removes nothing
    held = dry_report.held[layout.ns]
    assert (held.keys, held.since) == (len([k for k in bucket if k.startswith(layout.ns, 3)]),
                                       now + 1800)  # fmt: skip
    assert held.byte_seconds == held.bytes * int(now + 3600 - (now + 1800)) > 0
    report = later.gc(keep_days=30, live={}, grace=60).as_dict()
    assert report["total"] == dry["total"]
    assert (report["total"]["pointers"], report["total"]["manifests"],
            report["total"]["objects"]) == (0, 1, 1), report  # fmt: skip
    assert report["total"]["bytes_freed"] == 30_000 and report["problems"] == []
    assert set(server.objects()) == bucket - {layout.manifest(first.manifest), old_object}
    assert foreign in server.objects()
    # forty days on: a is past keep_days, but a job still holds b's version: a goes whole
    b_manifest = pushing.manifest("gcacct", str(b))
    assert b_manifest is not None
    far = gc_stager(server, FakeClock(now + 40 * 86400))
    report = far.gc(keep_days=30, live={layout.ns: {b_manifest.id}}, grace=60).as_dict()
    assert (report["total"]["pointers"], report["total"]["manifests"],
            report["total"]["objects"]) == (1, 1, 1), report  # fmt: skip
    assert pushing.status("gcacct") == [p for p in pushing.status("gcacct") if p.src == str(b)]
    assert [p.src for p in pushing.status("gcacct")] == [str(b)]
    assert layout.manifest(second.manifest) not in server.objects()
    # b pulls whole still (its shared object was kept), and a is simply pushed again
    plan = pushing.node_plan("gcacct", b_manifest, str(tmp_path / "node" / "b"), 65534, 65534)
    code, out = pull(plan)
    assert code == 0, out
    again = pushing.push(str(a), "gcacct")
    assert not again.unchanged and again.objects_sent == 1  # "new"; "shared" is b's too
    # with nothing held any more, everything of the namespace goes; the foreign key stays
    report = far.gc(keep_days=30, live={}, grace=60).as_dict()
    assert report["total"]["pointers"] == 2 and report["total"]["objects_kept"] == 0, report
    assert [k for k in server.objects() if k.startswith("gc/")] == [foreign]
