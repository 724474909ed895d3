"""An Azure Blob Storage container through libcloud's Azure Blobs driver.

The same store as ``s3.py`` (one driver per thread, streamed writes, errors with the
store's own code), on Azure's terms:

- **the account** is the credentials' ``key`` and its base64 access key the
  ``secret``; ``endpoint`` empty is ``<account>.blob.core.windows.net``; ``HOST:PORT``
  is a server that names the account in the path (Azurite, Azure Blob Storage on IoT
  Edge), as libcloud's driver does for a custom host;
- **grants** are service SAS URLs made by libcloud's own ``get_object_cdn_url`` (signed
  with the account key, locally; ``r`` to read, ``wc`` to write), valid ``seconds``. A
  node's PUT to one must say ``x-ms-blob-type: BlockBlob`` (``upload_headers``), and
  asks for a service version whose single PUT takes up to 5,000 MiB;
- **writes** of more than ``single_put_max`` bytes go as blocks (Put Block, then Put
  Block List), because the driver speaks a service version (2018-11-09) whose single PUT
  stops at 256 MiB. Azure checks each block's Content-MD5; the blob gets no ETag that is
  an MD5 of its bytes, so readers verify (they do: SHA-256 of every file).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO
from urllib.parse import quote

from libcloud.storage.base import Container, Object
from libcloud.storage.drivers.azure_blobs import AzureBlobsStorageDriver

from slurm_burst.adapters.storage.s3 import _ERRORS, S3Store, _Reader
from slurm_burst.core.staging import StorageError

BLOCK = 64 * 1024 * 1024  # bytes of one block of a large write
SAS_VERSION = "2020-10-02"  # asked by a node's PUT: single PUTs up to 5,000 MiB


class AzureBlobStore(S3Store):
    """One container of one storage account."""

    missing_bucket = b"ContainerNotFound"
    upload_headers: Mapping[str, str] = {"x-ms-blob-type": "BlockBlob",
                                         "x-ms-version": SAS_VERSION}  # fmt: skip
    single_put_max = 256 * 1024 * 1024

    def __init__(
        self,
        name: str,
        *,
        container: str,
        keys: Mapping[str, str],  # key: the account; secret: its base64 access key
        endpoint: str = "",
        secure: bool = True,
        timeout: float = 60.0,
    ) -> None:
        account = keys["key"]
        host = endpoint.partition(":")[0] or f"{account}.blob.core.windows.net"
        super().__init__(name, bucket=container, region="", keys=keys,
                         endpoint=endpoint or host, secure=secure, timeout=timeout)  # fmt: skip
        self.account = account
        self.custom_host = bool(endpoint)
        try:
            base64.b64decode(keys["secret"], validate=True)
        except ValueError:
            why = f"store {name}: the access key is not base64"
            raise StorageError(why, "AccessDenied") from None

    def write(
        self, key: str, body: BinaryIO, size: int, pace: Callable[[int], None] | None = None
    ) -> int:
        if size > self.single_put_max:
            return self._write_blocks(key, body, size, pace)
        reader = _Reader(body, size, pace)
        headers = {"Content-Type": "application/octet-stream", "x-ms-blob-type": "BlockBlob"}
        if size:  # Shared Key signs a length of 0 as none: the header left out
            headers["Content-Length"] = str(size)
        resp = self._call("PUT", key, data=reader if size else b"", headers=headers)
        self._ok(resp, "PUT", key)
        if reader.sent != size:
            raise StorageError(f"store {self.name}: {key}: sent {reader.sent} of {size} bytes")
        said = resp.headers.get("content-md5", "")
        if said and said != base64.b64encode(reader.md5.digest()).decode():
            self.delete(key)
            raise StorageError(f"store {self.name}: {key}: the store's digest differs", "BadDigest")
        return reader.sent

    def _write_blocks(
        self, key: str, body: BinaryIO, size: int, pace: Callable[[int], None] | None
    ) -> int:
        ids: list[str] = []
        sent = 0
        while sent < size:
            n = min(BLOCK, size - sent)
            if pace is not None:
                pace(n)
            data = body.read(n)
            if len(data) != n:
                at = sent + len(data)
                raise StorageError(f"store {self.name}: {key}: the file ended at {at} bytes")
            block = base64.b64encode(f"{len(ids):08d}".encode()).decode()
            md5 = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
            self._block_call(key, data, {"comp": "block", "blockid": block},
                             {"Content-Length": str(n), "Content-MD5": md5})  # fmt: skip
            ids.append(block)
            sent += n
        listing = (
            "<?xml version='1.0' encoding='utf-8'?><BlockList>"
            + "".join(f"<Latest>{b}</Latest>" for b in ids)
            + "</BlockList>"
        )
        commit = listing.encode()
        md5 = base64.b64encode(hashlib.md5(commit, usedforsecurity=False).digest()).decode()
        self._block_call(key, commit, {"comp": "blocklist"},
                         {"Content-Length": str(len(commit)), "Content-MD5": md5,
                          "x-ms-blob-content-type": "application/octet-stream"})  # fmt: skip
        return sent

    def _block_call(
        self, key: str, data: bytes, params: dict[str, str], headers: dict[str, str]
    ) -> None:
        """One Put Block or Put Block List, as libcloud's own chunked upload makes them (a
        parsed request, so its query is signed as sent; its length and MD5 given, as
        Shared Key signs them)."""
        try:
            resp = self._driver().connection.request(
                self._path(key), method="PUT", data=data, params=params, headers=headers
            )
        except _ERRORS as exc:
            raise self._error(exc, "PUT", key) from None
        self._ok(resp, "PUT", key)

    def grant(self, key: str, seconds: int, method: str = "GET") -> str:
        if method not in ("GET", "PUT"):
            raise ValueError(f"a grant is for GET or PUT, not {method[:10]!r}")
        driver = self._driver()
        container = Container(name=self.bucket, extra={}, driver=driver)
        obj = Object(key, 0, "", {}, {}, container, driver)
        url: str = driver.get_object_cdn_url(obj, ex_expiry=seconds / 3600, ex_method=method)
        return url

    # -- the edge ------------------------------------------------------------------------

    def _driver(self) -> Any:
        driver = getattr(self._local, "driver", None)
        if driver is None:
            kw: dict[str, Any] = {"secure": self.secure, "timeout": self.timeout}
            if self.custom_host:
                kw.update(host=self.host, port=self.port)
            driver = AzureBlobsStorageDriver(self._key, self._secret, **kw)  # type: ignore[no-untyped-call]
            self._local.driver = driver
        return driver

    def _path(self, key: str) -> str:
        return f"/{self.bucket}/{quote(key, safe='/~')}"
