"""Host keys of Azure VMs: their boot diagnostics serial logs (:class:`BootDiagnostics`)."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from slurm_burst.core.hostkeys import parse_console_host_keys

if TYPE_CHECKING:
    from libcloud.compute.base import Node

VM_API = "2024-03-01"
SAS_MINUTES = 60  # how long a serial log address stays valid; renewed before that


class BootDiagnostics:
    """The boot diagnostics serial log, read two ways:

    - where the profile names a storage account for it (``boot_diagnostics_storage``,
      with a read-only account SAS in the variable ``boot_diagnostics_sas_env`` names),
      the fleet listing's instance views already say where each VM's log is: one blob
      read, no ARM call at all (what a burst of hundreds of nodes needs: ARM allows ten
      writes a second);
    - else managed boot diagnostics: ``retrieveBootDiagnosticsData`` (an ARM POST, a
      write) gives a read-only address of the log, kept per instance until it expires
      (a log not written yet keeps its address), then a plain HTTPS GET.
    """

    name = "boot-diagnostics"

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self._uris: dict[str, tuple[str, float]] = {}  # instance id -> (log address, expiry)
        self._lock = threading.Lock()

    def _log_uri(self, node: Node) -> str:
        from libcloud.common.exceptions import BaseHTTPError
        from libcloud.common.types import LibcloudError

        from slurm_burst.adapters.cloud.attest import http_status

        with self._lock:
            uri, until = self._uris.get(str(node.id), ("", 0.0))
        if uri and time.time() < until:
            return uri
        try:
            resp = self.driver.connection.request(
                f"{node.id}/retrieveBootDiagnosticsData",
                params={"api-version": VM_API, "sasUriExpirationTimeInMinutes": SAS_MINUTES},
                method="POST",
            ).object
        except (LibcloudError, BaseHTTPError) as exc:
            if http_status(exc) in (404, 409):  # the VM is still being made
                return ""
            raise
        uri = str((resp or {}).get("serialConsoleLogBlobUri") or "")
        _check_https(uri)
        if uri:
            now = time.time()
            with self._lock:  # expired addresses go: the map holds only booting instances
                self._uris = {k: v for k, v in self._uris.items() if v[1] > now}
                self._uris[str(node.id)] = (uri, now + (SAS_MINUTES - 5) * 60)
        return uri

    def _verify(self) -> str | bool:
        """The profile's CA bundle (``ca_file``), else the system's trust."""
        return str(getattr(self.driver, "ca_file", "") or "") or True

    def read(self, node: Node) -> list[tuple[str, str]]:
        import requests  # libcloud's own HTTP library
        from libcloud.common.exceptions import BaseHTTPError

        listed = str((node.extra or {}).get("serial_log") or "")
        sas = str(getattr(self.driver, "boot_diagnostics_sas", "") or "")
        if listed and sas:  # the site's storage account: the listing said where
            _check_https(listed)
            resp = requests.get(f"{listed}?{sas.lstrip('?')}", timeout=30, verify=self._verify())
            if resp.status_code == 404:  # not written yet
                return []
            if resp.status_code != 200:  # (never the address: its query is a read token)
                raise BaseHTTPError(resp.status_code, "BootDiagnostics: the storage account "  # type: ignore[no-untyped-call]
                                    f"refused the serial log read: {resp.reason}", {})  # fmt: skip
            return parse_console_host_keys(resp.content.decode("utf-8", "replace"))
        uri = self._log_uri(node)
        if not uri:
            return []
        resp = requests.get(uri, timeout=30, verify=self._verify())
        if resp.status_code == 404:  # not written yet: the address stays good
            return []
        if resp.status_code == 403:  # the address expired: ask for another next time
            with self._lock:
                self._uris.pop(str(node.id), None)
            return []
        if resp.status_code != 200:
            raise BaseHTTPError(resp.status_code, f"BootDiagnostics: serial log: {resp.reason}", {})  # type: ignore[no-untyped-call]
        return parse_console_host_keys(resp.content.decode("utf-8", "replace"))


def _check_https(uri: str) -> None:
    """A serial log's address must be https (plain http only on loopback: the lab)."""
    from libcloud.common.types import LibcloudError

    parts = urlsplit(uri)
    loopback = parts.scheme == "http" and parts.hostname in ("127.0.0.1", "::1", "localhost")
    if uri and parts.scheme != "https" and not loopback:
        # (never the whole address: its query string is a read token)
        raise LibcloudError(f"BootDiagnostics: the serial log address is not https "
                            f"({parts.netloc})")  # fmt: skip
