"""The mesh store (a site without object storage): the daemon's server of a directory,
and the client the controller uses, over real HTTP; the node programs pull and send
through its grants exactly as through a cloud store's."""

from __future__ import annotations

import http.client
import os
import secrets
import socket
import stat
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_burst.adapters.clock import SystemClock
from slurm_burst.adapters.storage.home import LocalHome
from slurm_burst.adapters.storage.mesh import MeshStore, MeshStoreServer, load_key, signed_path
from slurm_burst.adapters.storage.tree import LocalTree
from slurm_burst.core.staging import (
    CorruptOutput,
    Layout,
    StorageError,
    StorageUnavailable,
    namespace,
)
from slurm_burst.services.staging import Stager, StagingSettings
from tests.integration.test_stageout import outputs, sync
from tests.integration.test_staging import pull, tree

PREFIX = "sb/"


class Mesh:
    def __init__(self, root: Path, server: MeshStoreServer, secret: bytes) -> None:
        self.root, self.server, self.secret = root, server, secret
        self.host, self.port = server.address

    def client(self, secret: bytes | None = None) -> MeshStore:
        return MeshStore("mesh", host=self.host, port=self.port, secret=secret or self.secret)

    def stager(self) -> Stager:
        return Stager(settings=StagingSettings(prefix=PREFIX, grant_seconds=300),
                      store=self.client(), tree=LocalTree(), clock=SystemClock(),
                      home=LocalHome())  # fmt: skip

    def raw(self, method: str, path: str, body: bytes = b"",
            headers: dict[str, str] | None = None) -> tuple[int, bytes]:  # fmt: skip
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request(method, path, body=body or None, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


@pytest.fixture()
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    key = load_key(tmp_path / "mesh.key", create=True)
    server = MeshStoreServer(tmp_path / "store", key, ("127.0.0.1", 0), max_object=1 << 24)
    server.start()
    try:
        yield Mesh(tmp_path / "store", server, key)
    finally:
        server.close()


def test_a_dataset_goes_through_the_mesh_store_and_the_node_pulls_it_verified(
    mesh: Mesh, tmp_path: Path
) -> None:
    root = tmp_path / "data" / "set"
    files = tree(root)
    st = mesh.stager()
    pushed = st.push(str(root), "physics")
    assert pushed.objects_sent == 5 and not pushed.unchanged
    assert st.push(str(root), "physics").unchanged  # the store says what it has
    manifest = st.manifest("physics", str(root))
    assert manifest is not None
    uid = 65534 if os.geteuid() == 0 else os.geteuid()
    plan = st.node_plan("physics", manifest, str(tmp_path / "node" / "set"), uid, uid)
    assert all(f["url"].startswith(f"http://127.0.0.1:{mesh.port}/sb/acct-physics/o/")
               for f in plan["files"])  # fmt: skip
    code, out = pull(plan)
    assert code == 0, out
    for rel, data in files.items():
        assert (tmp_path / "node" / "set" / rel).read_bytes() == data
    # on the controller's disk: the store's directory is root's alone, objects 0600
    assert stat.S_IMODE(mesh.root.stat().st_mode) == 0o700
    objects = [p for p in mesh.root.rglob("*") if p.is_file()]
    assert objects and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in objects)
    listed = list(mesh.client().keys(PREFIX))
    assert len(listed) == len(objects) == 5 + 2  # the objects, a manifest, a pointer
    assert all(time.time() - 60 < at <= time.time() + 1 for _key, _size, at in listed)


def test_outputs_come_home_through_the_mesh_store_and_a_corrupt_one_never_does(
    mesh: Mesh, tmp_path: Path
) -> None:
    out_dir = tmp_path / "node" / "42" / "out"
    files = outputs(out_dir)
    home = tmp_path / "results" / "42"
    home.parent.mkdir()
    st = mesh.stager()
    manifest, first = sync(st, out_dir, str(home), tmp_path / "cache.json")
    assert first["sent"]["sent"] == 5 and first["plan"]["headers"] == {}
    got = st.promote("physics", manifest.id, str(home))
    assert got["files"] == 5 and all((home / r).read_bytes() == d for r, d in files.items())
    # a byte flipped on the controller's disk: found at promotion, nothing replaced
    victim = next(e for e in manifest.entries if e.path == "ckpt/step-100.pt")
    stored = mesh.root / Layout(PREFIX, namespace("physics")).object(victim.object_name())
    body = bytearray(stored.read_bytes())
    body[100] ^= 0xFF
    stored.write_bytes(bytes(body))
    (home / "ckpt" / "latest").write_text("edited at home\n")
    with pytest.raises(CorruptOutput, match=r"ckpt/step-100\.pt"):
        st.promote("physics", manifest.id, str(home))
    assert (home / "ckpt" / "latest").read_text() == "edited at home\n"


def test_only_a_valid_grant_opens_the_store(mesh: Mesh) -> None:
    client = mesh.client()
    client.write_bytes("sb/acct-x/d/one", b"pointer")
    ok = signed_path(mesh.secret, "GET", "sb/acct-x/d/one", int(time.time()) + 60)
    assert mesh.raw("GET", ok) == (200, b"pointer")
    wrong_key = signed_path(secrets.token_hex(32).encode(), "GET", "sb/acct-x/d/one",
                            int(time.time()) + 60)  # fmt: skip
    expired = signed_path(mesh.secret, "GET", "sb/acct-x/d/one", int(time.time()) - 1)
    too_far = signed_path(mesh.secret, "GET", "sb/acct-x/d/one", int(time.time()) + 8 * 86400)
    other_key = ok.replace("/d/one?", "/d/two?")
    as_put = signed_path(mesh.secret, "PUT", "sb/acct-x/d/one", int(time.time()) + 60)
    for path in (wrong_key, expired, too_far, other_key, "/sb/acct-x/d/one"):
        status, body = mesh.raw("GET", path)
        assert status == 403 and b"AccessDenied" in body, (path, status, body)
    assert mesh.raw("GET", as_put)[0] == 403  # a PUT grant does not read
    assert mesh.raw("DELETE", as_put)[0] == 403  # ... nor delete
    with pytest.raises(StorageError, match="AccessDenied"):
        mesh.client(secrets.token_hex(32).encode()).read("sb/acct-x/d/one", 100)
    # a node's PUT grant writes its one object (a body cut off: the test below)
    grant = client.grant("sb/acct-x/o/aa/new", 60, "PUT")
    req = urllib.request.Request(grant, data=b"x" * 1000, method="PUT")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200
    assert client.read("sb/acct-x/o/aa/new", 5000) == b"x" * 1000
    elsewhere = grant.replace("/aa/new?", "/aa/other?")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(urllib.request.Request(elsewhere, data=b"y", method="PUT"),
                               timeout=10)  # fmt: skip
    assert err.value.code == 403 and client.read("sb/acct-x/o/aa/other", 10) is None


@pytest.mark.parametrize(
    ("key", "status"),
    [("../../etc/passwd", 400), ("sb/../x", 400), (".hidden/x", 400), ("sb//x", 400),
     ("sb/x\nInjected: yes", 400), ("a/" * 20 + "x", 400), ("sb/" + "x" * 300, 400)],
    ids=["dotdot", "inner-dotdot", "hidden", "empty-part", "newline", "too-deep", "too-long"],
)  # fmt: skip
def test_a_key_not_of_stagings_shape_is_refused(mesh: Mesh, key: str, status: int) -> None:
    path = signed_path(mesh.secret, "GET", key, int(time.time()) + 60)
    assert mesh.raw("GET", path)[0] == status


def test_a_symlink_or_fifo_planted_in_the_store_is_never_followed_or_opened(
    mesh: Mesh, tmp_path: Path
) -> None:
    client = mesh.client()
    secret_file = tmp_path / "root-only"
    secret_file.write_text("root's secret\n")
    (mesh.root / "sb").mkdir()
    (mesh.root / "sb" / "link").symlink_to(secret_file)
    os.mkfifo(mesh.root / "sb" / "fifo")
    (mesh.root / "sb" / "dirlink").symlink_to(tmp_path)
    assert client.read("sb/link", 1000) is None
    assert client.read("sb/fifo", 1000) is None  # answered at once: never opened to block
    assert client.read("sb/dirlink/root-only", 1000) is None
    assert [k for k, _s, _a in client.keys("sb/")] == []  # listed: none of them
    with pytest.raises(StorageError, match="HTTP 500"):  # no write through a planted link
        client.write_bytes("sb/dirlink/new", b"x")
    assert not (tmp_path / "new").exists()
    client.delete("sb/link")  # deletes the link, never what it names
    assert secret_file.read_text() == "root's secret\n"


def test_oversized_puts_and_unreachable_servers_are_clear_errors(
    mesh: Mesh, tmp_path: Path
) -> None:
    client = mesh.client()
    with pytest.raises(StorageError, match="EntityTooLarge"):
        client.write_bytes("sb/acct-x/o/bb/big", b"z" * ((1 << 24) + 1))
    assert client.read("sb/acct-x/o/bb/big", 10) is None
    status, _ = mesh.raw("PUT", signed_path(mesh.secret, "PUT", "sb/x", int(time.time()) + 60),
                         headers={"Transfer-Encoding": "chunked"})  # fmt: skip
    assert status == 411
    mesh.server.close()
    with pytest.raises(StorageError, match="did not answer") as err:
        client.has("sb/x")
    assert err.value.code == "StorageUnreachable" and err.value.retryable


def test_the_grant_key_is_made_0600_once_and_a_loose_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "k"
    first = load_key(path, create=True)
    assert load_key(path, create=True) == first == load_key(path, create=False)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(first) == 64
    path.chmod(0o644)
    with pytest.raises(StorageUnavailable, match="not a 0600 file"):
        load_key(path, create=False)
    with pytest.raises(StorageUnavailable, match="made by the daemon"):
        load_key(tmp_path / "none", create=False)
    (tmp_path / "link").symlink_to(path)
    with pytest.raises(StorageUnavailable):
        load_key(tmp_path / "link", create=False)


def test_a_put_cut_off_leaves_nothing_and_a_restart_sweeps_what_a_stop_left(
    mesh: Mesh,
) -> None:
    grant = signed_path(mesh.secret, "PUT", "sb/acct-x/o/cc/cut", int(time.time()) + 60)
    with socket.create_connection((mesh.host, mesh.port), timeout=30) as s:
        s.sendall(f"PUT {grant} HTTP/1.0\r\nContent-Length: 100000\r\n\r\n".encode()
                  + b"a" * 5000)  # fmt: skip
        s.shutdown(socket.SHUT_WR)  # the body ends there
        answer = b""  # the server's answer comes once it has dropped the part it got
        while chunk := s.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.0 400 ") and b"IncompleteBody: 5000 of 100000" in answer
    assert not any(mesh.root.rglob(".put-*"))
    assert mesh.client().read("sb/acct-x/o/cc/cut", 9) is None
    left = mesh.root / "sb" / ".put-deadbeef"
    left.parent.mkdir(exist_ok=True)
    left.write_bytes(b"half")
    mesh.server.close()
    mesh.server.start()
    assert not left.exists()


def test_a_read_grant_is_a_plain_url_for_one_object(mesh: Mesh) -> None:
    """What the node programs fetch (node/stagein.py takes http URLs): the object it
    names, and no other."""
    client = mesh.client()
    client.write_bytes("sb/acct-x/o/dd/obj", b"data")
    url = client.grant("sb/acct-x/o/dd/obj", 60)
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.read() == b"data"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url.replace("/dd/obj", "/dd/other"), timeout=10)
    assert err.value.code == 403
