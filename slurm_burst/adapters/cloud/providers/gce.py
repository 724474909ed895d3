"""Google Compute Engine through libcloud's ``gce`` driver: one ``insert`` per node,
labels for tags, preemptible VMs for spot, host keys from the guest attributes or serial
port 1, a service account key for credentials (docs/providers.md)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from slurm_burst.adapters.cloud.providers import Finding, Provider
from slurm_burst.core.hostkeys import (
    SERIAL_PORT_SCRIPT,
    key_entry,
    parse_console_host_keys,
)
from slurm_burst.core.ratelimit import ApiTable, Limit, Quota

if TYPE_CHECKING:
    from libcloud.compute.base import Node, NodeSize

    from slurm_burst.adapters.cloud.profiles import Placement
    from slurm_burst.config.model import NodeGroup, ProviderConfig
    from slurm_burst.core.cloud import LaunchSpec

CREDENTIALS_VAR = "GOOGLE_APPLICATION_CREDENTIALS"

# Compute Engine's rate quotas, per project ("Compute Engine rate quotas"; docs/scale.md):
# calls per quota group in each 60-s interval synchronized to the minute, refilled whole
# at the next, an excess answered 403 rateLimitExceeded (sometimes 429). Not buckets:
# core.ratelimit.QuotaWindow. A project's own values are on its Quotas page; a profile's
# api_limits sets a group's (its refill a second times 60).
API_TABLE = ApiTable(
    apis={},
    default=Limit(1, 0),  # every call is in a quota group below
    resources={},
    total=Limit(10, 40),  # at most 50 calls in any second sent, as on EC2
    quotas={
        "default": Quota(1500),  # mutations: insert, bulkInsert, delete, setLabels
        "read_requests": Quota(1500),  # *.get, guest attributes, serial port output
        "list_requests": Quota(1500),  # *.list, *.aggregatedList
        "operation_read_requests": Quota(1500),  # zone and region operations' get, wait
    },
    quota_of={
        "instances.insert": "default", "instances.bulkInsert": "default",
        "regionInstances.bulkInsert": "default", "instances.delete": "default",
        "instances.setLabels": "default", "resourcePolicies.insert": "default",
        "resourcePolicies.delete": "default",
        "instances.get": "read_requests", "instances.getGuestAttributes": "read_requests",
        "instances.getSerialPortOutput": "read_requests",
        "instances.list": "list_requests", "instances.aggregatedList": "list_requests",
        "zoneOperations.list": "list_requests",
        "zoneOperations.get": "operation_read_requests",
        "zoneOperations.wait": "operation_read_requests",
        "regionOperations.get": "operation_read_requests",
    },
)  # fmt: skip


def label(text: str) -> str:
    """A GCE label key or value: lower case letters, digits, '_' and '-', at most 63."""
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


class Gce(Provider):
    name = "gce"
    spot = True  # scheduling.preemptible
    host_key_sources = MappingProxyType({
        "guest-attributes": f"{__name__}:GuestAttributes",
        "serial-port": f"{__name__}:SerialPort",
    })  # fmt: skip
    host_key_reads_per_second = 10.0
    file_extras = ("project",)
    api_names = MappingProxyType({
        "launch": "instances.insert", "find": "instances.aggregatedList",
        "list": "instances.aggregatedList", "get": "instances.get",
        "tag": "instances.setLabels", "terminate": "instances.delete",
        "host_keys": "instances.getGuestAttributes",
    })  # fmt: skip

    def api_table(self) -> ApiTable:
        return API_TABLE

    def budget_scope(self, prov: ProviderConfig) -> tuple[str, ...]:
        """A project's quotas: every region's profiles on one project share them."""
        creds = prov.credentials
        project = str(prov.options.get("project", ""))
        return (prov.driver, project, (creds.file or creds.key_env) if creds else "",
                str(prov.options.get("host", "")))  # fmt: skip

    def group_problems(self, group: NodeGroup) -> list[Finding]:
        if group.gpus and not (group.accelerator or group.gpu_type):
            return [("accelerator", "GCE needs the accelerator type for the GPUs")]
        return []

    def profile_problems(self, prov: ProviderConfig) -> list[Finding]:
        endpoint = prov.options.get("endpoint")
        if endpoint is None:
            return []
        try:
            split_endpoint(str(endpoint))
        except ValueError as exc:
            return [("options.endpoint", str(exc))]
        return []

    def construct(
        self, cls: Any, prov: ProviderConfig, kwargs: dict[str, Any], key: str, secret: str
    ) -> Any:
        """GCENodeDriver(user_id, key, datacenter=zone, project=...); with an ``endpoint``
        option, every API call and the token exchange go there instead of Google's own
        hosts (a Private Service Connect endpoint; the lab's emulator)."""
        kwargs.setdefault("datacenter", prov.zone or prov.region or None)
        endpoint = kwargs.pop("endpoint", None)
        if endpoint:
            cls = endpoint_driver(cls, str(endpoint))
        return cls(key, secret, **kwargs)

    def credentials_from_env(self, env: Mapping[str, str], where: str) -> dict[str, Any]:
        """The service account key file GOOGLE_APPLICATION_CREDENTIALS names (private)."""
        from slurm_burst.adapters.cloud.credentials import CredentialsError, check_private

        path = env.get(CREDENTIALS_VAR)
        if not path:
            raise CredentialsError(f"{where}: not configured, and {CREDENTIALS_VAR} is not set")
        check_private(Path(path), CREDENTIALS_VAR)
        try:
            info = json.loads(Path(path).read_text())
            email = info["client_email"]
        except (OSError, ValueError, KeyError, TypeError):
            raise CredentialsError(
                f"{CREDENTIALS_VAR} {path}: not a service account key file"
            ) from None
        out: dict[str, Any] = {"key": email, "secret": path}
        if info.get("project_id"):
            out["project"] = info["project_id"]
        return out

    def launch_args(
        self, driver: Any, spec: LaunchSpec, p: Placement, size: NodeSize, tags: Mapping[str, str]
    ) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "name": spec.node,
            "size": size,
            "image": spec.image,
            "ex_network": p.network or "default",
            "use_existing_disk": False,  # a fresh boot disk each launch, never a leftover
            "ex_labels": {label(k): label(v) for k, v in tags.items()},
            "ex_metadata": {
                "startup-script": spec.user_data,
                "ssh-keys": f"{p.ssh_user}:{spec.ssh_public_key.strip()}",
            },
        }
        # where the daemon will read the host keys: the guest environment's hostkeys/
        # guest attributes, or the block our startup script prints to serial port 1
        if (p.host_keys or self.default_host_key_source) == "serial-port":
            kw["ex_metadata"]["startup-script"] = spec.user_data + SERIAL_PORT_SCRIPT
        else:
            kw["ex_metadata"]["enable-guest-attributes"] = "TRUE"
        if p.zone:
            kw["location"] = p.zone
        if p.subnet:
            kw["ex_subnetwork"] = p.subnet
        if p.security_groups:
            kw["ex_tags"] = list(p.security_groups)  # firewall rules select by network tag
        if spec.gpus:
            kw["ex_accelerator_type"] = spec.accelerator
            kw["ex_accelerator_count"] = spec.gpus
        if spec.gpus or spec.spot:
            kw["ex_on_host_maintenance"] = "TERMINATE"  # GPUs and preemptible VMs cannot migrate
            kw["ex_automatic_restart"] = False
        if spec.spot:
            kw["ex_preemptible"] = True
        if spec.disk_gb:
            kw["ex_disk_size"] = spec.disk_gb
        return kw


class GuestAttributes:
    """``instances.getGuestAttributes?queryPath=hostkeys/``, where Google's guest
    environment publishes the keys (the launch sets ``enable-guest-attributes=TRUE``)."""

    name = "guest-attributes"

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    def read(self, node: Node) -> list[tuple[str, str]]:
        from libcloud.common.types import LibcloudError

        from slurm_burst.adapters.cloud.attest import http_status

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


class SerialPort:
    """Serial port 1, where the launch's startup script prints the key block (Google's
    images have no cloud-init)."""

    name = "serial-port"

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    def read(self, node: Node) -> list[tuple[str, str]]:
        return parse_console_host_keys(str(self.driver.ex_get_serial_output(node) or ""))


PROVIDER = Gce()


def split_endpoint(url: str) -> tuple[bool, str, int]:
    """``https://HOST[:PORT]`` (or ``http://`` on loopback alone): (secure, host, port).
    ValueError, saying what is wrong, for anything else."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a URL: {exc}") from None
    host = parts.hostname or ""
    if parts.scheme not in ("https", "http") or not host or parts.path not in ("", "/"):
        raise ValueError(f"{url!r}: give https://HOST[:PORT], no path")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"{url!r}: give https://HOST[:PORT], nothing more")
    secure = parts.scheme == "https"
    if not secure and host not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"{url!r}: plain http only on this host (127.0.0.1): use https")
    return secure, host, port or (443 if secure else 80)


def endpoint_driver(cls: Any, url: str) -> Any:
    """``cls`` (libcloud's GCE driver) with its connection, and the OAuth connection
    its credential makes, pointed at ``url``: libcloud names www.googleapis.com and
    accounts.google.com itself, and passes a driver's own host to the GCE connection in
    the wrong place. The connection's keyword arguments reach the token connection too,
    so the first token exchange (made while the driver is built) goes there as well."""
    secure, host, port = split_endpoint(url)
    base = cls.connectionCls

    class Connection(base):  # type: ignore[misc,valid-type]
        def __init__(self, user_id: Any, key: Any, _secure: Any, *args: Any, **kw: Any) -> None:
            kw.update(host=host, port=port)
            super().__init__(user_id, key, secure, *args, **kw)

    return type(f"{cls.__name__}AtEndpoint", (cls,), {"connectionCls": Connection})
