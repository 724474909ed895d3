"""Azure's scale sets as slurm-burst launches and reads them (the ``azure_arm`` provider,
:mod:`slurm_burst.adapters.cloud.providers.azure_arm`).

**One Flexible scale set per cluster, group and size** (``{cluster}-{group}-{size}-{n}``:
a set holds at most 1,000 VMs, so a group that grows past that gets a second), made by
the first launch that needs it and deleted by the reconcile pass once it is empty. A
launch of N nodes is one ``PUT`` of the set with its capacity raised by N (the whole
profile each time, so a changed image or key reaches the next VMs; ARM's PUT is
idempotent: the same body twice makes nothing twice), then the operation
(``Azure-AsyncOperation``) waited for, then one listing of the set's VMs: the new ones
are those that were not there before (the set's lock keeps launches on one set in
turn). Azure names a scale-out's VMs itself (``{set}_{8 hex}``), so the pairing of VMs
to nodes is the launcher's, recorded before anything else is done with them. The set's
``slurm-burst-scaleout`` tag holds the launch's token and when it began: a repeat of the
launch (a crash, a throttled answer) finds it there, sends nothing, and takes the VMs
made since. A scale-out that fails part way (``AllocationFailed``) keeps what it made:
fewer than the launch's least are deleted, each by name (never a scale-in by count,
which picks VMs itself), and the error raised typed.

**One fleet view per set**: the resource group's VM listing filtered on the set, with
each VM's instance view (its power state) in the same call, in pages (``nextLink``),
and one listing of the resource group's network interfaces for the addresses; booting
nodes, host-key reads and the reconcile pass share it. No per-VM instance view, no
listing of the whole resource group's VMs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from slurm_burst.adapters.cloud.compute import LibcloudCloud
    from slurm_burst.core.cloud import CloudError, Instance, LaunchSpec

COMPUTE_API = "2024-03-01"
NETWORK_API = "2023-09-01"
SET_MOST = 1000  # VMs in a Flexible scale set
# the VMs' admin user (Azure refuses root): the daemon's key is its key, and the image
# lets root log in with it too (cloud-init's disable_root: false), as the bootstrap
# needs root (daemon.ssh_user); a profile's admin_user option names another
ADMIN_USER = "azureuser"
# names Azure refuses as an admin user ("Linux VM: the admin username", Azure docs)
RESERVED_USERS = frozenset(
    {
        "administrator",
        "admin",
        "user",
        "user1",
        "test",
        "user2",
        "test1",
        "user3",
        "admin1",
        "1",
        "123",
        "a",
        "actuser",
        "adm",
        "admin2",
        "aspnet",
        "backup",
        "console",
        "david",
        "guest",
        "john",
        "owner",
        "root",
        "server",
        "sql",
        "support",
        "support_388945a0",
        "sys",
        "test2",
        "test3",
        "user4",
        "user5",
    }
)
SCALEOUT_TAG = "slurm-burst-scaleout"  # "TOKEN START-EPOCH": the last launch on the set
OP_WAIT = 1800.0  # seconds a launch waits for its operation at most
PAGES = 20_000  # a loop over nextLink that cannot end is a bug
# a VM's power state (its instance view) and provisioning state -> ours
POWER = {
    "running": "running",
    "starting": "pending",
    "stopping": "stopping",
    "stopped": "stopped",
    "deallocating": "stopping",
    "deallocated": "stopped",
}


@dataclass
class SetBook:
    """What one profile's provider knows of its scale sets (in memory: the cloud is the
    record; a restart reads it again)."""

    locks: dict[str, threading.Lock] = field(default_factory=dict)
    # a launch in flight: set name -> (its token, the set's VMs before it)
    inflight: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)  # VM id (lower) -> private IP
    # VM name -> its serial log's blob in the site's storage account (instance views)
    logs: dict[str, str] = field(default_factory=dict)
    uniform: dict[str, str] = field(default_factory=dict)  # a Uniform set's VM -> its id
    ppgs: set[str] = field(default_factory=set)  # proximity placement groups made
    guard: threading.Lock = field(default_factory=threading.Lock)

    def lock(self, name: str) -> threading.Lock:
        with self.guard:
            return self.locks.setdefault(name, threading.Lock())


def book(cloud: LibcloudCloud) -> SetBook:
    return cloud.remembered("azure-sets", SetBook)  # type: ignore[no-any-return]


def arm_name(text: str, most: int) -> str:
    """A resource name from ``text``: letters, digits and '-', at most ``most``
    characters (a digest at the end where cut, so that two long names stay apart)."""
    clean = re.sub(r"[^A-Za-z0-9-]", "-", text).strip("-") or "sb"
    if len(clean) <= most:
        return clean
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{clean[: most - 9].rstrip('-')}-{digest}"


def set_base(cluster: str, group: str, size: str, spot: bool = False) -> str:
    """The name of a group's scale sets of ``size``, before their number (a Spot set's
    apart: a set's priority is fixed when it is made); the VM names Azure makes from it
    (``{set}_{8 hex}``) stay within 64 characters."""
    market = "-spot" if spot else ""
    return arm_name(f"{cluster}-{group}-{size.removeprefix('Standard_')}{market}", 50).lower()


def job_set(placement: str, spot: bool = False) -> str:
    """The scale set of a placed job (its InfiniBand fabric, or its proximity placement
    group): one for its on-demand launch, one for a Spot one."""
    return arm_name(f"{placement}{'-spot' if spot else ''}", 50).lower()


def ppg_name(placement: str) -> str:
    """The proximity placement group of a placed job."""
    return arm_name(placement, 80)


class Arm:
    """ARM requests through the driver's connection, for one profile."""

    def __init__(self, cloud: LibcloudCloud) -> None:
        self.cloud = cloud
        conn = cloud.driver.connection
        self.conn = conn
        self.subscription = str(getattr(cloud.driver, "subscription_id", "") or "")
        self.group = cloud.placement.resource_group
        self.rg = f"/subscriptions/{self.subscription}/resourceGroups/{self.group}"

    def compute(self, kind: str, name: str = "") -> str:
        path = f"{self.rg}/providers/Microsoft.Compute/{kind}"
        return f"{path}/{name}" if name else path

    def request(
        self,
        path: str,
        method: str = "GET",
        data: Any = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        return self.conn.request(
            path, method=method, data=data, params=dict(params or {"api-version": COMPUTE_API})
        )

    def pages(
        self, path: str, params: Mapping[str, str], before_page: Callable[[], None] = lambda: None
    ) -> list[dict[str, Any]]:
        """Every item of a listing, following ``nextLink`` (on this endpoint only: a link
        elsewhere is refused, never followed with our token)."""
        out: list[dict[str, Any]] = []
        where, query = path, dict(params)
        for _ in range(PAGES):
            before_page()
            doc = self.request(where, params=query).object or {}
            out += list(doc.get("value") or [])
            link = doc.get("nextLink")
            if not link:
                return out
            where, query = self.own_link(str(link))
        raise ValueError(f"{path}: more than {PAGES} pages")

    def own_link(self, url: str) -> tuple[str, dict[str, str]]:
        """A link an answer gave (``nextLink``, ``Azure-AsyncOperation``) as a path and
        query on our endpoint; ValueError for a link to any other host."""
        link = urlsplit(url)
        default = 443 if link.scheme == "https" else 80
        if (link.hostname, link.port or default) != (self.conn.host, int(self.conn.port)):
            raise ValueError(f"a link to another host ({link.hostname}) refused")
        return link.path, {
            unquote(k): unquote(v)
            for k, _, v in (p.partition("=") for p in link.query.split("&") if p)
        }

    def get(self, path: str) -> dict[str, Any] | None:
        """The resource at ``path``; None if there is none (404, or an empty answer)."""
        from libcloud.common.exceptions import BaseHTTPError

        try:
            found = self.request(path).object
        except BaseHTTPError as exc:
            if exc.code != 404:
                raise
            return None
        return dict(found) if found else None

    def wait(self, resp: Any, most: float = OP_WAIT) -> dict[str, Any]:
        """The long-running operation an answer started (its ``Azure-AsyncOperation``),
        waited for (``most`` seconds at most): its last document (``status`` Succeeded,
        Failed or Canceled; InProgress still after ``most``)."""
        headers = {k.lower(): v for k, v in (getattr(resp, "headers", None) or {}).items()}
        url = headers.get("azure-asyncoperation")
        if not url:
            return {"status": "Succeeded"}
        where, params = self.own_link(url)
        return self.poll(lambda: dict(self.request(where, params=params).object or {}),
                         lambda op: op.get("status") not in ("InProgress", None),
                         most)  # fmt: skip

    @staticmethod
    def poll(
        read: Callable[[], dict[str, Any]],
        done: Callable[[dict[str, Any]], bool],
        most: float = OP_WAIT,
    ) -> dict[str, Any]:
        """``read()`` again, 0.2 s apart and backing off to 5 s, until ``done`` says so or
        ``most`` seconds have passed; the last document read."""
        pause, deadline = 0.2, time.monotonic() + most
        while True:
            doc = read()
            if done(doc) or time.monotonic() > deadline:
                return doc
            time.sleep(min(pause, max(0.05, deadline - time.monotonic())))
            pause = min(pause * 1.5, 5.0)


def launch_wait(spec: LaunchSpec) -> float:
    """How long a launch waits for its scale-out's operation: a Spot one its group's
    ``spot_fallback_after`` (capacity that has not come by then is given up), any other
    :data:`OP_WAIT`."""
    return spec.spot_wait if spec.spot and spec.spot_wait > 0 else OP_WAIT


def spot_waited(cloud: LibcloudCloud, spec: LaunchSpec) -> CloudError:
    """A Spot launch given up: its capacity did not come within ``spec.spot_wait``."""
    from slurm_burst.core.cloud import SPOT_WAIT_CODE, CapacityError

    return CapacityError(f"{cloud.name}: Spot capacity for {spec.size} did not come within "
                         f"{spec.spot_wait:g} s", SPOT_WAIT_CODE)  # fmt: skip


def scaleout_mark(doc: Mapping[str, Any] | None) -> tuple[str, float | None]:
    """A scale set's ``slurm-burst-scaleout`` tag: the last launch's token and when it
    began (None where the tag says no time: edited by hand, or none)."""
    mark = str(((doc or {}).get("tags") or {}).get(SCALEOUT_TAG, "")).split(" ")
    try:
        return mark[0], float(mark[1])
    except (IndexError, ValueError):
        return mark[0], None


def op_error(cloud: LibcloudCloud, op: Mapping[str, Any]) -> CloudError:
    """A failed operation's error, typed as its code says (``AllocationFailed``...)."""
    err = op.get("error") or {}
    return cloud.error_of(
        Exception(f"{err.get('code', 'OperationFailed')}: {err.get('message', op.get('status'))}")
    )


def note_logs(cloud: LibcloudCloud, vms: list[dict[str, Any]]) -> None:
    """Note each VM's serial log blob where its instance view names one (the site's
    storage account), for its host-key read."""
    logs = book(cloud).logs
    for vm in vms:
        view = (vm.get("properties") or {}).get("instanceView") or {}
        uri = str((view.get("bootDiagnostics") or {}).get("serialConsoleLogBlobUri") or "")
        if uri:
            logs[str(vm["name"])] = uri


def profile_body(
    cloud: LibcloudCloud,
    spec: LaunchSpec,
    capacity: int,
    tags: Mapping[str, str],
    mode: str = "Flexible",
    ppg: str = "",
) -> dict[str, Any]:
    """A scale set's whole ``PUT`` body: its size and capacity, its tags, and the model
    its VMs are made from (image, the daemon's key, the user data, the subnet, boot
    diagnostics for the host keys; NIC and OS disk deleted with the VM). ``mode``
    Uniform: one placement group (InfiniBand), no overprovisioning, manual upgrades.
    A Spot launch's VMs: ``priority`` Spot, deleted when evicted (as a released node's
    would be), paying up to the on-demand price (``maxPrice`` -1) or the group's cap.
    ``ppg``: the proximity placement group (its id) the set's VMs go in."""
    p = cloud.placement
    sub = str(getattr(cloud.driver, "subscription_id", "") or "")
    subnet = (
        p.network
        if p.network.startswith("/subscriptions/")
        else (
            f"/subscriptions/{sub}/resourceGroups/{p.resource_group}/providers/Microsoft.Network/"
            f"virtualNetworks/{p.network}/subnets/{p.subnet or 'default'}"
        )
    )
    user = str(getattr(cloud.driver, "admin_user", "") or ADMIN_USER)
    diagnostics: dict[str, Any] = {"enabled": True}  # managed, or the site's account
    storage = str(getattr(cloud.driver, "boot_diagnostics_storage", "") or "")
    if storage:
        diagnostics["storageUri"] = storage
    os_disk: dict[str, Any] = {
        "createOption": "FromImage",
        "caching": "ReadWrite",
        "managedDisk": {"storageAccountType": "Premium_LRS"},
        "deleteOption": "Delete",
    }
    if spec.disk_gb:
        os_disk["diskSizeGB"] = spec.disk_gb
    props: dict[str, Any] = {
        "orchestrationMode": "Flexible",
        "platformFaultDomainCount": 1,
        "virtualMachineProfile": {
            "osProfile": {
                "computerNamePrefix": arm_name(spec.group, 9).lower(),
                "adminUsername": user,
                "customData": base64.b64encode(spec.user_data.encode()).decode(),
                "linuxConfiguration": {
                    "disablePasswordAuthentication": True,
                    "ssh": {
                        "publicKeys": [
                            {
                                "path": f"/home/{user}/.ssh/authorized_keys",
                                "keyData": spec.ssh_public_key.strip(),
                            }
                        ]
                    },
                },
            },
            "storageProfile": {"imageReference": image_reference(spec.image), "osDisk": os_disk},
            "networkProfile": {
                "networkApiVersion": "2020-11-01",
                "networkInterfaceConfigurations": [
                    {
                        "name": "nic",
                        "properties": {
                            "primary": True,
                            "deleteOption": "Delete",
                            "ipConfigurations": [
                                {
                                    "name": "ipconfig",
                                    "properties": {"primary": True, "subnet": {"id": subnet}},
                                }
                            ],
                        },
                    }
                ],
            },
            "diagnosticsProfile": {"bootDiagnostics": diagnostics},
        },
    }
    if spec.spot:
        profile = props["virtualMachineProfile"]
        profile.update(priority="Spot", evictionPolicy="Delete",
                       billingProfile={"maxPrice": spec.spot_max_price or -1})  # fmt: skip
    if ppg:
        props["proximityPlacementGroup"] = {"id": ppg}
    if mode == "Uniform":  # a Uniform set's NICs are its own: no network API version
        del props["platformFaultDomainCount"]
        del props["virtualMachineProfile"]["networkProfile"]["networkApiVersion"]
        nic = props["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"]
        del nic[0]["properties"]["deleteOption"]  # (Flexible only, as the OS disk's)
        del props["virtualMachineProfile"]["storageProfile"]["osDisk"]["deleteOption"]
        props.update(orchestrationMode="Uniform", singlePlacementGroup=True,
                     overprovision=False, upgradePolicy={"mode": "Manual"})  # fmt: skip
    body: dict[str, Any] = {
        "location": p.region,
        "tags": dict(tags),
        "sku": {"name": spec.size, "tier": "Standard", "capacity": capacity},
        "properties": props,
    }
    if p.zone in ("1", "2", "3"):
        body["zones"] = [p.zone]
    return body


def image_reference(image: str) -> dict[str, str]:
    """A URN ``PUBLISHER:OFFER:SKU:VERSION``, or an image's resource id."""
    if image.startswith("/subscriptions/"):
        return {"id": image}
    parts = image.split(":")
    if len(parts) != 4 or not all(parts):
        raise ValueError(f"azure image {image!r} must be a URN PUBLISHER:OFFER:SKU:VERSION")
    return dict(zip(("publisher", "offer", "sku", "version"), parts, strict=True))


def instance_of(
    provider: str, vm: Mapping[str, Any], addresses: Mapping[str, str], tags: Mapping[str, str]
) -> Instance:
    """Our :class:`Instance` of a VM of a set: its id is its name (a Flexible set's VM
    names are unique in the resource group, and its instance id is its name), its state
    from the instance view's power state while provisioning succeeded."""
    from slurm_burst.core.cloud import Instance

    props = vm.get("properties") or {}
    prov = str(props.get("provisioningState", ""))
    statuses = (props.get("instanceView") or {}).get("statuses") or []
    power = next(
        (
            str(s.get("code", ""))[11:]
            for s in statuses
            if str(s.get("code", "")).startswith("PowerState/")
        ),
        "",
    )
    if prov == "Deleting":
        state = "shutting-down"
    elif prov == "Failed":
        state = "error"
    elif prov in ("Creating", "Updating") or not power:
        state = "pending"
    else:
        state = POWER.get(power, "unknown")
    ip = addresses.get(str(vm.get("id", "")).lower(), "")
    return Instance(
        id=str(vm["name"]),
        name=str(vm["name"]),
        state=state,
        provider=provider,
        size=str((props.get("hardwareProfile") or {}).get("vmSize", "")),
        private_ips=(ip,) if ip else (),
        tags=dict(tags),
    )


def created(vm: Mapping[str, Any]) -> float:
    """When Azure made the VM (``timeCreated``), as a Unix time; 0 if it does not say."""
    text = str((vm.get("properties") or {}).get("timeCreated", ""))
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def digest(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def nic_addresses(nics: list[dict[str, Any]]) -> dict[str, str]:
    """Network interfaces as VM id (lower case) -> its private IP (the primary NIC's)."""
    found: dict[str, str] = {}
    for nic in nics:
        props = nic.get("properties") or {}
        vm = str((props.get("virtualMachine") or {}).get("id", "")).lower()
        ips = [str((c.get("properties") or {}).get("privateIPAddress", ""))
               for c in props.get("ipConfigurations") or []]  # fmt: skip
        if vm and ips and ips[0] and (props.get("primary", True) or vm not in found):
            found[vm] = ips[0]
    return found
