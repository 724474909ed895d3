"""The mesh store: staging's store in a directory on the controller, served to the cloud
nodes through the WireGuard mesh (``driver = "mesh"``: the fallback for a site without
object storage).

The daemon serves the directory over HTTP on the hub's mesh address
(:class:`MeshStoreServer`); nothing but the mesh reaches that address, and WireGuard
encrypts and authenticates every packet on the way. Every request carries a grant: an
HMAC-SHA256 of (method, key, expiry) under a key that never leaves the controller
(generated there, 0600), the same shape as a presigned S3 URL. So the node programs
(``node/stagein.py``, ``node/stageout.py``) fetch and send exactly as they do with a
cloud store, and :class:`MeshStore`, the ``ObjectStore`` the controller's side uses, is
a client of the same server (an as-user child of ``stage push`` or ``stage promote``
holds the key, read as root, and no file of the store).

The server:

- opens every path below its root component by component with ``O_NOFOLLOW`` (a
  symlink or FIFO planted in the directory is never followed or opened);
- takes a key only as staging writes them (``a-z0-9._~-`` components, none starting
  with a dot, so its own temporary files are never keys);
- writes an object to a temporary file beside it, fsynced, then renamed into place:
  a PUT cut off leaves nothing; a PUT over ``max_object`` or past the disk's free
  space (less a reserve) is refused before a byte is written; its answer carries the
  MD5 of what it stored as ETag, which the client checks, as S3's;
- keeps the connection, deadline and slot bounds of ``adapters.served``
  (:data:`LIMITS`): a request takes a slot once its headers are in, a caller a few
  slots at most (a node stalling its own PUTs leaves the others theirs), and a body or
  an answer must move at :data:`MIN_RATE` or faster once past the request's deadline.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import http.client
import io
import json
import logging
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from slurm_burst.adapters.served import Guard, GuardedHandler, GuardedServer, Limits, Served
from slurm_burst.core.staging import StorageError, StorageUnavailable
from slurm_burst.fileio import FileRefused
from slurm_burst.trusted import Writers, open_trusted

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024
KEY_BYTES = 32
MAX_GRANT = 7 * 86400  # the longest grant the server honours
RESERVE = 1 << 30  # free space a PUT must leave on the store's disk
_COMPONENT = r"[A-Za-z0-9_~-][A-Za-z0-9._~-]{0,254}"
_KEY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT}){{0,15}}", re.ASCII)
_PREFIX = re.compile(r"[A-Za-z0-9._~/-]{0,1024}", re.ASCII)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP = ".put-"
MIN_RATE = 256 * 1024  # bytes a second a large body or answer must move at, at least
LIMITS = Limits(connections=256, per_caller=16, slots=64, slots_per_caller=8,
                header_seconds=10.0, idle_seconds=5.0, request_seconds=60.0,
                read_seconds=60.0)  # fmt: skip


def sign(secret: bytes, method: str, key: str, expires: int) -> str:
    """The grant of ``method`` on ``key`` until ``expires`` (unix time)."""
    msg = f"slurm-burst-mesh-1\n{method}\n{key}\n{expires}".encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def signed_path(secret: bytes, method: str, key: str, expires: int) -> str:
    """The path and query of a request for ``method`` on ``key`` (LIST: ``key`` is the
    prefix listed)."""
    query = {"expires": str(expires), "signature": sign(secret, method, key, expires)}
    if method == "LIST":
        return "/?" + urlencode({"list": key, **query})
    return f"/{quote(key, safe='/~')}?{urlencode(query)}"


def load_key(path: Path, create: bool, writers: Writers | None = None) -> bytes:
    """The store's grant key from ``path`` (0600, root's); made there first if ``create``
    and there is none. StorageUnavailable when it cannot be read, or when someone but
    root (or us) wrote it or could have: its owner and every directory above it are
    checked on its descriptor (``writers``: root and us, and the group the state
    directory is shared with), so a key planted by a member of SlurmUser's group, who
    could then mint grants for every account's data, is never used."""
    if create:
        with contextlib.suppress(FileExistsError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, secrets.token_hex(KEY_BYTES).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
    try:
        fd = open_trusted(path, writers or Writers.us())
    except FileRefused as exc:
        raise StorageUnavailable(f"the mesh store's key: {exc}") from None
    except OSError as exc:
        raise StorageUnavailable(
            f"the mesh store's key {path}: {exc.strerror} (it is made by the daemon at its "
            "start, and read as root)"
        ) from None
    try:
        st = os.fstat(fd)
        body = os.read(fd, 4 * KEY_BYTES)
    finally:
        os.close(fd)
    if st.st_mode & 0o077:
        raise StorageUnavailable(f"the mesh store's key {path}: not a 0600 file")
    key = body.strip()
    if not re.fullmatch(rb"[0-9a-f]{64}", key):
        raise StorageUnavailable(f"the mesh store's key {path}: not 64 hex digits")
    return key


# -- the server, in the daemon ------------------------------------------------------------


class MeshStoreServer(Served):
    """Serves ``root`` at ``listen`` (host, port) to whoever holds a grant."""

    def __init__(
        self, root: str | Path, secret: bytes, listen: tuple[str, int], *,
        max_object: int = 1 << 40, limits: Limits = LIMITS,
        clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self.root = Path(root)
        self.secret = secret
        self.listen = listen
        self.max_object = max_object
        self.limits = limits
        self.clock = clock
        self._httpd: GuardedServer | None = None
        self._root_fd = -1

    def start(self) -> None:
        """Bind and serve in a thread (OSError when the address is not this host's)."""
        if self._httpd is not None:
            return
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._root_fd = os.open(self.root, _DIR)
        try:
            os.fchmod(self._root_fd, 0o700)
            self._sweep_temporaries()
            httpd = GuardedServer(self.listen, _Handler, Guard(self.limits, "mesh_store"))
        except OSError:
            os.close(self._root_fd)
            self._root_fd = -1
            raise
        httpd.store = self  # type: ignore[attr-defined]
        self._httpd = httpd
        threading.Thread(target=httpd.serve_forever, name="mesh-store", daemon=True).start()
        log.info("mesh_store.serving root=%s listen=%s:%d", self.root, *self.listen)

    def close(self) -> None:
        super().close()
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1

    # -- what a request may do ------------------------------------------------------

    def allowed(self, method: str, key: str, expires: str, signature: str) -> bool:
        if not (expires.isascii() and expires.isdigit() and len(expires) <= 12):
            return False
        at = int(expires)
        if not self.clock() <= at <= self.clock() + MAX_GRANT:
            return False
        return hmac.compare_digest(sign(self.secret, method, key, at), signature)

    def dir_fd(self, parts: list[str], create: bool) -> int:
        """An fd of the directory ``parts`` below the root, walked without following a
        link (made 0700 where missing if ``create``); FileNotFoundError if it is not."""
        fd = os.dup(self._root_fd)
        try:
            for part in parts:
                try:
                    nxt = os.open(part, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o700, dir_fd=fd)
                    nxt = os.open(part, _DIR, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except OSError:
            os.close(fd)
            raise
        return fd

    def open_object(self, key: str) -> tuple[int, int] | None:
        """(fd, size) of ``key``'s file, None if there is none (or it is not a plain file)."""
        *parts, name = key.split("/")
        try:
            d = self.dir_fd(parts, create=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:  # ELOOP: a symlink where a directory was
            log.warning("mesh_store.refused key=%s error=%s", key, exc.strerror)
            return None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=d)  # fmt: skip
        except OSError:
            return None
        finally:
            os.close(d)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            return None
        return fd, st.st_size

    def store_object(self, key: str, body: BinaryIO | io.BufferedIOBase, size: int) -> str:
        """``size`` bytes of ``body`` as ``key``, whole or not at all; its MD5."""
        *parts, name = key.split("/")
        d = self.dir_fd(parts, create=True)
        temp = f"{_TEMP}{secrets.token_hex(8)}"
        try:
            fs = os.statvfs(d)
            if size + RESERVE > fs.f_bavail * fs.f_frsize:
                raise _Refusal(507, "InsufficientStorage", "the store's disk is full")
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=d)  # fmt: skip
            md5 = hashlib.md5(usedforsecurity=False)
            try:
                left = size
                while left:
                    chunk = body.read(min(CHUNK, left))
                    if not chunk:
                        raise _Refusal(400, "IncompleteBody", f"{size - left} of {size} bytes")
                    md5.update(chunk)
                    os.write(fd, chunk)
                    left -= len(chunk)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, name, src_dir_fd=d, dst_dir_fd=d)
            temp = ""
            return md5.hexdigest()
        finally:
            if temp:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=d)
            os.close(d)

    def delete_object(self, key: str) -> None:
        *parts, name = key.split("/")
        try:
            d = self.dir_fd(parts, create=False)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISDIR(os.stat(name, dir_fd=d, follow_symlinks=False).st_mode):
                    raise _Refusal(400, "NotAnObject", "a directory")
                os.unlink(name, dir_fd=d)
        finally:
            os.close(d)

    def listing(self, prefix: str) -> list[tuple[str, int, float]]:
        """(key, size, mtime) of every object whose key starts with ``prefix``."""
        out = []
        root = os.dup(self._root_fd)
        try:
            for top, dirs, files, dfd in os.fwalk(".", dir_fd=root, follow_symlinks=False):
                rel = "" if top == "." else top.removeprefix("./") + "/"
                dirs[:] = [d for d in dirs if _KEY.fullmatch(d)
                           and (prefix.startswith(rel + d + "/")
                                or (rel + d + "/").startswith(prefix))]  # fmt: skip
                for f in files:
                    key = rel + f
                    if not (key.startswith(prefix) and _KEY.fullmatch(f)):
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        st = os.stat(f, dir_fd=dfd, follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode):
                            out.append((key, st.st_size, st.st_mtime))
        finally:
            os.close(root)
        return sorted(out)

    def _sweep_temporaries(self) -> None:
        """Remove what PUTs cut off by a stop left (none is in flight at start)."""
        root = os.dup(self._root_fd)
        try:
            for _top, dirs, files, dfd in os.fwalk(".", dir_fd=root, follow_symlinks=False):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                for f in files:
                    if f.startswith(_TEMP):
                        with contextlib.suppress(OSError):
                            os.unlink(f, dir_fd=dfd)
        finally:
            os.close(root)


class _Refusal(StorageError):
    """What the server answers instead of doing a request: an HTTP status and a code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message, code)
        self.status = status


class _Handler(GuardedHandler):
    server_version = "slurm-burst-mesh-store"
    sys_version = ""

    @property
    def store(self) -> MeshStoreServer:
        return self.server.store  # type: ignore[attr-defined,no-any-return]

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("mesh_store.request %s", format % args)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        with self.slot() as ok:
            if not ok:
                self._answer(503, "SlowDown", "too many requests at once")
                return
            try:
                self._dispatch(method)
            except _Refusal as exc:
                self._answer(exc.status, exc.code, str(exc))
            except (ConnectionError, TimeoutError):
                self.close_connection = True
            except OSError as exc:
                if exc.errno in (errno.EPIPE, errno.EBADF, errno.ENOTCONN):  # shut down
                    self.close_connection = True
                    return
                log.error("mesh_store.error method=%s error=%s", method, exc)  # the disk
                self._answer(500, "InternalError", exc.strerror or type(exc).__name__)

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        try:
            fields = parse_qs(url.query, keep_blank_values=True, max_num_fields=4)
            query = {k: v[0] for k, v in fields.items()}
        except ValueError:  # more fields than a grant has
            raise _Refusal(400, "InvalidQuery", "not a grant's query") from None
        listing = method == "GET" and url.path == "/" and "list" in query
        key = query.get("list", "") if listing else unquote(url.path.removeprefix("/"))
        if not (_PREFIX.fullmatch(key) if listing else _KEY.fullmatch(key)):
            raise _Refusal(400, "InvalidKey", "not a key of staging's")
        signed = "LIST" if listing else ("GET" if method == "HEAD" else method)
        if not self.store.allowed(signed, key, query.get("expires", ""),
                                  query.get("signature", "")):  # fmt: skip
            raise _Refusal(403, "AccessDenied", "no valid grant for this request")
        if listing:
            body = "".join(json.dumps(row) + "\n" for row in self.store.listing(key)).encode()
            self._answer(200, body=body, kind="application/x-ndjson")
        elif method in ("GET", "HEAD"):
            self._get(key, method == "HEAD")
        elif method == "PUT":
            self._put(key)
        else:
            self.store.delete_object(key)
            self._answer(204)

    def _get(self, key: str, head: bool) -> None:
        found = self.store.open_object(key)
        if found is None:
            raise _Refusal(404, "NoSuchKey", "no such object")
        fd, size = found
        self.extend(self.store.limits.request_seconds + size / MIN_RATE)
        with os.fdopen(fd, "rb") as f:
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            if head:
                return
            while chunk := f.read(CHUNK):
                self.wfile.write(chunk)

    def _put(self, key: str) -> None:
        said = self.headers.get("Content-Length", "")
        if not (said.isascii() and said.isdigit() and len(said) <= 15):
            raise _Refusal(411, "MissingContentLength", "a PUT says its Content-Length")
        size = int(said)
        if size > self.store.max_object:
            raise _Refusal(413, "EntityTooLarge", f"over {self.store.max_object} bytes")
        self.extend(self.store.limits.request_seconds + size / MIN_RATE)
        md5 = self.store.store_object(key, self.rfile, size)
        self.send_response(200)
        self.send_header("ETag", f'"{md5}"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _answer(self, status: int, code: str = "", message: str = "", *, body: bytes = b"",
                kind: str = "text/plain") -> None:  # fmt: skip
        if not body and code:
            body = f"{code}: {message}\n".encode()
        with contextlib.suppress(OSError):  # the caller went away, or its deadline passed
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)


# -- the client, on the controller ----------------------------------------------------


class MeshStore:
    """The ObjectStore of a mesh store: every call a signed request to the daemon's
    server at ``host:port`` (safe from several threads: a connection per call)."""

    upload_headers: Mapping[str, str] = {}  # a node's PUT sends nothing more

    def __init__(
        self, name: str, *, host: str, port: int, secret: bytes, timeout: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self.name = name
        self.host, self.port = host, port
        self._secret = secret
        self.timeout = timeout
        self.clock = clock

    def grant(self, key: str, seconds: int, method: str = "GET") -> str:
        if method not in ("GET", "PUT"):
            raise ValueError(f"a grant is for GET or PUT, not {method[:10]!r}")
        return f"http://{self.host}:{self.port}{self._path(method, key, seconds)}"

    def has(self, key: str) -> bool:
        with self._call("HEAD", key) as resp:
            return self._ok(resp, "HEAD", key, missing=True)

    def read(self, key: str, limit: int) -> bytes | None:
        with self._call("GET", key) as resp:
            if not self._ok(resp, "GET", key, missing=True):
                return None
            data = self._receive(resp, "GET", key, limit + 1)
        if len(data) > limit:
            raise StorageError(f"store {self.name}: {key} is over {limit} bytes", "TooLarge")
        return data

    def read_into(self, key: str, sink: Callable[[bytes], None]) -> int | None:
        with self._call("GET", key) as resp:
            if not self._ok(resp, "GET", key, missing=True):
                return None
            got = 0
            try:
                while chunk := resp.read(CHUNK):
                    got += len(chunk)
                    sink(chunk)
            except (OSError, http.client.HTTPException) as exc:
                raise self._unreachable("GET", key, exc) from None
            return got

    def write(
        self, key: str, body: BinaryIO, size: int, pace: Callable[[int], None] | None = None
    ) -> int:
        md5 = hashlib.md5(usedforsecurity=False)
        sent = 0
        conn = self._connection()
        try:
            conn.putrequest("PUT", self._path("PUT", key, 300), skip_accept_encoding=True)
            conn.putheader("Content-Length", str(size))
            conn.endheaders()
            try:
                while sent < size:
                    n = min(CHUNK, size - sent)
                    if pace is not None:
                        pace(n)
                    chunk = body.read(n)
                    if not chunk:
                        break
                    md5.update(chunk)
                    conn.send(chunk)
                    sent += len(chunk)
            except OSError:  # the server may have refused before the body: its answer
                resp = conn.getresponse()
                self._ok(resp, "PUT", key)
                raise
            if sent != size:  # the server waits for the rest: drop the connection
                raise StorageError(f"store {self.name}: {key}: sent {sent} of {size} bytes")
            resp = conn.getresponse()
            self._ok(resp, "PUT", key)
            etag = (resp.getheader("ETag") or "").strip('"')
        except (OSError, http.client.HTTPException) as exc:
            raise self._unreachable("PUT", key, exc) from None
        finally:
            conn.close()
        if etag != md5.hexdigest():
            self.delete(key)
            raise StorageError(f"store {self.name}: {key}: the store's digest differs", "BadDigest")
        return sent

    def write_bytes(self, key: str, body: bytes) -> int:
        return self.write(key, io.BytesIO(body), len(body))

    def keys(self, prefix: str) -> Iterator[tuple[str, int, float]]:
        with self._call("LIST", prefix) as resp:
            self._ok(resp, "LIST", prefix)
            body = self._receive(resp, "LIST", prefix, 1 << 34)
        for line in body.splitlines():
            try:
                key, size, at = json.loads(line)
            except ValueError:
                raise StorageError(f"store {self.name}: a listing line is not JSON") from None
            yield str(key), int(size), float(at)

    def delete(self, key: str) -> None:
        with self._call("DELETE", key) as resp:
            self._ok(resp, "DELETE", key, missing=True)

    # -- the edge ------------------------------------------------------------------------

    def _path(self, method: str, key: str, seconds: int) -> str:
        return signed_path(self._secret, method, key, int(self.clock()) + max(1, seconds))

    def _connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    @contextlib.contextmanager
    def _call(self, method: str, key: str) -> Iterator[http.client.HTTPResponse]:
        conn = self._connection()
        verb = "GET" if method == "LIST" else method
        granted = "GET" if method == "HEAD" else method  # a read grant also answers HEAD
        try:
            try:
                conn.request(verb, self._path(granted, key, 300))
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                raise self._unreachable(method, key, exc) from None
            yield resp
        finally:
            conn.close()

    def _receive(self, resp: http.client.HTTPResponse, method: str, key: str, most: int) -> bytes:
        try:
            return resp.read(most)
        except (OSError, http.client.HTTPException) as exc:
            raise self._unreachable(method, key, exc) from None

    def _ok(self, resp: http.client.HTTPResponse, method: str, key: str,
            missing: bool = False) -> bool:  # fmt: skip
        """True for a 2xx; False for a 404 where ``missing`` is fine; else StorageError."""
        status = resp.status
        if 200 <= status < 300:
            return True
        code = resp.getheader("X-Error-Code") or "StorageError"
        if status == 404 and missing:
            return False
        again = status >= 500 and code != "InsufficientStorage"
        raise StorageError(f"store {self.name}: {method} {key}: HTTP {status} {code}", code, again)

    def _unreachable(self, method: str, key: str, exc: Exception) -> StorageError:
        return StorageError(
            f"store {self.name}: {method} {key}: the mesh store at {self.host}:{self.port} did "
            f"not answer ({type(exc).__name__}; is the daemon up?)",
            "StorageUnreachable",
            retryable=True,
        )
