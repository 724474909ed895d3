"""An S3 bucket (AWS, or any S3-compatible server) through libcloud's S3 storage driver.

libcloud signs every request (AWS Signature Version 4) and talks HTTP; this adapter
adds what staging needs on top:

- **one driver per thread.** A libcloud connection keeps the last response on itself,
  so two threads sharing a driver can read each other's answers; uploads run in a pool;
- **a single PUT per object, streamed,** with its MD5 checked against the ETag the
  server answers (S3's own digest of what it stored), and a pace callback between chunks
  (the bandwidth limit). libcloud's ``upload_object`` reads a file twice and its
  streamed upload always goes multipart; objects here are at most a file each;
- **grants** (``grant``): presigned GET URLs (a node's stage-in) and PUT URLs (its
  stage-out), Signature Version 4 in the query string, made locally (``sigv4.py``).
  libcloud's ``get_object_cdn_url`` signs the host without its port, which any
  S3-compatible server on a port of its own refuses;
- **errors with the store's code**: ``AccessDenied`` (refused credentials),
  ``NoSuchBucket``, ``StorageUnreachable`` (no answer), else ``StorageError`` with the
  HTTP status. Never a credential in a message.
"""

from __future__ import annotations

import hashlib
import io
import math
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, BinaryIO
from urllib.parse import quote

from libcloud.common.exceptions import BaseHTTPError
from libcloud.common.types import InvalidCredsError, LibcloudError
from libcloud.storage.base import Container
from libcloud.storage.drivers.s3 import S3StorageDriver
from libcloud.storage.types import ContainerDoesNotExistError

from slurm_burst.adapters.storage.sigv4 import presign
from slurm_burst.core.staging import StorageError

CHUNK = 1024 * 1024
_ETAG_MD5 = re.compile(r"[0-9a-f]{32}")
# what libcloud and the HTTP client below it raise (requests' errors are OSErrors)
_ERRORS = (LibcloudError, BaseHTTPError, OSError)
_RETRYABLE = frozenset({"SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable"})


class S3Store:
    """One bucket. ``endpoint``: "host" or "host:port" of an S3-compatible server; empty
    for AWS in ``region``. Builds no driver until the first call."""

    missing_bucket = b"NoSuchBucket"  # in a 404's body: the bucket, not the object, is gone
    upload_headers: Mapping[str, str] = {}  # what a node's PUT to a grant must send

    def __init__(
        self,
        name: str,
        *,
        bucket: str,
        region: str,
        keys: Mapping[str, str],  # key, secret, and token if any (credentials.resolve_store)
        endpoint: str = "",
        secure: bool = True,
        timeout: float = 60.0,
    ) -> None:
        self.name = name
        self.bucket = bucket
        self.region = region or "us-east-1"
        host, _, port = endpoint.partition(":")
        self.host = host or f"s3.{self.region}.amazonaws.com"
        self.port = int(port) if port else (443 if secure else 80)
        self.secure = secure
        self._key, self._secret = keys["key"], keys["secret"]
        self._token = keys.get("token", "")
        self.timeout = timeout
        self._local = threading.local()

    # -- the port --------------------------------------------------------------------

    def has(self, key: str) -> bool:
        resp = self._call("HEAD", key)
        if resp.status == 404:
            return False
        self._ok(resp, "HEAD", key)
        return True

    def read(self, key: str, limit: int) -> bytes | None:
        resp = self._call("GET", key, stream=True)
        if resp.status == 404 and self.missing_bucket not in resp.response.body[:2000]:
            return None
        self._ok(resp, "GET", key)
        data = bytearray()
        for chunk in resp.iter_content(65536):
            data += chunk
            if len(data) > limit:
                raise StorageError(f"store {self.name}: {key} is over {limit} bytes", "TooLarge")
        return bytes(data)

    def write(
        self, key: str, body: BinaryIO, size: int, pace: Callable[[int], None] | None = None
    ) -> int:
        reader = _Reader(body, size, pace)
        headers = {"Content-Length": str(size), "Content-Type": "application/octet-stream"}
        # an empty body as bytes: the HTTP client would send a stream of length 0 chunked
        resp = self._call("PUT", key, data=reader if size else b"", headers=headers)
        self._ok(resp, "PUT", key)
        if reader.sent != size:
            raise StorageError(f"store {self.name}: {key}: sent {reader.sent} of {size} bytes")
        etag = resp.headers.get("etag", "").strip('"').lower()
        if _ETAG_MD5.fullmatch(etag) and etag != reader.md5.hexdigest():
            self.delete(key)
            raise StorageError(f"store {self.name}: {key}: the store's digest differs", "BadDigest")
        return reader.sent

    def write_bytes(self, key: str, body: bytes) -> int:
        return self.write(key, io.BytesIO(body), len(body))

    def read_into(self, key: str, sink: Callable[[bytes], None]) -> int | None:
        resp = self._call("GET", key, stream=True)
        if resp.status == 404 and self.missing_bucket not in resp.response.body[:2000]:
            return None
        self._ok(resp, "GET", key)
        got = 0
        try:
            for chunk in resp.iter_content(CHUNK):
                got += len(chunk)
                sink(chunk)
        except _ERRORS as exc:
            raise self._error(exc, "GET", key) from None
        return got

    def grant(self, key: str, seconds: int, method: str = "GET") -> str:
        if method not in ("GET", "PUT"):
            raise ValueError(f"a grant is for GET or PUT, not {method[:10]!r}")
        return presign(
            method, self._url_base(), self._path(key), region=self.region,
            key=self._key, secret=self._secret, seconds=seconds, token=self._token,
        )  # fmt: skip

    def keys(self, prefix: str) -> Iterator[tuple[str, int, float]]:
        driver = self._driver()
        container = Container(name=self.bucket, extra={}, driver=driver)
        try:
            for obj in driver.iterate_container_objects(container, prefix=prefix):
                yield obj.name, int(obj.size), _modified(obj.extra.get("last_modified"))
        except _ERRORS as exc:
            raise self._error(exc, "LIST", prefix) from None

    def delete(self, key: str) -> None:
        resp = self._call("DELETE", key)
        if resp.status not in (200, 204, 404):
            self._ok(resp, "DELETE", key)

    # -- the edge ------------------------------------------------------------------------

    def _driver(self) -> Any:
        driver = getattr(self._local, "driver", None)
        if driver is None:
            driver = S3StorageDriver(  # type: ignore[no-untyped-call]
                self._key, self._secret, secure=self.secure, host=self.host, port=self.port,
                region=self.region, token=self._token or None, timeout=self.timeout,
            )  # fmt: skip
            self._local.driver = driver
        return driver

    def _url_base(self) -> str:
        default = 443 if self.secure else 80
        host = self.host if self.port == default else f"{self.host}:{self.port}"
        return f"{'https' if self.secure else 'http'}://{host}"

    def _path(self, key: str) -> str:
        return f"/{self.bucket}/{quote(key, safe='/~')}"

    def _call(self, method: str, key: str, **kw: Any) -> Any:
        try:
            return self._driver().connection.request(self._path(key), method=method, raw=True, **kw)
        except _ERRORS as exc:
            raise self._error(exc, method, key) from None

    def _ok(self, resp: Any, method: str, key: str) -> None:
        status = int(resp.status)
        if 200 <= status < 300:
            return
        code = {403: "AccessDenied", 401: "AccessDenied"}.get(status, "StorageError")
        body = bytes(resp.response.body[:2000]).decode("utf-8", "replace")
        found = re.search(r"<Code>([A-Za-z]{1,64})</Code>", body)
        if found:
            code = found.group(1)
        again = status >= 500 or code in _RETRYABLE
        raise StorageError(f"store {self.name}: {method} {key}: HTTP {status} {code}", code, again)

    def _error(self, exc: Exception, method: str, key: str) -> StorageError:
        if isinstance(exc, InvalidCredsError):
            return StorageError(f"store {self.name}: {method} {key}: access denied", "AccessDenied")
        if isinstance(exc, ContainerDoesNotExistError) or "status code: 404" in str(exc):
            return StorageError(f"store {self.name}: no bucket {self.bucket}", "NoSuchBucket")
        if isinstance(exc, OSError):
            return StorageError(
                f"store {self.name}: {method} {key}: {self.host}:{self.port} did not answer "
                f"({type(exc).__name__})",
                "StorageUnreachable",
                retryable=True,
            )
        status = re.search(r"[Ss]tatus code: (\d{3})", str(exc))
        again = bool(status and status.group(1).startswith("5"))
        return StorageError(
            f"store {self.name}: {method} {key}: {type(exc).__name__}: {exc}", retryable=again
        )


def _modified(said: object) -> float:
    """A listing's LastModified (ISO 8601 or RFC 1123, UTC) as unix time; math.inf if it says none:
    an object of unknown age is never old enough to be collected."""
    if not isinstance(said, str):
        return math.inf
    try:
        at = datetime.fromisoformat(said)
    except ValueError:  # Azure's listing says it as HTTP does (RFC 1123)
        try:
            at = parsedate_to_datetime(said)
        except (TypeError, ValueError, IndexError):
            return math.inf
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


class _Reader:
    """A file handed to the HTTP client: reads in chunks, counts, digests (MD5, for the
    ETag) and paces. ``__len__`` gives the client its Content-Length; ``__next__`` tells
    libcloud's signer the payload is a stream (signed as UNSIGNED-PAYLOAD)."""

    def __init__(self, body: BinaryIO, size: int, pace: Callable[[int], None] | None) -> None:
        self.body, self.size, self.pace = body, size, pace
        self.sent = 0
        self.md5 = hashlib.md5(usedforsecurity=False)

    def __len__(self) -> int:
        return self.size

    def read(self, n: int = -1) -> bytes:
        left = self.size - self.sent
        n = left if n is None or n < 0 else min(n, left, CHUNK)
        if n <= 0:
            return b""
        if self.pace is not None:
            self.pace(n)
        data = self.body.read(n)
        self.sent += len(data)
        self.md5.update(data)
        return data

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        data = self.read(CHUNK)
        if not data:
            raise StopIteration
        return data
