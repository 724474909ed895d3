"""slurm-burst's stage-out on a node: what a job's output directory holds, and sending
the files the store lacks.

The daemon copies this file to the node and runs it as root over SSH with the node's
Python (``services/outputs.py``). It needs only the standard library. Three commands:

``prepare --dir D --uid U --gid G``
    Make the job's output directory ``D`` (0700, the job user's) if it is not there. Its
    parent is the job's stage directory, root's: the user cannot plant anything above.

``scan --dir D --cache C --pins P``
    Every regular file under ``D`` with its size, SHA-256 and executable bit. The tree
    belongs to the job's user, so it is read as an attacker's: each directory is opened
    relative to its parent with ``O_NOFOLLOW``, each file with ``O_NOFOLLOW |
    O_NONBLOCK`` and checked to be a regular file after it is open; symlinks, FIFOs,
    sockets and devices are listed under ``skipped``, never followed or read, and so is a
    file not owned by ``--uid`` (a hard link to a file of root's would otherwise be read
    as root and sent home to the job's user). A file that
    changes while it is read (its size or mtime differ after) is listed under ``busy``
    and left to the next sync. Digests are kept in ``C`` (root's) by path, size, mtime,
    ctime and inode, so a sync re-reads only what changed. Each file listed is pinned: a
    hard link named by its digest in ``P`` (root's, 0700, beside ``C``), so that what the
    scan read is what the send sends even if the job replaces the file meanwhile (a
    checkpoint rewritten by rename every second; the daemon's round between the two
    takes longer than that on a loaded machine). A pin lives until the next scan lists
    no file of its digest: one version's files at most, most of them the job's own
    files' inodes. A file on another filesystem than ``P`` is not pinned (sent from its
    path).

``send --plan P``
    PUT each file of the plan (a JSON file, removed once read: its URLs are grants) to its
    presigned URL (with the plan's ``headers``: an Azure SAS PUT names its blob type),
    hashing the bytes as they go, from its pin in the plan's ``pins`` if the scan made
    one, else from its path. A file whose bytes are not the digest the plan names any
    more (the job wrote into it since the scan) is listed under ``changed``; the daemon
    then does not record that version (the next sync does).

Output: one JSON object on stdout with ``exit``: 0 done, 1 a transfer failed, 2 a bad
plan or usage; ``--exit-zero`` exits 0 whatever happened (the JSON says which).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import os
import re
import stat
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

CHUNK = 1024 * 1024
MAX_PLAN = 512 * 1024 * 1024
MAX_FILES = 1_000_000
MAX_CACHE = 1024 * 1024 * 1024
_SHA = re.compile(r"[0-9a-f]{64}")
_ABS = re.compile(r"/[A-Za-z0-9._+@/,=:~-]+")
_VALUE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
UPLOAD_HEADERS = ("x-ms-blob-type", "x-ms-version")  # what an Azure SAS PUT must say
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Refused(Exception):
    """A plan, a directory or a file that cannot be used; ``code`` is the exit code."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _abs(path: str, what: str) -> str:
    if not (_ABS.fullmatch(path) and os.path.normpath(path) == path):
        raise Refused(f"{what} {path!r}: not a normalized absolute path")
    return path


# -- prepare ------------------------------------------------------------------------------


def prepare(directory: str, uid: int, gid: int) -> dict[str, Any]:
    _abs(directory, "--dir")
    parent = os.path.dirname(directory)
    os.makedirs(parent, 0o755, exist_ok=True)
    pst = os.lstat(parent)
    if not stat.S_ISDIR(pst.st_mode) or pst.st_uid != os.geteuid():
        raise Refused(f"{parent}: not a directory of root's")
    made = False
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
        made = True
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"{directory}: not a directory (a symlink, or planted)")
    if made:
        os.lchown(directory, uid, gid)
    elif (st.st_uid, st.st_gid) != (uid, gid):
        raise Refused(f"{directory}: owned by {st.st_uid}:{st.st_gid}, not the job's user")
    return {"ok": True, "made": made}


# -- scan ---------------------------------------------------------------------------------


def _open_pins(path: str, make: bool) -> int | None:
    """The pin directory (root's, 0700), made if ``make``; None if it is not there."""
    if make:
        os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Refused(f"{path}: {exc.strerror} (a symlink, or not a directory)", 1) from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        raise Refused(f"{path}: not a directory of root's alone (owner or mode)", 1)
    return fd


class Scanner:
    def __init__(
        self, directory: str, cache: dict[str, list[Any]], uid: int = -1, pins: str = ""
    ) -> None:
        self.directory = _abs(directory, "--dir")
        self.uid = uid  # >= 0: a file of another owner is skipped (a hard link to root's)
        self.pins = _abs(pins, "--pins") if pins else ""
        self.pins_fd: int | None = None
        self.unpinned = 0  # files listed without a pin (another filesystem, or replaced)
        self.cache = cache  # path -> [size, mtime_ns, ctime_ns, ino, sha256]
        self.files: list[list[Any]] = []  # [path, size, sha256, executable]
        self.skipped: list[str] = []
        self.busy: list[str] = []
        self.hashed = 0  # bytes read (files not in the cache, or changed)
        self.seen: dict[str, list[Any]] = {}

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        try:
            top = os.open(self.directory, _DIR_FLAGS)
        except FileNotFoundError:
            return self._answer(started, missing=True)
        except OSError as exc:
            why = f"{self.directory}: {exc.strerror} (a symlink, or not a directory)"
            raise Refused(why, 1) from None
        try:
            if self.pins:
                self.pins_fd = _open_pins(self.pins, make=True)
            self._walk(top, "")
            if self.pins_fd is not None:
                self._unpin_others()
        finally:
            os.close(top)
            if self.pins_fd is not None:
                os.close(self.pins_fd)
        return self._answer(started)

    def _unpin_others(self) -> None:
        """Pins of digests no file listed has any more (the versions before)."""
        assert self.pins_fd is not None
        listed = {f[2] for f in self.files}
        for name in os.listdir(self.pins_fd):
            if name not in listed:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=self.pins_fd)

    def _pin(
        self, dirfd: int, name: str, fd: int, key: list[Any], sha: str, was: str
    ) -> list[Any] | None:
        """Hard-link the open file ``name`` as its digest in the pin directory: the key
        to remember it by (a link changes the inode's ctime), or None if it changed
        meanwhile. A digest pinned already (this inode, or another with the same bytes)
        stays. ``was``: the digest this inode had at the last scan, if it was written
        in place since; its pin goes first (unpinned later, its ctime would change after
        the key is taken, and the next scan would read it again)."""
        assert self.pins_fd is not None
        with contextlib.suppress(FileNotFoundError):
            os.stat(sha, dir_fd=self.pins_fd, follow_symlinks=False)
            return key
        if was:
            with contextlib.suppress(OSError):
                if os.stat(was, dir_fd=self.pins_fd, follow_symlinks=False).st_ino == key[3]:
                    os.unlink(was, dir_fd=self.pins_fd)
        try:
            os.link(name, sha, src_dir_fd=dirfd, dst_dir_fd=self.pins_fd, follow_symlinks=False)
        except OSError:  # another filesystem, too many links: sent from its path
            self.unpinned += 1
            return key
        linked = os.stat(sha, dir_fd=self.pins_fd, follow_symlinks=False)
        after = os.fstat(fd)
        if linked.st_ino != key[3] or [after.st_size, after.st_mtime_ns] != key[:2]:
            os.unlink(sha, dir_fd=self.pins_fd)  # replaced or written since it was read
            return None
        return _key(after)

    def _answer(self, started: float, missing: bool = False) -> dict[str, Any]:
        self.files.sort()
        return {
            "ok": True, "missing": missing, "files": self.files, "skipped": self.skipped[:100],
            "skipped_count": len(self.skipped), "busy": self.busy[:100],
            "busy_count": len(self.busy), "hashed_bytes": self.hashed,
            "unpinned": self.unpinned,
            "seconds": round(time.monotonic() - started, 3),
        }  # fmt: skip

    def _walk(self, fd: int, prefix: str) -> None:
        with os.scandir(fd) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            rel = prefix + e.name
            if not e.name.isprintable() or "\n" in e.name:
                self.skipped.append(ascii(rel))
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            if stat.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(e.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    self.skipped.append(rel + "/")
                    continue
                try:
                    self._walk(sub, rel + "/")
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                if len(self.files) >= MAX_FILES:
                    raise Refused(f"{self.directory}: more than {MAX_FILES} files", 1)
                self._file(fd, e.name, rel)
            else:
                self.skipped.append(rel)

    def _file(self, dirfd: int, name: str, rel: str) -> None:
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dirfd)
        except OSError:
            self.skipped.append(rel)
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (self.uid >= 0 and st.st_uid != self.uid):
                self.skipped.append(rel)
                return
            key = _key(st)
            known = self.cache.get(rel)
            was = ""
            if known is not None and known[:4] == key:
                sha = known[4]
            else:
                sha = _digest(fd)
                self.hashed += st.st_size
                after = os.fstat(fd)
                if _key(after) != key:
                    self.busy.append(rel)
                    return
                if known is not None and known[3] == st.st_ino and known[4] != sha:
                    was = known[4]
            if self.pins_fd is not None:
                pinned = self._pin(dirfd, name, fd, key, sha, was)
                if pinned is None:
                    self.busy.append(rel)
                    return
                key = pinned
            self.seen[rel] = [*key, sha]
            self.files.append([rel, st.st_size, sha, bool(st.st_mode & 0o111)])
        finally:
            os.close(fd)


def _key(st: os.stat_result) -> list[Any]:
    """What a file's cache entry is kept by: size, mtime, ctime, inode."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _digest(fd: int) -> str:
    sha = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, CHUNK):
        sha.update(chunk)
    return sha.hexdigest()


def _read_cache(path: str) -> dict[str, list[Any]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as fh:
        try:
            got = json.loads(fh.read(MAX_CACHE))
        except ValueError:
            return {}
    return got if isinstance(got, dict) else {}


def _write_cache(path: str, seen: dict[str, list[Any]]) -> None:
    parent = os.path.dirname(path)
    os.makedirs(parent, 0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(seen, fh, separators=(",", ":"))
    os.replace(tmp, path)


# -- send ---------------------------------------------------------------------------------


def load_plan(text: bytes) -> dict[str, Any]:
    try:
        plan = json.loads(text)
        directory, files = plan["dir"], plan["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise Refused(f"not a send plan ({type(exc).__name__}: {exc})") from None
    _abs(directory if isinstance(directory, str) else "", "dir")
    if not isinstance(files, list):
        raise Refused("files: not a list")
    pins = plan.get("pins", "")
    if pins != "":
        _abs(pins if isinstance(pins, str) else "", "pins")
    headers = plan.get("headers", {})
    if not isinstance(headers, dict) or any(
        k not in UPLOAD_HEADERS or not isinstance(v, str) or not _VALUE.fullmatch(v)
        for k, v in headers.items()
    ):
        raise Refused(f"headers {str(headers)[:200]!r}: only {', '.join(UPLOAD_HEADERS)}")
    for i, f in enumerate(files):
        where = f"file {i + 1}"
        try:
            path, size, sha, url = f["path"], f["size"], f["sha256"], f["url"]
        except (KeyError, TypeError):
            raise Refused(f"{where}: not a file entry") from None
        parts = path.split("/") if isinstance(path, str) else [""]
        if any(p in ("", ".", "..") or not p.isprintable() for p in parts):
            raise Refused(f"{where}: path {path!r}")
        if type(size) is not int or size < 0 or not (isinstance(sha, str) and _SHA.fullmatch(sha)):
            raise Refused(f"{where}: size {size!r} or sha256 {sha!r}")
        if not (isinstance(url, str) and url.startswith(("http://", "https://"))):
            raise Refused(f"{where}: url is not http(s)")
    return dict(plan)


class _Body:
    """A file's bytes for an HTTP body: read in chunks, hashed as they go, never more
    than the plan's size (a file that grew is cut there; its digest then differs)."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.left, self.sha = fd, size, hashlib.sha256()
        self.sent = 0

    def read(self, n: int = -1) -> bytes:
        want = self.left if n < 0 else min(n, self.left)
        chunk = os.read(self.fd, min(want, CHUNK)) if want > 0 else b""
        self.left -= len(chunk)
        self.sent += len(chunk)
        self.sha.update(chunk)
        return chunk

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self.read(CHUNK):
            yield chunk


class Sender:
    def __init__(self, plan: dict[str, Any], timeout: float, parallel: int) -> None:
        self.plan, self.timeout, self.parallel = plan, timeout, parallel
        self.lock = threading.Lock()
        self.sent_bytes = 0
        self.changed: list[str] = []
        self.failed: list[str] = []
        self.pins_fd: int | None = None

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        pins = self.plan.get("pins", "")
        self.pins_fd = _open_pins(pins, make=False) if pins else None
        try:
            with ThreadPoolExecutor(max(1, self.parallel)) as pool:
                list(pool.map(self._send, self.plan["files"]))
        finally:
            if self.pins_fd is not None:
                os.close(self.pins_fd)
        return {
            "ok": not self.failed, "sent": len(self.plan["files"]) - len(self.failed),
            "sent_bytes": self.sent_bytes, "changed": sorted(self.changed)[:1000],
            "failed": self.failed[:100], "seconds": round(time.monotonic() - started, 3),
        }  # fmt: skip

    def _send(self, f: dict[str, Any]) -> None:
        try:
            fd = self._pinned(f["sha256"])
            if fd is None:
                fd = self._open(f["path"])
        except OSError:
            with self.lock:
                self.changed.append(f["path"])  # gone or replaced since the scan
            return
        try:
            body = _Body(fd, f["size"])
            size = os.fstat(fd).st_size
            if size < f["size"]:
                with self.lock:
                    self.changed.append(f["path"])
                return
            req = urllib.request.Request(  # noqa: S310 (http(s) only: load_plan)
                f["url"], data=body, method="PUT",
                headers={**self.plan.get("headers", {}), "Content-Length": str(f["size"]),
                         "Content-Type": "application/octet-stream"},
            )  # fmt: skip
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:  # noqa: S310
                    r.read()
            except (OSError, http.client.HTTPException) as exc:
                with self.lock:
                    self.failed.append(f"{f['path']}: {type(exc).__name__}: {exc}"[:300])
                return
            with self.lock:
                self.sent_bytes += body.sent
                if body.sha.hexdigest() != f["sha256"] or body.sent != f["size"]:
                    self.changed.append(f["path"])
        finally:
            os.close(fd)

    def _pinned(self, sha: str) -> int | None:
        """The scan's pin of these bytes, open; None if it made none."""
        if self.pins_fd is None:
            return None
        try:
            fd = os.open(sha, _FILE_FLAGS, dir_fd=self.pins_fd)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        os.set_blocking(fd, True)
        return fd

    def _open(self, rel: str) -> int:
        """``rel`` under the plan's directory, every step without following a symlink."""
        fd = os.open(self.plan["dir"], _DIR_FLAGS)
        try:
            parts = rel.split("/")
            for part in parts[:-1]:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nxt
            out = os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(os.fstat(out).st_mode):
            os.close(out)
            raise OSError(f"{rel}: not a regular file")
        os.set_blocking(out, True)
        return out


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
    ap = argparse.ArgumentParser(description="A job's outputs on this node: scan and send.")
    ap.add_argument("--exit-zero", action="store_true", help="exit 0 whatever happened; the "
                    "JSON's 'exit' is the exit code")  # fmt: skip
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="make the job's output directory, the user's")
    p.add_argument("--dir", required=True)
    p.add_argument("--uid", type=int, required=True)
    p.add_argument("--gid", type=int, required=True)
    s = sub.add_parser("scan", help="list the files with their SHA-256")
    s.add_argument("--dir", required=True)
    s.add_argument("--cache", help="digests kept between scans (root's file)")
    s.add_argument("--pins", default="", help="pin each file listed here, by digest (root's "
                   "directory; hard links that keep what was read until it is sent)")  # fmt: skip
    s.add_argument(
        "--uid",
        type=int,
        default=-1,
        help="skip files not owned by this uid "
        "(a hard link the job made to a file of root's is not sent)",
    )
    t = sub.add_parser("send", help="PUT the plan's files to their URLs")
    t.add_argument("--plan", required=True, help="the plan file (removed once read)")
    t.add_argument("--timeout", type=float, default=60.0, help="seconds without progress")
    t.add_argument("--parallel", type=int, default=4, help="files sent at once")
    args = ap.parse_args(argv)
    try:
        if args.command == "prepare":
            if not (0 <= args.uid < 2**32 - 1 and 0 <= args.gid < 2**32 - 1):
                raise Refused("uid or gid out of range")
            out, code = prepare(args.dir, args.uid, args.gid), 0
        elif args.command == "scan":
            cache = _read_cache(args.cache) if args.cache else {}
            scanner = Scanner(args.dir, cache, args.uid, args.pins)
            out, code = scanner.run(), 0
            if args.cache:
                _write_cache(args.cache, scanner.seen)
        else:
            out = Sender(load_plan(_plan_file(args.plan)), args.timeout, args.parallel).run()
            code = 0 if out["ok"] else 1
    except Refused as exc:
        out, code = {"ok": False, "error": str(exc)}, exc.code
    except OSError as exc:
        out, code = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, 1
    print(json.dumps({**out, "exit": code}, sort_keys=True))
    return 0 if args.exit_zero else code


if __name__ == "__main__":
    sys.exit(main())
