"""Host-key sources: where each provider's API lets the daemon read a new instance's
SSH host keys (the bootstrap's trust anchor; see :mod:`slurm_burst.core.hostkeys`).

One source per provider profile, chosen by ``providers.*.host_keys`` (default: the
first of :data:`~slurm_burst.core.hostkeys.SOURCES` for its driver). Each ``read``
returns the keys, or ``[]`` while the instance has not published them yet; any other
failure is raised as the provider's error for :class:`LibcloudCloud` to type. They use
the driver's own signed connection for the calls libcloud does not wrap:

- **EC2** ``console``: GetConsoleOutput. EC2 serves the *latest* output on request
  only on Nitro instance types (``Latest=true``; DescribeInstanceTypes says which,
  asked once per type); elsewhere it serves output buffered at state changes, which
  can lag the boot by minutes.
- **GCE** ``guest-attributes``: ``instances.getGuestAttributes?queryPath=hostkeys/``,
  where Google's guest environment publishes the keys (the profile sets metadata
  ``enable-guest-attributes=TRUE`` at create). ``serial-port``: serial port 1, where
  the profile's startup script prints the key block.
- **Azure** ``boot-diagnostics``: ``retrieveBootDiagnosticsData`` gives a read-only
  (SAS) address of the serial log blob, kept per instance until it expires; the log
  is then read with a plain HTTPS GET. Boot diagnostics are enabled in the VM's own
  create request (:func:`~slurm_burst.adapters.cloud.profiles.azure_connection_fix`).
- **OpenStack** ``console``: libcloud's ``ex_get_console_output`` (a plugin's driver may
  name :class:`Console` as its source too).
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

from libcloud.common.exceptions import BaseHTTPError
from libcloud.common.types import LibcloudError
from libcloud.compute.base import Node

from slurm_burst import extensions
from slurm_burst.core.cloud import classify
from slurm_burst.core.hostkeys import key_entry, parse_console_host_keys

log = logging.getLogger(__name__)

Keys = list[tuple[str, str]]
EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
AZURE_VM_API = "2021-11-01"
SAS_MINUTES = 60  # how long an Azure serial log address stays valid; renewed before that


class HostKeySource(Protocol):
    name: str

    def read(self, node: Node) -> Keys: ...


class NoSource(LibcloudError):
    """The driver offers no host-key source (``config check`` says so beforehand)."""


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a libcloud error (GCE keeps it apart from its reason code)."""
    for attr in ("http_code", "code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int):
            return value
    return None


def _throttled(exc: BaseException) -> bool:
    """A throttled answer (a code :func:`~slurm_burst.core.cloud.classify` retries, or
    HTTP 429/503, as the adapter types them): says nothing of what was asked."""
    return classify(str(exc)).retryable or http_status(exc) in (429, 503)


class Console:
    """libcloud's ``ex_get_console_output`` (OpenStack and drivers like it): cloud-init's block."""

    name = "console"

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    def read(self, node: Node) -> Keys:
        fetch = getattr(self.driver, "ex_get_console_output", None)
        if fetch is None:
            raise NoSource(f"driver {self.driver.type} cannot read an instance console")
        out = fetch(node)
        if isinstance(out, dict):  # OpenStack {"output": ...}, libcloud's EC2 {"output": ...}
            out = out.get("output") or ""
        return parse_console_host_keys(str(out))


class Ec2Console:
    """GetConsoleOutput, the latest output where the instance type is on Nitro."""

    name = "console"

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self._nitro: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._asking = threading.Lock()  # one DescribeInstanceTypes at a time

    def nitro(self, instance_type: str) -> bool:
        """Whether EC2 serves ``instance_type``'s latest console output (asked once: a
        thousand first reads at once wait for one answer)."""
        with self._lock:
            if instance_type in self._nitro:
                return self._nitro[instance_type]
        with self._asking:
            return self._ask(instance_type)

    def _ask(self, instance_type: str) -> bool:
        with self._lock:
            if instance_type in self._nitro:
                return self._nitro[instance_type]
        params = {"Action": "DescribeInstanceTypes", "InstanceType.1": instance_type}
        try:
            obj = self.driver.connection.request(self.driver.path, params=params).object
            hypervisors = [e.text or "" for e in obj.iter(f"{{{EC2_NS}}}hypervisor")]
        except (LibcloudError, BaseHTTPError) as exc:  # e.g. not allowed by the IAM policy
            if _throttled(exc):
                raise  # asked again on the next read, never remembered as "not Nitro"
            log.warning(
                "cloud.instance_type_unknown type=%s error=%s: reading the buffered console",
                instance_type,
                str(exc)[:200],
            )
            hypervisors = []
        nitro = "nitro" in hypervisors
        with self._lock:
            self._nitro[instance_type] = nitro
        return nitro

    def read(self, node: Node) -> Keys:
        params = {"Action": "GetConsoleOutput", "InstanceId": str(node.id)}
        if self.nitro(str((node.extra or {}).get("instance_type") or "")):
            params["Latest"] = "true"
        obj = self.driver.connection.request(self.driver.path, params=params).object
        found = obj.find(f"{{{EC2_NS}}}output")
        encoded = (found.text or "").strip() if found is not None else ""
        text = base64.b64decode(encoded).decode("utf-8", "replace") if encoded else ""
        return parse_console_host_keys(text)


class GceGuestAttributes:
    """The ``hostkeys/`` guest attributes Google's guest environment publishes."""

    name = "guest-attributes"

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    def read(self, node: Node) -> Keys:
        zone = node.extra["zone"].name
        path = f"/zones/{zone}/instances/{node.name}/getGuestAttributes"
        try:
            resp = self.driver.connection.request(
                path, method="GET", params={"queryPath": "hostkeys/"}
            ).object
        except LibcloudError as exc:
            if http_status(exc) == 404:  # not published yet
                return []
            raise
        items = ((resp or {}).get("queryValue") or {}).get("items") or []
        keys = []
        for item in items:
            if item.get("namespace") != "hostkeys":
                continue
            ktype, words = str(item.get("key", "")), str(item.get("value", "")).split()
            body = words[1] if len(words) > 1 and words[0] == ktype else (words or [""])[0]
            key = key_entry(ktype, body)
            if key is not None:
                keys.append(key)
        return keys


class GceSerialPort:
    """Serial port 1, where the profile's startup script prints the key block."""

    name = "serial-port"

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    def read(self, node: Node) -> Keys:
        return parse_console_host_keys(str(self.driver.ex_get_serial_output(node) or ""))


class AzureBootDiagnostics:
    """The boot diagnostics serial log, read through the address Azure hands out."""

    name = "boot-diagnostics"

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self._uris: dict[str, tuple[str, float]] = {}  # instance id -> (log address, expiry)
        self._lock = threading.Lock()

    def _log_uri(self, node: Node) -> str:
        with self._lock:
            uri, until = self._uris.get(str(node.id), ("", 0.0))
        if uri and time.time() < until:
            return uri
        try:
            resp = self.driver.connection.request(
                f"{node.id}/retrieveBootDiagnosticsData",
                params={"api-version": AZURE_VM_API, "sasUriExpirationTimeInMinutes": SAS_MINUTES},
                method="POST",
            ).object
        except (LibcloudError, BaseHTTPError) as exc:
            if http_status(exc) in (404, 409):  # the VM is still being made
                return ""
            raise
        uri = str((resp or {}).get("serialConsoleLogBlobUri") or "")
        if uri and urlsplit(uri).scheme != "https":
            # (never the whole address: its query string is a read token)
            raise LibcloudError(
                f"BootDiagnostics: the serial log address is not https ({urlsplit(uri).netloc})"
            )
        if uri:
            now = time.time()
            with self._lock:  # expired addresses go: the map holds only booting instances
                self._uris = {k: v for k, v in self._uris.items() if v[1] > now}
                self._uris[str(node.id)] = (uri, now + (SAS_MINUTES - 5) * 60)
        return uri

    def read(self, node: Node) -> Keys:
        uri = self._log_uri(node)
        if not uri:
            return []
        import requests  # libcloud's own HTTP library

        resp = requests.get(uri, timeout=30)
        if resp.status_code in (403, 404):  # not written yet, or the address expired
            with self._lock:
                self._uris.pop(str(node.id), None)
            return []
        if resp.status_code != 200:
            raise BaseHTTPError(resp.status_code, f"BootDiagnostics: serial log: {resp.reason}", {})  # type: ignore[no-untyped-call]
        return parse_console_host_keys(resp.content.decode("utf-8", "replace"))


SOURCE_CLASSES: dict[tuple[str, str], Callable[[Any], HostKeySource]] = {
    ("ec2", "console"): Ec2Console,
    ("gce", "guest-attributes"): GceGuestAttributes,
    ("gce", "serial-port"): GceSerialPort,
    ("azure_arm", "boot-diagnostics"): AzureBootDiagnostics,
    ("openstack", "console"): Console,
}


def host_key_source(kind: str, driver: Any, name: str = "") -> HostKeySource:
    """The source a provider profile reads host keys from; :class:`NoSource` if none."""
    name = name or extensions.default_host_key_source(kind)
    make = SOURCE_CLASSES.get((kind, name))
    plugin = extensions.cloud_driver(kind) if make is None else None
    if plugin is not None and name in plugin.host_key_sources:
        make = extensions.resolve(plugin.host_key_sources[name])
    if make is None:
        raise NoSource(f"driver {kind!r} has no host-key source {name or '(none)'!r}")
    return make(driver)
