"""slurm-burst's stage-in on a node: pull a dataset from object storage, verify every
file, and make it appear whole, read-only and the job user's, or not at all.

The daemon copies this file to the node and runs it as root over SSH with the node's
Python, the plan on standard input (``services/staging.py``, ``node_plan``): where the
dataset goes (``dest``), whose it is (``uid``, ``gid``), its manifest id, and each file
with its size, SHA-256, encoding and a read-only URL for its object (valid minutes;
the node never holds the site's storage keys). It needs only the standard library.

1. ``dest`` already holding this manifest (its ``.slurm-burst-manifest``): nothing to do
   (a stage-in may be asked again: a slurmctld restart re-runs it);
2. the disk must hold what is still to come, with room to spare, or nothing is fetched;
3. files land in a work directory beside ``dest`` (0700, root's), each first under a
   temporary name, then, once its size and SHA-256 are right, under its own. An object
   that is truncated, too long, corrupt or fails to inflate is fetched again, up to
   ``--retries`` times; a file never passes with the wrong bytes. A pull interrupted
   and run again keeps the files it had verified (checked again, not fetched);
4. when every file is verified: modes 0444 (0555 executables and directories), owner
   ``uid:gid``, and one rename makes the work directory ``dest``. A ``writable`` plan
   (a job's synced outputs, brought back for it to resume from) leaves them the user's
   to write: 0644 (0755), the top 0700.

Output: one JSON object on stdout, with ``exit``; on failure ``error``, and ``corrupt``:
the digests whose every fetch came back with wrong bytes (the store's copy is bad, so
the daemon drops it and pushes it again). Exit 0 staged (or already there), 1 a file
could not be fetched whole, 2 a bad plan or usage, 3 not enough disk; with
``--exit-zero`` always 0 (the JSON says which).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import os
import re
import shutil
import stat
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MARK = ".slurm-burst-manifest"
CHUNK = 1024 * 1024
MAX_PLAN = 512 * 1024 * 1024
SPARE = 64 * 1024 * 1024  # left free on the disk after the pull
_SHA = re.compile(r"[0-9a-f]{64}")
_ABS = re.compile(r"/[A-Za-z0-9._+@/,=:~-]+")


class Refused(Exception):
    """The plan, or a file of it, cannot be used; ``code`` is the exit code."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class Corrupt(Exception):
    """An object whose bytes are not the file's (truncated, too long, wrong digest)."""


def load_plan(text: bytes) -> dict[str, Any]:
    try:
        plan = json.loads(text)
        dest, files = plan["dest"], plan["files"]
        uid, gid, manifest = plan["uid"], plan["gid"], plan["manifest"]
    except (ValueError, KeyError, TypeError) as exc:
        raise Refused(f"not a stage plan ({type(exc).__name__}: {exc})") from None
    if not (isinstance(dest, str) and _ABS.fullmatch(dest) and os.path.normpath(dest) == dest):
        raise Refused(f"dest {dest!r}: not a normalized absolute path")
    if not (isinstance(manifest, str) and _SHA.fullmatch(manifest)):
        raise Refused(f"manifest {manifest!r}")
    for name, v in (("uid", uid), ("gid", gid)):
        if type(v) is not int or not 0 <= v < 2**32 - 1:
            raise Refused(f"{name} {v!r}")
    if not isinstance(files, list):
        raise Refused("files: not a list")
    if type(plan.get("writable", False)) is not bool:
        raise Refused(f"writable {plan.get('writable')!r}")
    seen: set[str] = set()
    for i, f in enumerate(files):
        where = f"file {i + 1}"
        try:
            path, size, sha, enc, url = f["path"], f["size"], f["sha256"], f["encoding"], f["url"]
            exe = f["executable"]
        except (KeyError, TypeError):
            raise Refused(f"{where}: not a file entry") from None
        parts = path.split("/") if isinstance(path, str) else [""]
        if any(p in ("", ".", "..") or len(p) > 255 or not p.isprintable() for p in parts):
            raise Refused(f"{where}: path {path!r}")
        if path in seen or MARK in parts or parts[0] == ".tmp":
            raise Refused(f"{where}: path {path!r} twice, or a name of ours")
        seen.add(path)
        if type(size) is not int or size < 0 or not (isinstance(sha, str) and _SHA.fullmatch(sha)):
            raise Refused(f"{where}: size {size!r} or sha256 {sha!r}")
        if enc not in ("", "zlib") or type(exe) is not bool:
            raise Refused(f"{where}: encoding {enc!r} or executable {exe!r}")
        if not (isinstance(url, str) and url.startswith(("http://", "https://"))):
            raise Refused(f"{where}: url is not http(s)")
    dirs = {p.rsplit("/", 1)[0] for p in seen if "/" in p}
    clash = next((d for d in dirs if d in seen), None)
    if clash:
        raise Refused(f"{clash!r} is a file and a directory")
    return dict(plan)


class Puller:
    def __init__(
        self, plan: dict[str, Any], retries: int, timeout: float, parallel: int,
        deadline: float = 0.0,
    ) -> None:  # fmt: skip
        self.plan = plan
        # no new fetch starts past this (time.monotonic()); 0: none. A pull out of time
        # still answers, so the daemon learns which objects came back wrong
        self.deadline = deadline
        self.dest: str = plan["dest"]
        parent, name = os.path.split(self.dest)
        self.parent = parent
        self.work = os.path.join(parent, f".{name}.partial-{plan['manifest'][:16]}")
        self.retries, self.timeout, self.parallel = retries, timeout, parallel
        self.lock = threading.Lock()
        self.fetched = 0  # bytes received
        self.refetched = 0  # objects fetched again after a bad copy
        self.kept = 0  # files verified from an earlier, interrupted pull
        self.corrupt: set[str] = set()  # digests whose every fetch came back wrong

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        files = self.plan["files"]
        if not self.plan.get("writable") and self._present():
            return {"ok": True, "present": True, "files": len(files), "fetched_bytes": 0}
        os.makedirs(self.parent, 0o755, exist_ok=True)
        _own_dir(self.parent, 0o755, make=False)
        _own_dir(self.work, 0o700, make=True)
        _own_dir(os.path.join(self.work, ".tmp"), 0o700, make=True)
        todo = [f for f in files if not self._verified(f)]
        self._room(sum(f["size"] for f in todo))
        with ThreadPoolExecutor(max(1, self.parallel)) as pool:
            list(pool.map(self._pull, todo))
        self._seal(files)
        return {
            "ok": True, "present": False, "files": len(files),
            "bytes": sum(f["size"] for f in files), "fetched_bytes": self.fetched,
            "refetched": self.refetched, "kept": self.kept,
            "seconds": round(time.monotonic() - started, 3),
        }  # fmt: skip

    def _present(self) -> bool:
        try:
            with open(os.path.join(self.dest, MARK), "rb") as f:
                return bool(f.read(100).decode().strip() == self.plan["manifest"])
        except (OSError, UnicodeDecodeError):
            return False

    def _room(self, need: int) -> None:
        st = os.statvfs(self.parent)
        free = st.f_bavail * st.f_frsize
        if free < need + SPARE:
            raise Refused(
                f"{self.parent}: {free} bytes free, the dataset needs {need} more "
                f"(+{SPARE} spare)", 3,
            )  # fmt: skip

    def _target(self, f: dict[str, Any]) -> str:
        return os.path.join(self.work, *f["path"].split("/"))

    def _verified(self, f: dict[str, Any]) -> bool:
        """A file an interrupted pull had already verified and moved into place."""
        target = self._target(f)
        try:
            st = os.lstat(target)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_size != f["size"]:
            return False
        sha = hashlib.sha256()
        with open(target, "rb") as fh:
            while chunk := fh.read(CHUNK):
                sha.update(chunk)
        if sha.hexdigest() == f["sha256"]:
            self.kept += 1
            return True
        os.unlink(target)
        return False

    def _pull(self, f: dict[str, Any]) -> None:
        tmp = os.path.join(self.work, ".tmp", f"{f['sha256']}-{threading.get_ident()}")
        last, wrong, tries = "", 0, 0
        for attempt in range(self.retries + 1):
            if attempt:
                if self.deadline and time.monotonic() + 1.0 > self.deadline:
                    break
                with self.lock:
                    self.refetched += 1
                time.sleep(min(2.0, 0.1 * 2**attempt))
            tries += 1
            try:
                self._fetch(f, tmp)
            except (Corrupt, OSError, urllib.error.URLError, zlib.error) as exc:
                last = f"{type(exc).__name__}: {exc}"
                # wrong bytes, or none where the manifest says an object is: the store's
                # copy is bad (a 404 from a grant is an object gone, e.g. collected)
                wrong += isinstance(exc, (Corrupt, zlib.error)) or (
                    isinstance(exc, urllib.error.HTTPError) and exc.code == 404
                )
                _remove(tmp)
                continue
            target = self._target(f)
            os.makedirs(os.path.dirname(target), 0o700, exist_ok=True)
            os.replace(tmp, target)
            return
        if wrong == tries:  # every answer the store gave was wrong or "not there": bad
            with self.lock:
                self.corrupt.add(f["sha256"])
        raise Refused(f"{f['path']}: not fetched whole in {tries} tries ({last})", 1)

    def _fetch(self, f: dict[str, Any], tmp: str) -> None:
        size, zipped = f["size"], f["encoding"] == "zlib"
        # zlib's worst case grows data by 5 bytes a 16 KiB block; past that it is not ours
        cap = size + size // 1000 + 1024 if zipped else size
        inflate = zlib.decompressobj() if zipped else None
        sha, got, read = hashlib.sha256(), 0, 0
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        with (
            os.fdopen(fd, "wb") as out,
            urllib.request.urlopen(f["url"], timeout=self._timeout()) as r,  # noqa: S310 (http(s) only: load_plan)
        ):
            while chunk := self._read(r, f["path"], read):
                read += len(chunk)
                with self.lock:
                    self.fetched += len(chunk)
                if read > cap:
                    raise Corrupt(f"{f['path']}: object longer than the file")
                if inflate is not None:
                    chunk = inflate.decompress(chunk, size - got + 1)
                    if inflate.unconsumed_tail:
                        raise Corrupt(f"{f['path']}: inflates past {size} bytes")
                got += len(chunk)
                if got > size:
                    raise Corrupt(f"{f['path']}: more than {size} bytes")
                sha.update(chunk)
                out.write(chunk)
            if inflate is not None:
                rest = inflate.flush()
                got += len(rest)
                sha.update(rest)
                out.write(rest)
                if not inflate.eof:
                    raise Corrupt(f"{f['path']}: compressed object cut short")
            out.flush()
            os.fsync(out.fileno())
        if got != size:
            raise Corrupt(f"{f['path']}: {got} of {size} bytes")
        if sha.hexdigest() != f["sha256"]:
            raise Corrupt(f"{f['path']}: SHA-256 differs")

    def _timeout(self) -> float:
        if not self.deadline:
            return self.timeout
        return max(1.0, min(self.timeout, self.deadline - time.monotonic()))

    @staticmethod
    def _read(r: Any, path: str, read: int) -> bytes:
        """The next chunk of an answer that began: a body cut short, or that stops
        coming, is the store's answer gone wrong (as bad bytes are), not a refusal."""
        try:
            return bytes(r.read(CHUNK))
        except (OSError, http.client.HTTPException) as exc:
            raise Corrupt(f"{path}: the answer stopped after {read} bytes ({exc!r})") from exc

    def _seal(self, files: list[dict[str, Any]]) -> None:
        """Read-only, the user's alone, then one rename makes it ``dest``. A writable
        plan (a job's output directory brought back to resume from) stays the user's to
        write: 0644 files (0755 executables and directories), no manifest mark."""
        shutil.rmtree(os.path.join(self.work, ".tmp"))
        writable = bool(self.plan.get("writable"))
        if not writable:
            with open(os.path.join(self.work, MARK), "w") as fh:
                fh.write(self.plan["manifest"] + "\n")
        uid, gid = self.plan["uid"], self.plan["gid"]
        executable = {f["path"] for f in files if f["executable"]}
        file_mode, exe_mode = (0o644, 0o755) if writable else (0o444, 0o555)
        for root, dirs, names in os.walk(self.work, topdown=False):
            for name in names:
                path = os.path.join(root, name)
                rel = os.path.relpath(path, self.work)
                os.lchown(path, uid, gid)
                os.chmod(path, exe_mode if rel in executable else file_mode, follow_symlinks=False)
            for name in dirs:
                path = os.path.join(root, name)
                os.lchown(path, uid, gid)
                os.chmod(path, exe_mode, follow_symlinks=False)
        os.lchown(self.work, uid, gid)
        # the top closed to everyone else: the node may run another user's job next, or
        # beside it, and the files' own bits (0444) would let that user read them
        os.chmod(self.work, 0o700 if writable else 0o500)
        if os.path.lexists(self.dest):  # an older version of the dataset: replaced whole
            old = f"{self.work}.old"
            os.rename(self.dest, old)
            os.rename(self.work, self.dest)
            _remove_tree(old)
        else:
            os.rename(self.work, self.dest)


def _own_dir(path: str, mode: int, make: bool) -> None:
    """A directory that is no symlink and root's (made with ``mode`` if missing)."""
    if make:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, mode)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise Refused(f"{path}: not a directory of this user's (a symlink, or planted)")


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _remove_tree(path: str) -> None:
    for root, dirs, _ in os.walk(path):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o700, follow_symlinks=False)
    os.chmod(path, 0o700)
    shutil.rmtree(path)


def _plan_file(path: str) -> bytes:
    """The plan the controller put at ``path`` (over SSH, as root), then removed: read
    only if root (or we) wrote it and nobody else could (its grants act on the store; a
    job's user on this node must not plant one). OSError saying why otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        trusted = (0, os.geteuid())
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in trusted or st.st_mode & 0o022:
            raise OSError(f"{path}: not a plan the controller wrote (owner or mode)")
        up = os.stat(os.path.dirname(os.path.abspath(path)))
        if up.st_uid not in trusted or up.st_mode & 0o022:
            raise OSError(f"{path}: its directory can be written by others")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(MAX_PLAN + 1)[:MAX_PLAN]
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Pull a staged dataset onto this node.")
    ap.add_argument("--retries", type=int, default=3, help="fetches again of a bad object")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds without data")
    ap.add_argument("--parallel", type=int, default=4, help="objects fetched at once")
    ap.add_argument(
        "--plan",
        help="read the plan from this file, then remove it (its URLs "
        "are grants), instead of from standard input",
    )
    ap.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        help="seconds from now after which no fetch starts (the answer still comes); 0: none",
    )
    ap.add_argument(
        "--exit-zero",
        action="store_true",
        help="exit 0 whatever happened; the "
        "JSON's 'exit' is the exit code (the daemon reads the answer whole)",
    )
    args = ap.parse_args(argv)
    puller = None
    try:
        plan = load_plan(
            _plan_file(args.plan) if args.plan else sys.stdin.buffer.read(MAX_PLAN + 1)[:MAX_PLAN]
        )
        until = time.monotonic() + args.deadline if args.deadline > 0 else 0.0
        puller = Puller(plan, args.retries, args.timeout, args.parallel, until)
        out = puller.run()
        code = 0
    except Refused as exc:
        out, code = {"ok": False, "error": str(exc)}, exc.code
    except OSError as exc:
        out, code = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, 1
    if puller is not None and puller.corrupt:
        out["corrupt"] = sorted(puller.corrupt)[:1000]  # objects to drop from the store
    if code and puller is not None:
        out["fetched_bytes"] = puller.fetched
    print(json.dumps({**out, "exit": code}, sort_keys=True))
    return 0 if args.exit_zero else code


if __name__ == "__main__":
    sys.exit(main())
