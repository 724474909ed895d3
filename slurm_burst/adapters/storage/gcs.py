"""A Google Cloud Storage bucket through libcloud's Google Storage driver, with a
service account's HMAC key (Cloud Storage's interoperable access: the driver signs each
request ``GOOG1 <key id>:<signature>``).

The same store as ``s3.py``, on Google's terms. **Grants**: libcloud's Google Storage
driver has no signed-URL call, and a node must never hold the key. The nearest safe grant
Cloud Storage offers is a V4 signed URL made locally from the HMAC key: the same
algorithm as S3's presigned URL (``sigv4.py``: AWS4-HMAC-SHA256, which Cloud Storage
takes from an HMAC key), scoped to region ``auto``, one method on one object, at most
7 days. Give the HMAC key's service account access to the staging bucket alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from libcloud.storage.drivers.google_storage import GoogleStorageDriver

from slurm_burst.adapters.storage.s3 import S3Store

ENDPOINT = "storage.googleapis.com"


class GcsStore(S3Store):
    """One bucket; ``endpoint`` empty is Cloud Storage's own."""

    def __init__(
        self,
        name: str,
        *,
        bucket: str,
        keys: Mapping[str, str],  # key: the HMAC key's id (GOOG...); secret: its secret
        endpoint: str = "",
        secure: bool = True,
        timeout: float = 60.0,
    ) -> None:
        super().__init__(name, bucket=bucket, region="auto", keys=keys,
                         endpoint=endpoint or ENDPOINT, secure=secure, timeout=timeout)  # fmt: skip

    def _driver(self) -> Any:
        driver = getattr(self._local, "driver", None)
        if driver is None:
            # host and port set after: given to the driver, libcloud 3.9 hands the host to
            # the connection as its auth_type (positionally), and the HMAC key goes unused
            driver = GoogleStorageDriver(  # type: ignore[no-untyped-call]
                self._key, self._secret, secure=self.secure, timeout=self.timeout
            )
            driver.connection.host, driver.connection.port = self.host, self.port
            self._local.driver = driver
        return driver
