"""Microsoft Azure through libcloud's ``azure_arm`` driver: a NIC and a VM per node in the
profile's resource group, host keys from the boot diagnostics serial log, a service
principal for credentials (docs/providers.md). No spot in libcloud 3.9's driver."""

from __future__ import annotations

import importlib
import json
import threading
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from slurm_burst.adapters.cloud.providers import Finding, Provider
from slurm_burst.core.hostkeys import parse_console_host_keys

if TYPE_CHECKING:
    from libcloud.compute.base import Node, NodeSize

    from slurm_burst.adapters.cloud.profiles import Placement
    from slurm_burst.config.model import NodeGroup, ProviderConfig
    from slurm_burst.core.cloud import LaunchSpec

VM_API = "2021-11-01"
SAS_MINUTES = 60  # how long a serial log address stays valid; renewed before that


class AzureArm(Provider):
    name = "azure_arm"
    # destroy_node polls until the VM is gone, then deletes its NIC and disk (libcloud's
    # default: a first wait of 10 s, 10 polls); VMs take 30-120 s to delete
    destroy_kwargs = MappingProxyType({"ex_poll_wait": 3, "ex_poll_qty": 60})
    host_key_sources = MappingProxyType({"boot-diagnostics": f"{__name__}:BootDiagnostics"})
    # each read of the log's address is an ARM POST, the log itself a blob read
    host_key_reads_per_second = 2.0
    standard_env = MappingProxyType({
        "key": "AZURE_CLIENT_ID",
        "secret": "AZURE_CLIENT_SECRET",
        "tenant_id": "AZURE_TENANT_ID",
        "subscription_id": "AZURE_SUBSCRIPTION_ID",
    })  # fmt: skip
    file_extras = ("tenant_id", "subscription_id")

    def profile_problems(self, prov: ProviderConfig) -> list[Finding]:
        return [(key, "azure_arm needs it") for key in ("resource_group", "network", "zone")
                if not getattr(prov, key)]  # fmt: skip

    def group_problems(self, group: NodeGroup) -> list[Finding]:
        if group.image.count(":") != 3:
            return [("image", "azure_arm needs a URN PUBLISHER:OFFER:SKU:VERSION")]
        return []

    def construct(
        self, cls: Any, prov: ProviderConfig, kwargs: dict[str, Any], key: str, secret: str
    ) -> Any:
        """AzureNodeDriver(tenant_id, subscription_id, key, secret, region=...)."""
        tenant, subscription = kwargs.pop("tenant_id", ""), kwargs.pop("subscription_id", "")
        if prov.region:
            kwargs.setdefault("region", prov.region)
        return cls(tenant, subscription, key, secret, **kwargs)

    def prepare(self, driver: Any) -> None:
        """Two changes to what libcloud 3.9's driver sends, at its JSON encoder:

        - it puts ``base64.b64encode(customData)`` (bytes) into the JSON body, which
          ``json.dumps`` refuses: send it as the ASCII text it is;
        - its ``create_node`` cannot enable boot diagnostics, where the daemon reads the
          new VM's host keys: the VM's create request (its PUT) gets a
          ``diagnosticsProfile`` with managed boot diagnostics (no storage account).
        """
        conn = getattr(driver, "connection", None)
        if conn is None or getattr(conn, "_slurm_burst_fixed", False):
            return

        def encode_data(data: Any) -> str:
            if isinstance(data, dict) and data.get("type") == "Microsoft.Compute/virtualMachines":
                props = data.setdefault("properties", {})
                props.setdefault("diagnosticsProfile", {"bootDiagnostics": {"enabled": True}})
            return json.dumps(
                data, default=lambda o: o.decode("ascii") if isinstance(o, bytes) else o
            )

        conn.encode_data = encode_data
        conn._slurm_burst_fixed = True

    def launch_args(
        self, driver: Any, spec: LaunchSpec, p: Placement, size: NodeSize, tags: Mapping[str, str]
    ) -> dict[str, Any]:
        from libcloud.compute.base import NodeAuthSSHKey, NodeLocation

        azure_image = importlib.import_module("libcloud.compute.drivers.azure_arm").AzureImage
        parts = spec.image.split(":")
        if len(parts) != 4:
            raise ValueError(
                f"azure image {spec.image!r} must be a URN PUBLISHER:OFFER:SKU:VERSION"
            )
        publisher, offer, sku, version = parts
        kw: dict[str, Any] = {
            "name": spec.node,
            "size": size,
            "image": azure_image(version, sku, offer, publisher, p.zone, driver),
            "auth": NodeAuthSSHKey(spec.ssh_public_key),
            "ex_resource_group": p.resource_group,
            "location": NodeLocation(p.zone, p.zone, "", driver),
            "ex_user_name": p.ssh_user,
            "ex_network": p.network,
            "ex_subnet": p.subnet or "default",
            "ex_tags": dict(tags),
            # bytes: libcloud 3.9 base64-encodes it with b64encode (see prepare)
            "ex_customdata": spec.user_data.encode(),
            "ex_use_managed_disks": True,
        }
        if spec.disk_gb:
            kw["ex_disk_size"] = spec.disk_gb
        return kw


class BootDiagnostics:
    """The boot diagnostics serial log: ``retrieveBootDiagnosticsData`` gives a read-only
    (SAS) address of the log blob, kept per instance until it expires; the log is then
    read with a plain HTTPS GET. Boot diagnostics are enabled in the VM's own create
    request (:meth:`AzureArm.prepare`)."""

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

    def read(self, node: Node) -> list[tuple[str, str]]:
        uri = self._log_uri(node)
        if not uri:
            return []
        import requests  # libcloud's own HTTP library
        from libcloud.common.exceptions import BaseHTTPError

        resp = requests.get(uri, timeout=30)
        if resp.status_code in (403, 404):  # not written yet, or the address expired
            with self._lock:
                self._uris.pop(str(node.id), None)
            return []
        if resp.status_code != 200:
            raise BaseHTTPError(resp.status_code, f"BootDiagnostics: serial log: {resp.reason}", {})  # type: ignore[no-untyped-call]
        return parse_console_host_keys(resp.content.decode("utf-8", "replace"))


PROVIDER = AzureArm()
