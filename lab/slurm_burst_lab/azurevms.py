"""The resources behind the Azure emulator (:mod:`slurm_burst_lab.azureemu`): scale sets,
virtual machines, network interfaces, OS disks and long-running operations in one
subscription, as ARM routes and answers them.

Flexible scale sets make plain virtual machines (``{set}_{8 hex}``, each with a NIC and
an OS disk of its own, deleted with it where the set's profile says ``deleteOption:
Delete``), listed and deleted as any VM; Uniform ones make set instances
(``{set}_{instance id}``), listed and deleted through the set. A scale-out is a new
``sku.capacity``: the VMs are made at once (``Creating``), the operation succeeds
``op_delay`` s later; where the size's room runs out it fails ``AllocationFailed`` (or
the code a test gave) with the VMs that fitted kept, as Azure leaves them.

Spot (a profile's ``priority: Spot``): capacity a test refuses (the scale-out's operation
fails with the code it gave, no VM made) or withholds (the VMs are made and stay
``Creating``, never allocated: no power state, no boot, the operation in progress
until they are deleted); an eviction is a ``Preempt`` Scheduled Event served inside the
VM (:mod:`slurm_burst_lab.azureimds`) and the VM deleted when it starts (at its
``NotBefore`` or once acknowledged). Proximity placement groups: made, read and deleted
(refused while a scale set names one), a set's zones checked against its group's.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import math
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from slurm_burst_lab.azureimds import AzureImds

COMPUTE_API = "2024-03-01"
LOCATIONS = {
    "eastus": ("1", "2", "3"),
    "westeurope": ("1", "2", "3"),
    "southcentralus": ("1", "2", "3"),
}
# size -> (vCPUs, memory MiB, GPUs); the "r" sizes have InfiniBand (RDMA)
SIZES = {
    "Standard_D2s_v5": (2, 8192, 0),
    "Standard_D4s_v5": (4, 16384, 0),
    "Standard_D8s_v5": (8, 32768, 0),
    "Standard_F2s_v2": (2, 4096, 0),
    "Standard_NC4as_T4_v3": (4, 28672, 1),
    "Standard_NC24ads_A100_v4": (24, 225280, 1),
    "Standard_ND96asr_v4": (96, 921600, 8),
    "Standard_HB120rs_v3": (120, 458752, 0),
}
FLEXIBLE_MOST = 1000  # VMs in a Flexible set
UNIFORM_MOST = 1000  # VMs in a Uniform set; 100 with singlePlacementGroup = true
SINGLE_GROUP_MOST = 100
# admin user names Azure refuses (its documented list, the common ones)
RESERVED_USERS = frozenset(
    {
        "root",
        "admin",
        "administrator",
        "user",
        "guest",
        "test",
        "sys",
        "adm",
        "backup",
        "console",
        "owner",
        "server",
        "sql",
        "support",
    }
)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
SPOT_MODES = ("", "refuse", "withhold")
FILTER = re.compile(r"""^\s*'?virtualMachineScaleSet/id'?\s+eq\s+'([^']+)'\s*$""", re.I)


class ArmError(Exception):
    """An ARM error answer: ``{"error": {"code", "message"}}`` with an HTTP status."""

    def __init__(
        self, http: int, code: str, message: str, headers: list[tuple[str, str]] | None = None
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.http, self.code, self.message = http, code, message
        self.headers = headers or []

    def document(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


def _iso(at: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if at is None else at, UTC).isoformat()


def _bad(message: str) -> ArmError:
    return ArmError(400, "InvalidParameter", message)


class Arm:
    """One subscription's compute and network resources."""

    def __init__(
        self,
        subscription: str,
        boot_delay: float = 0.0,
        op_delay: float = 0.0,
        keys_after: float | None = None,
        page: int = 100,
    ) -> None:
        self.subscription = subscription
        self.boot_delay = boot_delay  # seconds a VM is "starting" before "running"
        self.op_delay = op_delay  # seconds an operation takes
        self.keys_after = keys_after  # scale mode: the serial log's host key, after running
        self.page = page
        self.sets: dict[tuple[str, str], dict[str, Any]] = {}  # (group, name lower)
        self.vms: dict[tuple[str, str], dict[str, Any]] = {}
        self.nics: dict[tuple[str, str], dict[str, Any]] = {}
        self.disks: dict[tuple[str, str], str] = {}  # OS disks -> their VM's name
        self.ops: dict[str, dict[str, Any]] = {}
        self.room: dict[str, tuple[int, str]] = {}  # size -> (VMs left, the refusal's code)
        self.serial: dict[str, str] = {}  # vmId -> what a test published as its serial log
        self._sigs: dict[str, str] = {}  # vmId -> its serial log address's signature
        self._lock = threading.RLock()
        self._addresses = 0
        self._going: dict[tuple[str, str], float] = {}  # VMs being deleted -> when gone
        self.vmhost: Any = None  # LabVms: VMs boot (the lab)
        self.vm_range: ipaddress.IPv4Network | None = None
        self.spot = ""  # Spot capacity: '' normal, refuse, withhold
        self.spot_code = "AllocationFailed"  # a refusal's code
        self.withheld: set[str] = set()  # Spot VMs whose capacity never came (names)
        self.evicted: list[str] = []  # VMs a Preempt event deleted (names)
        self.ppgs: dict[tuple[str, str], dict[str, Any]] = {}  # proximity placement groups
        self.imds = AzureImds(on_start=self._event_started)  # each booted VM's metadata

    def boot_on(self, vms: Any, vm_range: ipaddress.IPv4Network) -> None:
        self.vmhost, self.vm_range = vms, vm_range

    def limit(self, size: str, room: int, code: str = "AllocationFailed") -> None:
        """At most ``room`` more VMs of ``size``: a scale-out past it makes what fits and
        fails ``code``; ``OperationNotAllowed`` (a quota) refuses the request at once."""
        with self._lock:
            self.room[size] = (room, code)

    def set_spot(self, mode: str, code: str = "AllocationFailed") -> None:
        """Spot capacity from now on: normal (''), ``refuse`` (with ``code``) or
        ``withhold``."""
        if mode not in SPOT_MODES:
            known = ", ".join(map(repr, SPOT_MODES))
            raise ArmError(400, "InvalidParameter", f"spot mode {mode!r}: one of {known}")
        with self._lock:
            self.spot, self.spot_code = mode, code or "AllocationFailed"

    def market(self) -> dict[str, Any]:
        """For a test: the Spot mode, the VMs withheld and evicted, the live VMs, each
        proximity placement group with its sets and their VMs, the acknowledged events."""
        with self._lock:
            ppgs = {}
            for p in self.ppgs.values():
                members = self._ppg_sets(p)
                ids = {s["id"] for s in members}
                ppgs[p["name"]] = {
                    "zones": p.get("zones", []),
                    "sets": sorted(s["name"] for s in members),
                    "vms": sorted(v["name"] for v in self.vms.values() if v["_set"] in ids),
                }
            names = {v["properties"]["vmId"]: v["name"] for v in self.vms.values()}
            return {
                "spot": self.spot,
                "withheld": sorted(self.withheld),
                "evicted": list(self.evicted),
                "live": sorted(v["name"] for v in self.vms.values()),
                "ppgs": ppgs,
                "acked": {names.get(k, k): v for k, v in self.imds.acked.items()},
            }

    def schedule_event(self, name: str, kind: str, seconds: float) -> dict[str, Any]:
        """Schedule a Scheduled Event of ``kind`` on VM ``name`` (booted), in ``seconds``."""
        with self._lock:
            vm = next((v for v in self.vms.values() if v["name"].lower() == name.lower()), None)
            if vm is None:
                raise ArmError(404, "NotFound", f"no VM {name!r}")
            vm_id = vm["properties"]["vmId"]
        try:
            return self.imds.schedule(vm_id, kind, seconds)
        except ValueError as exc:
            raise ArmError(400, "InvalidParameter", str(exc)) from None

    def _event_started(self, vm_id: str, event: Mapping[str, Any]) -> None:
        """A started Preempt deletes its VM (``evictionPolicy = Delete``)."""
        if event.get("EventType") != "Preempt":
            return
        with self._lock:
            key = next((k for k, v in self.vms.items() if v["properties"]["vmId"] == vm_id), None)
            if key is not None:
                self.evicted.append(self.vms[key]["name"])
                self._remove_vm(key)

    def summary(self) -> list[dict[str, Any]]:
        with self._lock:
            self._sweep()
            return [
                {
                    "name": v["name"],
                    "set": v["_set"],
                    "vmId": v["properties"]["vmId"],
                    "state": v["properties"]["provisioningState"],
                    "ip": v["_ip"],
                }
                for v in self.vms.values()
            ]

    def serial_log(self, vm_id: str, sig: str) -> str | None:
        """A VM's serial log by the address ``retrieveBootDiagnosticsData`` gave (None:
        nothing written yet, or not that address's signature)."""
        with self._lock:
            want = self._sigs.get(vm_id)
        if want is None or not secrets.compare_digest(want, sig):
            return None
        return self.console_of(vm_id)

    def console_of(self, vm_id: str) -> str | None:
        """What the VM's serial log holds so far (None: nothing, or no such VM)."""
        with self._lock:
            vm = next((v for v in self.vms.values() if v["properties"]["vmId"] == vm_id), None)
        if vm is None:
            return None
        text = self.serial.get(vm_id, "")
        if not text and self.vmhost is not None:
            text = self.vmhost.console(vm_id) or ""
        if not text and self.keys_after is not None:
            running = vm["_made"] + self.boot_delay + self.keys_after
            if time.time() >= running:
                text = (
                    "-----BEGIN SSH HOST KEY KEYS-----\n"
                    f"ssh-ed25519 {scale_key(vm_id)} root@{vm['name']}\n"
                    "-----END SSH HOST KEY KEYS-----\n"
                )
        return text or None

    # -- routing ------------------------------------------------------------------------
    def route(
        self,
        method: str,
        path: str,
        q: Mapping[str, str],
        body: Any,
        base: str,
        count: Callable[[str], None],
    ) -> tuple[int, Any, list[tuple[str, str]]]:
        parts = [p for p in path.split("/") if p]
        low = [p.lower() for p in parts]
        if len(parts) < 2 or low[0] != "subscriptions" or parts[1] != self.subscription:
            raise ArmError(
                404,
                "SubscriptionNotFound",
                f"The subscription '{parts[1] if len(parts) > 1 else ''}' could not be found.",
            )
        if "api-version" not in q:
            raise ArmError(
                400,
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required for all requests.",
            )
        with self._lock:
            self._sweep()
            return self._route(method, parts, low, q, body, base, count)

    def _route(
        self,
        method: str,
        parts: list[str],
        low: list[str],
        q: Mapping[str, str],
        body: Any,
        base: str,
        count: Callable[[str], None],
    ) -> tuple[int, Any, list[tuple[str, str]]]:
        match low[2:]:
            case ["providers", "microsoft.compute", "locations", _, "operations", op]:
                count("operations.get")
                return 200, self._operation(parts[-1] if op else ""), []
            case [
                "resourcegroups",
                _,
                "providers",
                "microsoft.compute",
                "virtualmachinescalesets",
            ] if method == "GET":
                count("vmss.list")
                return (
                    200,
                    {"value": [self._set_doc(s) for (g, _), s in self.sets.items() if g == low[3]]},
                    [],
                )
            case [
                "resourcegroups",
                _,
                "providers",
                "microsoft.compute",
                "virtualmachinescalesets",
                _,
            ]:
                return self._set_call(method, low[3], parts[3], parts[7], q, body, base, count)
            case [
                "resourcegroups",
                _,
                "providers",
                "microsoft.compute",
                "virtualmachinescalesets",
                _,
                "virtualmachines",
            ] if method == "GET":
                count("vmssvm.list")
                s = self._set(low[3], parts[7])
                rows = [v for v in self.vms.values() if v["_set"] == s["id"]]
                return (
                    200,
                    self._paged(
                        rows, q, base, "/".join(["", *parts]), q.get("$expand") == "instanceView"
                    ),
                    [],
                )
            case [
                "resourcegroups",
                _,
                "providers",
                "microsoft.compute",
                "virtualmachinescalesets",
                _,
                "networkinterfaces",
            ] if method == "GET":
                count("vmssnic.list")
                s = self._set(low[3], parts[7])
                rows = [n for n in self.nics.values() if n.get("_set") == s["id"]]
                return 200, self._paged(rows, q, base, "/".join(["", *parts])), []
            case [
                "resourcegroups",
                _,
                "providers",
                "microsoft.compute",
                "virtualmachinescalesets",
                _,
                "virtualmachines",
                iid,
            ]:
                vm = self._set_vm(low[3], parts[7], iid)
                if method == "GET":
                    count("vmssvm.get")
                    return 200, self._vm_doc(vm, q.get("$expand") == "instanceView"), []
                if method == "DELETE":
                    count("vmssvm.delete")
                    return self._delete_vm(low[3], vm["name"], base)
            case [
                "resourcegroups",
                _,
                "providers",
                "microsoft.compute",
                "virtualmachinescalesets",
                _,
                "virtualmachines",
                iid,
                "retrievebootdiagnosticsdata",
            ] if method == "POST":
                count("vmssvm.retrieveBootDiagnosticsData")
                vm = self._set_vm(low[3], parts[7], iid)
                return 200, self._boot_diagnostics(low[3], vm["name"], q, base, any_mode=True), []
            case [
                "resourcegroups",
                _,
                "providers",
                "microsoft.compute",
                "virtualmachinescalesets",
                _,
                "delete",
            ] if method == "POST":
                count("vmss.deleteInstances")
                return self._delete_instances(low[3], parts[7], body, base)
            case ["resourcegroups", _, "providers", "microsoft.compute", "virtualmachines"] if (
                method == "GET"
            ):
                count("vm.list")
                return 200, self._list_vms(low[3], q, base, "/".join(["", *parts])), []
            case ["resourcegroups", _, "providers", "microsoft.compute", "virtualmachines", _]:
                if method == "GET":
                    count("vm.get")
                    return (
                        200,
                        self._vm_doc(
                            self._vm(low[3], parts[7]), q.get("$expand") == "instanceView"
                        ),
                        [],
                    )
                if method == "DELETE":
                    count("vm.delete")
                    return self._delete_vm(low[3], parts[7], base)
                if method == "PATCH":
                    count("vm.patch")
                    vm = self._vm(low[3], parts[7])
                    if not isinstance(body, dict) or set(body) - {"tags"}:
                        raise _bad("the emulator's VM PATCH takes tags only")
                    vm["tags"] = {str(k): str(v) for k, v in (body.get("tags") or {}).items()}
                    return 200, self._vm_doc(vm, False), []
            case [
                "resourcegroups",
                _,
                "providers",
                "microsoft.compute",
                "virtualmachines",
                _,
                "retrievebootdiagnosticsdata",
            ] if method == "POST":
                count("vm.retrieveBootDiagnosticsData")
                return 200, self._boot_diagnostics(low[3], parts[7], q, base), []
            case [
                "resourcegroups",
                _,
                "providers",
                "microsoft.compute",
                "proximityplacementgroups",
                _,
            ]:
                return self._ppg_call(method, low[3], parts[3], parts[7], body, count)
            case ["resourcegroups", _, "providers", "microsoft.network", "networkinterfaces"] if (
                method == "GET"
            ):
                count("nic.list")  # a Uniform set's NICs are the set's, not listed here
                rows = [n for (g, _), n in self.nics.items() if g == low[3] and "_set" not in n]
                return 200, self._paged(rows, q, base, "/".join(["", *parts])), []
            case [
                "resourcegroups",
                _,
                "providers",
                "microsoft.network",
                "networkinterfaces",
                name,
            ] if method == "GET":
                count("nic.get")
                nic = self.nics.get((low[3], name))
                if nic is None or "_set" in nic:
                    raise ArmError(
                        404, "ResourceNotFound", f"NetworkInterface '{parts[7]}' was not found."
                    )
                return 200, _public(nic), []
        raise ArmError(
            404,
            "InvalidResourceType",
            f"The resource type or method is not served: {method} /{'/'.join(parts[2:])}",
        )

    # -- proximity placement groups -----------------------------------------------------
    def _ppg_call(
        self,
        method: str,
        group: str,
        group_name: str,
        name: str,
        body: Any,
        count: Callable[[str], None],
    ) -> tuple[int, Any, list[tuple[str, str]]]:
        key = (group, name.lower())
        if method == "PUT":
            count("ppg.put")
            if not isinstance(body, dict) or not NAME.fullmatch(name):
                raise _bad("a proximity placement group needs a name and a JSON body")
            loc = str(body.get("location", "")).lower()
            zones = list(body.get("zones") or [])
            if loc not in LOCATIONS or any(z not in LOCATIONS[loc] for z in zones):
                raise _bad(f"location '{loc}' or zones {zones} are not valid")
            if len(zones) > 1:
                raise _bad("a proximity placement group is in one zone or none")
            kind = (body.get("properties") or {}).get("proximityPlacementGroupType", "Standard")
            if kind not in ("Standard", "Ultra"):
                raise _bad(f"proximityPlacementGroupType '{kind}' is not valid")
            old = self.ppgs.get(key)
            if old is not None and old.get("zones", []) != zones:
                raise ArmError(409, "PropertyChangeNotAllowed",
                               "Changing property 'zones' is not allowed.")  # fmt: skip
            doc = {
                "name": name,
                "id": f"/subscriptions/{self.subscription}/resourceGroups/{group_name}/providers/"
                f"Microsoft.Compute/proximityPlacementGroups/{name}",
                "type": "Microsoft.Compute/proximityPlacementGroups",
                "location": loc,
                "tags": {str(k): str(v) for k, v in (body.get("tags") or {}).items()},
                "properties": {"proximityPlacementGroupType": kind},
            }
            if zones:
                doc["zones"] = zones
            self.ppgs[key] = doc
            return (200 if old else 201), self._ppg_doc(doc), []
        p = self.ppgs.get(key)
        if method == "DELETE":
            count("ppg.delete")
            if p is None:
                return 204, None, []
            users = [x["name"] for x in self._ppg_sets(p)]
            if users:
                raise ArmError(
                    409,
                    "OperationNotAllowed",
                    f"Proximity placement group '{name}' cannot be deleted: scale set(s) "
                    f"{', '.join(users)} are in it.",
                )
            del self.ppgs[key]
            return 200, None, []
        if method == "GET":
            count("ppg.get")
            if p is None:
                raise ArmError(404, "ResourceNotFound", f"The Resource 'Microsoft.Compute/"
                               f"proximityPlacementGroups/{name}' was not found.")  # fmt: skip
            return 200, self._ppg_doc(p), []
        raise ArmError(405, "MethodNotAllowed", f"{method} on a proximity placement group")

    def _ppg_sets(self, p: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The scale sets in proximity placement group ``p``."""
        return [x for x in self.sets.values() if x.get("_ppg") == p["id"].lower()]

    def _ppg_doc(self, p: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(p)
        sets = [{"id": x["id"]} for x in self._ppg_sets(p)]
        out["properties"] = {**p["properties"], "virtualMachineScaleSets": sets}
        return out

    def _placed(self, s: dict[str, Any], props: Mapping[str, Any]) -> None:
        """A set's proximity placement group: one that exists, in the set's zone (or
        none), fixed once the set has VMs."""
        ref = props.get("proximityPlacementGroup")
        if ref is None:
            return
        pid = str((ref or {}).get("id", "")).lower()
        p = next((x for x in self.ppgs.values() if x["id"].lower() == pid), None)
        if p is None:
            raise ArmError(404, "NotFound", f"Proximity placement group '{pid}' was not found.")
        if p.get("zones") and list(s.get("zones") or []) != p["zones"]:
            raise _bad(f"the scale set's zones {s.get('zones') or []} differ from its "
                       f"proximity placement group's {p['zones']}")  # fmt: skip
        if s.get("_ppg", pid) != pid and any(v["_set"] == s["id"] for v in self.vms.values()):
            raise ArmError(
                409,
                "PropertyChangeNotAllowed",
                "Changing property 'proximityPlacementGroup' is not allowed while the set has VMs.",
            )
        s["_ppg"] = pid
        s["properties"]["proximityPlacementGroup"] = {"id": p["id"]}

    # -- scale sets ---------------------------------------------------------------------
    def _set(self, group: str, name: str) -> dict[str, Any]:
        s = self.sets.get((group, name.lower()))
        if s is None:
            raise ArmError(
                404,
                "ResourceNotFound",
                f"The Resource 'Microsoft.Compute/virtualMachineScaleSets/{name}' "
                f"under resource group '{group}' was not found.",
            )
        return s

    def _set_call(
        self,
        method: str,
        group: str,
        group_name: str,
        name: str,
        q: Mapping[str, str],
        body: Any,
        base: str,
        count: Callable[[str], None],
    ) -> tuple[int, Any, list[tuple[str, str]]]:
        if method == "GET":
            count("vmss.get")
            return 200, self._set_doc(self._set(group, name)), []
        if method == "DELETE":
            count("vmss.delete")
            s = self._set(group, name)
            for key, vm in list(self.vms.items()):
                if vm["_set"] == s["id"]:
                    self._remove_vm(key)
            del self.sets[(group, name.lower())]
            op = self._new_op(s["location"], base)
            return 202, None, op
        if method not in ("PUT", "PATCH"):
            raise ArmError(405, "MethodNotAllowed", f"{method} on a scale set")
        count("vmss.put" if method == "PUT" else "vmss.patch")
        if not isinstance(body, dict):
            raise _bad("the request body must be a JSON object")
        old = self.sets.get((group, name.lower()))
        if old is None and method == "PATCH":
            self._set(group, name)  # 404
        if old is None:
            s = self._new_set(group, group_name, name, body)
        else:
            s = self._update_set(old, body)
        want = int((s["sku"] or {}).get("capacity", 0))
        have = [v for v in self.vms.values() if v["_set"] == s["id"]]
        op = self._new_op(s["location"], base)
        op_id = op[0][1].rsplit("/", 1)[-1].split("?")[0]
        if want > len(have):
            self._scale_out(s, want - len(have), op_id)
        elif want < len(have):  # a scale-in picks VMs itself (the newest, here)
            for vm in sorted(have, key=lambda v: v["_made"])[want:]:
                self._remove_vm((vm["_group"], vm["name"].lower()))
        s["properties"]["provisioningState"] = "Creating" if old is None else "Updating"
        self.ops[op_id]["_resource"] = s
        return (201 if old is None else 200), self._set_doc(s), op

    def _new_set(
        self, group: str, group_name: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        if not NAME.fullmatch(name) or len(name) > 64:
            raise _bad(f"scale set name '{name}' is not valid")
        loc = str(body.get("location", "")).lower()
        if loc not in LOCATIONS:
            raise ArmError(
                400,
                "LocationNotAvailableForResourceType",
                f"The provided location '{loc}' is not available.",
            )
        props = body.get("properties") or {}
        mode = props.get("orchestrationMode", "Uniform")
        if mode not in ("Flexible", "Uniform"):
            raise _bad(f"orchestrationMode '{mode}' is not valid")
        zones = list(body.get("zones") or [])
        if any(z not in LOCATIONS[loc] for z in zones):
            raise _bad(f"zones {zones} are not in location '{loc}'")
        if mode == "Flexible":
            fd = props.get("platformFaultDomainCount")
            if fd is None or not 1 <= int(fd) <= (1 if zones else 3):
                raise _bad(
                    "platformFaultDomainCount must be 1-3 for a regional Flexible "
                    "scale set, 1 for a zonal one"
                )
        sid = (
            f"/subscriptions/{self.subscription}/resourceGroups/{group_name}/providers/"
            f"Microsoft.Compute/virtualMachineScaleSets/{name}"
        )
        s: dict[str, Any] = {
            "name": name,
            "id": sid,
            "type": "Microsoft.Compute/virtualMachineScaleSets",
            "location": loc,
            "tags": dict(body.get("tags") or {}),
            "zones": zones,
            "sku": {},
            "properties": {
                "orchestrationMode": mode,
                "uniqueId": str(uuid.uuid4()),
                "timeCreated": _iso(),
            },
            "_group": group,
        }
        if mode == "Uniform":
            s["properties"]["singlePlacementGroup"] = bool(props.get("singlePlacementGroup", True))
            s["_next"] = 0
        s["properties"]["platformFaultDomainCount"] = int(props.get("platformFaultDomainCount", 1))
        self._apply(s, body)
        self.sets[(group, name.lower())] = s
        return s

    def _update_set(self, s: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        props = body.get("properties") or {}
        mode = props.get("orchestrationMode")
        if mode is not None and mode != s["properties"]["orchestrationMode"]:
            raise ArmError(
                409,
                "PropertyChangeNotAllowed",
                "Changing property 'orchestrationMode' is not allowed.",
            )
        self._apply(s, body)
        return s

    def _apply(self, s: dict[str, Any], body: dict[str, Any]) -> None:
        """A PUT's or PATCH's sku, tags and profile, checked."""
        sku = body.get("sku")
        if sku is not None:
            size = sku.get("name", s["sku"].get("name"))
            if size not in SIZES:
                raise ArmError(
                    400,
                    "InvalidParameter" if size else "MissingParameter",
                    f"The value '{size}' of parameter 'sku.name' is not allowed.",
                )
            cap = sku.get("capacity", s["sku"].get("capacity", 0))
            if not isinstance(cap, int) or cap < 0:
                raise _bad(f"sku.capacity {cap!r} must be a whole number from 0")
            most = (
                FLEXIBLE_MOST
                if s["properties"]["orchestrationMode"] == "Flexible"
                else (
                    SINGLE_GROUP_MOST
                    if s["properties"].get("singlePlacementGroup")
                    else UNIFORM_MOST
                )
            )
            if cap > most:
                raise _bad(f"sku.capacity {cap} is more than this scale set's {most} VMs")
            s["sku"] = {"name": size, "tier": "Standard", "capacity": cap}
        if "tags" in body:
            s["tags"] = {str(k): str(v) for k, v in (body["tags"] or {}).items()}
        self._placed(s, body.get("properties") or {})
        profile = (body.get("properties") or {}).get("virtualMachineProfile")
        if profile is not None:
            self._check_profile(s, profile)
            s["properties"]["virtualMachineProfile"] = profile
        if s["sku"].get("capacity") and "virtualMachineProfile" not in s["properties"]:
            raise _bad("a scale set with VMs needs properties.virtualMachineProfile")

    def _check_profile(self, s: dict[str, Any], profile: Mapping[str, Any]) -> None:
        os_profile = profile.get("osProfile") or {}
        prefix = str(os_profile.get("computerNamePrefix", ""))
        if not 1 <= len(prefix) <= 15:
            raise _bad("osProfile.computerNamePrefix must be 1 to 15 characters")
        if os_profile.get("customData"):
            base64.b64decode(os_profile["customData"], validate=True)
        user = str(os_profile.get("adminUsername", ""))
        if not user or user.lower() in RESERVED_USERS:
            raise _bad(f"The Admin Username specified is not allowed: '{user}'.")
        ssh = (os_profile.get("linuxConfiguration") or {}).get("ssh") or {}
        if not ssh.get("publicKeys") and not os_profile.get("adminPassword"):
            raise _bad("a Linux profile needs linuxConfiguration.ssh.publicKeys")
        ref = (profile.get("storageProfile") or {}).get("imageReference") or {}
        if not (ref.get("id") or all(ref.get(k) for k in ("publisher", "offer", "sku"))):
            raise _bad("storageProfile.imageReference needs publisher, offer and sku (or id)")
        priority = profile.get("priority", "Regular")
        if priority not in ("Regular", "Low", "Spot"):
            raise _bad(f"priority '{priority}' is not valid")
        if priority == "Spot":
            if profile.get("evictionPolicy") not in ("Delete", "Deallocate"):
                raise _bad("a Spot profile needs evictionPolicy Delete or Deallocate")
            price = (profile.get("billingProfile") or {}).get("maxPrice", -1)
            if not isinstance(price, int | float) or (price != -1 and price <= 0):
                raise _bad(f"billingProfile.maxPrice {price!r}: -1 or a price above 0")
            old = (s["properties"].get("virtualMachineProfile") or {}).get("priority", "Regular")
            if "virtualMachineProfile" in s["properties"] and old != priority:
                raise ArmError(409, "PropertyChangeNotAllowed",
                               "Changing property 'priority' is not allowed.")  # fmt: skip
        elif profile.get("evictionPolicy") or profile.get("billingProfile"):
            raise _bad("evictionPolicy and billingProfile are for Spot profiles")
        net = profile.get("networkProfile") or {}
        if s["properties"]["orchestrationMode"] == "Flexible" and not net.get("networkApiVersion"):
            raise _bad("a Flexible scale set's networkProfile needs networkApiVersion")
        configs = net.get("networkInterfaceConfigurations") or []
        if not configs or not all(
            (c.get("properties") or {}).get("ipConfigurations") for c in configs
        ):
            raise _bad("networkProfile.networkInterfaceConfigurations needs ipConfigurations")

    def _recount(self, s: dict[str, Any]) -> None:
        """A set's capacity is what it holds (after a short scale-out, a delete)."""
        s["sku"]["capacity"] = len([v for v in self.vms.values() if v["_set"] == s["id"]])

    def _set_doc(self, s: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in s.items() if not k.startswith("_")}

    def _scale_out(self, s: dict[str, Any], n: int, op_id: str) -> None:
        size = s["sku"]["name"]
        spot = s["properties"]["virtualMachineProfile"].get("priority") == "Spot"
        if spot and self.spot == "refuse":
            self.ops[op_id]["_error"] = {
                "code": self.spot_code,
                "message": f"Allocation failed. We do not have sufficient capacity for the "
                f"requested Spot VM size {size} in this region.",
            }
            self._recount(s)
            return
        if spot and self.spot == "withhold":  # made, and never allocated
            waiting = [self._new_vm(s, withheld=True)["name"] for _ in range(n)]
            self.withheld.update(waiting)
            self.ops[op_id]["_withheld"] = waiting
            return
        room, code = self.room.get(size, (math.inf, ""))
        if code == "OperationNotAllowed" and room < n:
            raise ArmError(
                409,
                "OperationNotAllowed",
                f"Operation could not be completed as it results in exceeding "
                f"approved standard{size.split('_')[1][:2]}Family Cores quota.",
            )
        made = int(min(n, room))
        if size in self.room:
            self.room[size] = (int(room - made), code)
        for _ in range(made):
            self._new_vm(s)
        if made < n:
            self.ops[op_id]["_error"] = {
                "code": code or "AllocationFailed",
                "message": f"Allocation failed. We do not have sufficient capacity for the "
                f"requested VM size {size} in this region.",
            }
            self._recount(s)

    # -- virtual machines ---------------------------------------------------------------
    def _new_vm(self, s: dict[str, Any], withheld: bool = False) -> dict[str, Any]:
        profile = s["properties"]["virtualMachineProfile"]
        flexible = s["properties"]["orchestrationMode"] == "Flexible"
        group = s["_group"]
        if flexible:
            name = f"{s['name']}_{secrets.token_hex(4)}"
            vid = (
                f"/subscriptions/{self.subscription}/resourceGroups/{_rg(s)}/providers/"
                f"Microsoft.Compute/virtualMachines/{name}"
            )
        else:
            instance = str(s["_next"])
            s["_next"] += 1
            name = f"{s['name']}_{instance}"
            vid = f"{s['id']}/virtualMachines/{instance}"
        os_profile = profile["osProfile"]
        computer = f"{os_profile['computerNamePrefix']}{secrets.token_hex(3)}"
        ip = self._address()
        nics: list[dict[str, Any]] = []
        for c in profile["networkProfile"]["networkInterfaceConfigurations"]:
            nic_name = f"{name}-{c.get('name', 'nic')}"[:80]
            nic_id = (
                f"/subscriptions/{self.subscription}/resourceGroups/{_rg(s)}/providers/"
                f"Microsoft.Network/networkInterfaces/{nic_name}"
            )
            if not flexible:  # a Uniform set's NICs are its own sub-resources
                nic_id = f"{vid}/networkInterfaces/{c.get('name', 'nic')}"
            ipc = c["properties"]["ipConfigurations"][0]
            self.nics[(group, nic_name.lower())] = {
                "name": nic_name,
                "id": nic_id,
                "location": s["location"],
                "type": "Microsoft.Network/networkInterfaces",
                "properties": {
                    "provisioningState": "Succeeded",
                    "ipConfigurations": [
                        {
                            "name": ipc.get("name", "ipconfig1"),
                            "properties": {
                                "privateIPAddress": ip if not nics else self._address(),
                                "privateIPAllocationMethod": "Dynamic",
                                "subnet": (ipc.get("properties") or {}).get("subnet") or {},
                                "primary": True,
                            },
                        }
                    ],
                    "virtualMachine": {"id": vid},
                    "primary": not nics,
                },
            }
            if not flexible:
                self.nics[(group, nic_name.lower())]["_set"] = s["id"]
            delete = (c.get("properties") or {}).get("deleteOption", "Detach")
            if not flexible:
                delete = "Delete"  # a Uniform set's NIC goes with its VM
            nics.append({"id": nic_id, "properties": {"primary": not nics, "deleteOption": delete}})
        disk = f"{name}_OsDisk_1_{secrets.token_hex(16)}"
        self.disks[(group, disk.lower())] = name
        storage = profile.get("storageProfile") or {}
        os_disk = dict(storage.get("osDisk") or {})
        os_disk["name"] = disk
        vm_id = str(uuid.uuid4())
        vm: dict[str, Any] = {
            "name": name,
            "id": vid,
            "type": "Microsoft.Compute/virtualMachines",
            "location": s["location"],
            "zones": list(s.get("zones") or [])[:1],
            "tags": {},
            "properties": {
                "vmId": vm_id,
                "hardwareProfile": {"vmSize": s["sku"]["name"]},
                "storageProfile": {
                    "imageReference": storage.get("imageReference"),
                    "osDisk": os_disk,
                },
                "osProfile": {
                    "computerName": computer,
                    "adminUsername": os_profile.get("adminUsername", ""),
                    "linuxConfiguration": os_profile.get("linuxConfiguration"),
                },
                "networkProfile": {"networkInterfaces": nics},
                "diagnosticsProfile": profile.get("diagnosticsProfile") or {},
                "provisioningState": "Creating",
                "timeCreated": _iso(),
            },
            "_set": s["id"],
            "_group": group,
            "_made": time.time(),
            "_ip": ip,
            "_disk": disk,
            "_flexible": flexible,
        }
        if flexible:
            vm["properties"]["virtualMachineScaleSet"] = {"id": s["id"]}
        else:
            vm["instanceId"] = name.rsplit("_", 1)[1]
        for key in ("priority", "evictionPolicy", "billingProfile"):
            if key in profile:
                vm["properties"][key] = profile[key]
        if "proximityPlacementGroup" in s["properties"]:
            vm["properties"]["proximityPlacementGroup"] = s["properties"]["proximityPlacementGroup"]
        if withheld:
            vm["_withheld"] = True
        self.vms[(group, name.lower())] = vm
        if self.vmhost is not None and not withheld:
            self._boot(vm, os_profile, storage)
        return vm

    def _boot(
        self, vm: dict[str, Any], os_profile: Mapping[str, Any], storage: Mapping[str, Any]
    ) -> None:
        keys = tuple(
            str(k.get("keyData", "")).strip()
            for k in ((os_profile.get("linuxConfiguration") or {}).get("ssh") or {}).get(
                "publicKeys"
            )
            or []
        )
        data = os_profile.get("customData")
        user_data = base64.b64decode(data).decode("utf-8", "replace") if data else None
        ref = storage.get("imageReference") or {}
        image = ":".join(str(ref.get(k, "")) for k in ("publisher", "offer", "sku", "version"))
        self.vmhost.boot(
            vm["properties"]["vmId"],
            vm["_ip"],
            user_data,
            tuple(k for k in keys if k),
            image,
            hostname=vm["properties"]["osProfile"]["computerName"],
        )
        vm_id = vm["properties"]["vmId"]
        self.imds.add(vm_id, vm["name"])
        self.imds.serve(vm_id, self.vmhost.netns_of(vm_id))

    def _address(self) -> str:
        """A new VM's private address: the lowest free one of the lab's range (with
        booting), else the next of 10.252.0.0/16."""
        if self.vm_range is None:
            self._addresses += 1
            n = self._addresses
            return f"10.252.{(n // 250) % 250}.{n % 250 + 4}"
        held = {v["_ip"] for v in self.vms.values()}
        for host in list(self.vm_range.hosts())[1:]:  # the first is the gateway
            if str(host) not in held:
                return str(host)
        raise ArmError(409, "SubnetIsFull", f"Subnet {self.vm_range} has no free address")

    def _vm(self, group: str, name: str) -> dict[str, Any]:
        vm = self.vms.get((group, name.lower()))
        if vm is None or not vm["_flexible"]:
            raise ArmError(
                404,
                "ResourceNotFound",
                f"The Resource 'Microsoft.Compute/virtualMachines/{name}' under "
                f"resource group '{group}' was not found.",
            )
        return vm

    def _set_vm(self, group: str, set_name: str, instance_id: str) -> dict[str, Any]:
        """A Uniform set's VM by its instance id."""
        s = self._set(group, set_name)
        vm = next(
            (
                v
                for v in self.vms.values()
                if v["_set"] == s["id"] and v.get("instanceId") == instance_id
            ),
            None,
        )
        if vm is None:
            raise ArmError(
                404,
                "NotFound",
                f"The Virtual Machine Scale Set VM '{set_name}_{instance_id}' was not found.",
            )
        return vm

    def _state(self, vm: dict[str, Any]) -> None:
        """Its provisioning state as time has moved (the operation's delay)."""
        props = vm["properties"]
        if vm.get("_withheld"):
            return  # Creating, until it is deleted
        if props["provisioningState"] == "Creating" and time.time() >= vm["_made"] + self.op_delay:
            props["provisioningState"] = "Succeeded"

    def _vm_doc(self, vm: dict[str, Any], view: bool) -> dict[str, Any]:
        self._state(vm)
        out = {k: v for k, v in vm.items() if not k.startswith("_")}
        if view:
            props = dict(out["properties"])
            now = time.time()
            prov = props["provisioningState"]
            if vm.get("_withheld"):
                power = ""  # not allocated: no power state
            elif prov == "Deleting":
                power = "PowerState/stopping"
            elif now >= vm["_made"] + self.boot_delay:
                power = "PowerState/running"
            else:
                power = "PowerState/starting"
            statuses = [
                {
                    "code": f"ProvisioningState/{prov.lower()}",
                    "level": "Info",
                    "displayStatus": f"Provisioning {prov.lower()}",
                },
            ]
            if power:
                statuses.append(
                    {"code": power, "level": "Info", "displayStatus": "VM " + power.split("/")[1]}
                )
            props["instanceView"] = {
                "computerName": props["osProfile"]["computerName"],
                "osName": "debian",
                "statuses": statuses,
            }
            storage = ((props.get("diagnosticsProfile") or {}).get("bootDiagnostics") or {}).get(
                "storageUri"
            )
            if storage:  # the site's own account: the log's blob, named as Azure names it
                vm_id = props["vmId"]
                blob = f"{storage.rstrip('/')}/bootdiagnostics-{vm['name'][:9].lower()}-{vm_id}"
                props["instanceView"]["bootDiagnostics"] = {
                    "serialConsoleLogBlobUri": f"{blob}/{vm['name']}.{vm_id}.serialconsole.log",
                    "consoleScreenshotBlobUri": f"{blob}/{vm['name']}.{vm_id}.screenshot.bmp",
                }
            out["properties"] = props
        return out

    def _list_vms(self, group: str, q: Mapping[str, str], base: str, path: str) -> dict[str, Any]:
        """A resource group's VMs, in pages; ``$filter`` on the scale set alone, and
        ``$expand=instanceView`` only with that filter (as Azure takes them)."""
        wanted = ""
        if q.get("$filter"):
            m = FILTER.match(q["$filter"])
            if m is None:
                raise _bad(
                    f"$filter '{q['$filter']}': only 'virtualMachineScaleSet/id' eq "
                    "'...' is supported"
                )
            wanted = m.group(1).lower()
        view = q.get("$expand") == "instanceView"
        if view and not wanted:
            raise _bad("$expand=instanceView is supported only with a $filter on the scale set")
        rows = [
            v
            for (g, _), v in self.vms.items()
            if g == group and v["_flexible"] and (not wanted or v["_set"].lower() == wanted)
        ]
        return self._paged(rows, q, base, path, view)

    def _paged(
        self,
        rows: list[dict[str, Any]],
        q: Mapping[str, str],
        base: str,
        path: str,
        view: bool = False,
    ) -> dict[str, Any]:
        start = int(q.get("$skiptoken") or 0)
        if start < 0:
            raise _bad("$skiptoken")
        page = rows[start : start + self.page]
        docs = [
            self._vm_doc(r, view) if "vmId" in r.get("properties", {}) else _public(r) for r in page
        ]
        out: dict[str, Any] = {"value": docs}
        if start + self.page < len(rows):
            keep = {k: v for k, v in q.items() if k != "$skiptoken"}
            query = "&".join(f"{k}={quote(v, safe='')}" for k, v in keep.items())
            out["nextLink"] = f"{base}{path}?{query}&$skiptoken={start + self.page}"
        return out

    def _delete_vm(
        self, group: str, name: str, base: str
    ) -> tuple[int, Any, list[tuple[str, str]]]:
        vm = self.vms.get((group, name.lower())) or self._vm(group, name)
        vm["properties"]["provisioningState"] = "Deleting"
        self._halt(vm)
        self._going[(group, name.lower())] = time.time() + self.op_delay
        self._sweep()
        return 202, None, self._new_op(vm["location"], base)

    def _sweep(self) -> None:
        """Remove the VMs whose delete has taken its time."""
        now = time.time()
        for key, when in list(self._going.items()):
            if now >= when:
                del self._going[key]
                self._remove_vm(key)

    def _delete_instances(
        self, group: str, name: str, body: Any, base: str
    ) -> tuple[int, Any, list[tuple[str, str]]]:
        s = self._set(group, name)
        ids = [str(i) for i in (body or {}).get("instanceIds") or []]
        if not ids:
            raise _bad("instanceIds is required")
        for vm in [v for v in self.vms.values() if v["_set"] == s["id"]]:
            if vm.get("instanceId") in ids:
                self._remove_vm((vm["_group"], vm["name"].lower()))
        self._recount(s)
        return 202, None, self._new_op(s["location"], base)

    def _remove_vm(self, key: tuple[str, str]) -> None:
        vm = self.vms.pop(key, None)
        if vm is None:
            return
        self._halt(vm)
        going = {
            n["id"]
            for n in vm["properties"]["networkProfile"]["networkInterfaces"]
            if n["properties"].get("deleteOption") == "Delete"
        }
        for key in [k for k, nic in self.nics.items() if nic["id"] in going]:
            del self.nics[key]
        os_disk = vm["properties"]["storageProfile"]["osDisk"]
        if os_disk.get("deleteOption") == "Delete":
            self.disks.pop((vm["_group"], vm["_disk"].lower()), None)
        s = next((x for x in self.sets.values() if x["id"] == vm["_set"]), None)
        if s is not None:  # a set counts what it holds (a Uniform one: instances deleted)
            self._recount(s)

    def _halt(self, vm: Mapping[str, Any]) -> None:
        if self.vmhost is not None and not vm.get("_withheld"):
            self.imds.stop(vm["properties"]["vmId"])
            self.vmhost.halt(vm["properties"]["vmId"])

    def _boot_diagnostics(
        self, group: str, name: str, q: Mapping[str, str], base: str, any_mode: bool = False
    ) -> dict[str, Any]:
        vm = self.vms[(group, name.lower())] if any_mode else self._vm(group, name)
        diag = (vm["properties"].get("diagnosticsProfile") or {}).get("bootDiagnostics") or {}
        if not diag.get("enabled"):
            raise ArmError(
                409, "BootDiagnosticsDisabled", f"Boot diagnostics are not enabled for VM '{name}'."
            )
        minutes = int(q.get("sasUriExpirationTimeInMinutes") or 120)
        if not 1 <= minutes <= 1440:
            raise _bad("sasUriExpirationTimeInMinutes must be 1-1440")
        vm_id = vm["properties"]["vmId"]
        sig = self._sigs.setdefault(vm_id, secrets.token_urlsafe(24))
        expiry = _iso(time.time() + minutes * 60)
        return {
            "consoleScreenshotBlobUri": f"{base}/_blob/{vm_id}/screenshot.bmp?"
            f"sv=2021-08-06&se={quote(expiry)}&sr=b&sp=r&sig={sig}",
            "serialConsoleLogBlobUri": f"{base}/_blob/{vm_id}/serialconsole.log?"
            f"sv=2021-08-06&se={quote(expiry)}&sr=b&sp=r&sig={sig}",
        }

    # -- long-running operations --------------------------------------------------------
    def _new_op(self, location: str, base: str) -> list[tuple[str, str]]:
        op_id = str(uuid.uuid4())
        self.ops[op_id] = {"_start": time.time()}
        url = (
            f"{base}/subscriptions/{self.subscription}/providers/Microsoft.Compute/"
            f"locations/{location}/operations/{op_id}?api-version={COMPUTE_API}"
        )
        return [("Azure-AsyncOperation", url), ("Location", url + "&monitor=true")]

    def _operation(self, op_id: str) -> dict[str, Any]:
        op = self.ops.get(op_id)
        if op is None:
            raise ArmError(404, "OperationNotFound", f"Operation '{op_id}' was not found.")
        out: dict[str, Any] = {"name": op_id, "startTime": _iso(op["_start"])}
        live = {v["name"] for v in self.vms.values()}
        if any(n in live for n in op.get("_withheld", ())):  # Spot capacity withheld
            out["status"] = "InProgress"  # while its VMs wait
            return out
        if op.get("_withheld"):  # deleted while they waited: the set itself is fine
            out.update(endTime=_iso(), status="Canceled")
            self._ended(op, "Succeeded")
            return out
        if time.time() < op["_start"] + self.op_delay:
            out["status"] = "InProgress"
            return out
        out["endTime"] = _iso(op["_start"] + self.op_delay)
        out["status"] = "Failed" if "_error" in op else "Succeeded"
        if "_error" in op:
            out["error"] = op["_error"]
        self._ended(op, out["status"])
        return out

    @staticmethod
    def _ended(op: Mapping[str, Any], state: str) -> None:
        """The operation's resource, still Creating or Updating, is now ``state``."""
        res = op.get("_resource")
        if res is not None and res["properties"].get("provisioningState") in (
            "Creating",
            "Updating",
        ):
            res["properties"]["provisioningState"] = state


def _rg(s: Mapping[str, Any]) -> str:
    """The resource group's name as it was written (its id's)."""
    return str(s["id"].split("/")[4])


def scale_key(vm_id: str) -> str:
    """A host key of the VM's own (scale mode): an ed25519 key blob whose 32 bytes are a
    hash of its id, in the form the daemon's parser reads."""
    blob = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + hashlib.sha256(vm_id.encode()).digest()
    return base64.b64encode(blob).decode()


def _public(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A resource as ARM shows it: without the emulator's own keys."""
    return {k: v for k, v in doc.items() if not k.startswith("_")}
