"""A cloud provider in memory: instances that boot on the fake clock."""

from __future__ import annotations

import base64
import hashlib
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from slurm_burst.core.cloud import (
    CLUSTER_TAG,
    GROUP_TAG,
    NODE_TAG,
    TOKEN_TAG,
    CapacityError,
    CloudError,
    Instance,
    InUseError,
    LaunchSpec,
    NotFoundError,
)
from slurm_burst.core.errors import BurstError
from slurm_burst.ports import Clock


@dataclass
class _Vm:
    id: str
    name: str
    size: str
    created: float
    token: str
    launch_index: int
    tags: dict[str, str]
    state: str = ""  # "" while it follows the clock; set when forced
    fault: str = ""
    host_key_type: str = "ssh-ed25519"
    node: str = ""  # the node it was launched for (a batch's are named only later)


@dataclass
class FakeCloud:
    """The Cloud port. An instance is ``pending`` for ``boot_seconds`` of the clock, then
    ``running`` with an address and a console host key (``never_boot`` keeps it pending,
    ``no_host_keys`` keeps its host keys unpublished).

    Errors are injected per call: ``errors["launch"]`` is a list popped one per call,
    ``capacity`` a set of sizes that always fail for want of capacity, ``limit`` the
    most instances of a size one call gets (EC2's MinCount..MaxCount: fewer than the
    call's ``min_count`` is a capacity error). ``calls`` counts
    every call by name. Terminated instances stay listed, as on EC2.
    """

    name: str
    clock: Clock
    batch_max: int = 1
    boot_seconds: float = 2.0
    console_seconds: float = 0.0  # host keys are on the console this long after running
    lists_fleet: bool = False  # booting nodes read list_fleet (EC2's way), not get
    never_boot: set[str] = field(default_factory=set)  # node names
    no_host_keys: set[str] = field(default_factory=set)  # node names: run, publish no keys
    capacity: set[str] = field(default_factory=set)  # sizes
    limit: dict[str, int] = field(default_factory=dict)  # size -> most instances per call
    errors: dict[str, list[BurstError]] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    vms: dict[str, _Vm] = field(default_factory=dict)
    placements: dict[str, set[str]] = field(default_factory=dict)  # name -> instance ids
    spot: str = ""  # "refuse": spot launches fail for capacity; "withhold": stay pending
    names_at_launch: bool = False  # each instance named after its node at launch (GCE's)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- the port ---------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> Instance:
        return self._launch("launch", spec, 1)[0]

    def launch_many(self, spec: LaunchSpec) -> list[Instance]:
        if spec.count > self.batch_max:
            raise CloudError(f"{spec.count} instances in one call; at most {self.batch_max}")
        return self._launch("launch_many", spec, spec.count)

    def find(self, token: str, cluster: str) -> list[Instance]:
        self._call("find")
        with self._lock:
            vms = [
                v
                for v in self.vms.values()
                if v.token == token
                and v.tags.get(CLUSTER_TAG) == cluster
                and self._state(v) != "terminated"
            ]
            return [self._instance(v) for v in sorted(vms, key=lambda v: v.launch_index)]

    def tag(self, instance_id: str, tags: Mapping[str, str]) -> None:
        self._call("tag")
        with self._lock:
            self._vm(instance_id).tags.update(tags)

    def get(self, instance_id: str) -> Instance | None:
        self._call("get")
        with self._lock:
            vm = self.vms.get(instance_id)
            return None if vm is None else self._instance(vm)

    def list_instances(self, cluster: str) -> list[Instance]:
        self._call("list")
        with self._lock:
            return [
                self._instance(v) for v in self.vms.values() if v.tags.get(CLUSTER_TAG) == cluster
            ]

    def list_fleet(self, cluster: str, before_page: Callable[[], None]) -> list[Instance]:
        before_page()
        self._call("list_fleet")
        with self._lock:
            return [
                self._instance(v)
                for v in self.vms.values()
                if v.tags.get(CLUSTER_TAG) == cluster and self._state(v) != "terminated"
            ]

    def terminate(self, instance_id: str) -> None:
        self._call("terminate")
        with self._lock:
            vm = self.vms.get(instance_id)
            if vm is not None:
                vm.state = "terminated"

    def create_placement(self, name: str) -> None:
        self._call("create_placement")
        with self._lock:
            self.placements.setdefault(name, set())

    def delete_placement(self, name: str) -> None:
        self._call("delete_placement")
        with self._lock:
            members = self.placements.get(name)
            if members is None:
                return
            if any(self._state(self.vms[i]) != "terminated" for i in members if i in self.vms):
                raise InUseError(f"placement group {name} holds instances")
            del self.placements[name]

    def host_keys(self, instance_id: str, size: str = "") -> list[tuple[str, str]]:
        self._call("host_keys")
        with self._lock:
            vm = self._vm(instance_id)
            if self._state(vm) != "running" or self._node(vm) in self.no_host_keys:
                return []
            if self.clock.now() - vm.created < self.boot_seconds + self.console_seconds:
                return []
            return [(vm.host_key_type, host_key(vm.id))]

    # -- what tests do to it -----------------------------------------------------
    def vanish(self, instance_id: str) -> None:
        """The provider deleted the instance (a spot reclaim, an admin)."""
        with self._lock:
            self.vms.pop(instance_id)

    def put_in_error(self, instance_id: str, fault: str) -> None:
        """The provider accepted the instance, then failed it (OpenStack's no valid host)."""
        with self._lock:
            vm = self._vm(instance_id)
            vm.state, vm.fault = "error", fault

    def live(self) -> list[Instance]:
        with self._lock:
            return [self._instance(v) for v in self.vms.values() if self._state(v) != "terminated"]

    def of_node(self, node: str) -> list[Instance]:
        return [i for i in self.live() if i.tags.get(NODE_TAG) == node]

    # -- inside ------------------------------------------------------------------
    def _call(self, name: str) -> None:
        with self._lock:
            self.calls[name] += 1
            queued = self.errors.get(name)
            err = queued.pop(0) if queued else None
        if err is not None:
            raise err

    def _launch(self, call: str, spec: LaunchSpec, count: int) -> list[Instance]:
        self._call(call)
        if spec.size in self.capacity:
            raise CapacityError(f"InsufficientInstanceCapacity: no {spec.size} left")
        if spec.spot and self.spot == "refuse":
            raise CapacityError(f"InsufficientInstanceCapacity: no spot {spec.size} left")
        if spec.placement_group and spec.placement_group not in self.placements:
            raise NotFoundError(
                f"InvalidPlacementGroup.Unknown: {spec.placement_group}",
                "InvalidPlacementGroup.Unknown",
            )
        room = self.limit.get(spec.size, count)
        if room < min(count, spec.min_count or count):  # as EC2: MinCount or nothing
            raise CapacityError(f"InsufficientInstanceCapacity: {room} {spec.size} left")
        count = min(count, room)
        with self._lock:
            made = sorted(
                (v for v in self.vms.values() if v.token == spec.token),
                key=lambda v: v.launch_index,
            )
            # a provider that names each instance after its node (GCE) makes which of
            # them it makes: here the last ones, so that no caller can rely on the order
            named = list(spec.names[-count:]) if self.names_at_launch and spec.names else []
            if not made:  # the token is new: make them (a repeat returns the same ones)
                for i in range(count):
                    vm_id = f"{self.name}-{len(self.vms) + 1:06d}"
                    name = spec.node if count == 1 else f"{spec.group}-{spec.token[-8:]}-{i}"
                    name = named[i] if named else name
                    tags = {
                        **spec.tags,
                        CLUSTER_TAG: spec.cluster,
                        GROUP_TAG: spec.group,
                        TOKEN_TAG: spec.token,
                    }
                    if count == 1 or named:
                        tags[NODE_TAG] = name
                    # its node: as the launcher adopts it (by launch index, or by name)
                    node = named[i] if named else (spec.names[i : i + 1] or [spec.node])[0]
                    self.vms[vm_id] = _Vm(
                        vm_id, name, spec.size, self.clock.now(), spec.token, i, tags, node=node
                    )
                    if spec.spot and self.spot == "withhold":
                        self.vms[vm_id].state = "pending"  # capacity never arrives
                    if spec.placement_group:
                        self.placements[spec.placement_group].add(vm_id)
                    made.append(self.vms[vm_id])
            return [self._instance(v) for v in made]

    def _vm(self, instance_id: str) -> _Vm:
        vm = self.vms.get(instance_id)
        if vm is None:
            raise NotFoundError(f"{self.name}: instance {instance_id} not found")
        return vm

    def _state(self, vm: _Vm) -> str:
        if vm.state:
            return vm.state
        booted = self.clock.now() - vm.created >= self.boot_seconds
        return "running" if booted and self._node(vm) not in self.never_boot else "pending"

    @staticmethod
    def _node(vm: _Vm) -> str:
        """Whose instance it is: the node it was launched for, else the one its tag names
        (a batch's instance boots, or not, whether or not it is named yet)."""
        return vm.node or vm.tags.get(NODE_TAG, "")

    def _instance(self, vm: _Vm) -> Instance:
        state = self._state(vm)
        addr = (address(vm.id),) if state == "running" else ()
        return Instance(
            vm.id,
            vm.name,
            state,
            self.name,
            vm.size,
            private_ips=addr,
            tags=MappingProxyType(dict(vm.tags)),
            launch_index=vm.launch_index,
            fault=vm.fault,
        )


def address(instance_id: str) -> str:
    """The instance's private address (stable per id)."""
    n = int(hashlib.sha256(instance_id.encode()).hexdigest(), 16)
    return f"10.{n % 250 + 1}.{n // 250 % 250 + 1}.{n // 62500 % 250 + 2}"


def host_key(instance_id: str) -> str:
    """The instance's SSH host key as its console prints it (base64, stable per id)."""
    blob = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20"
    return base64.b64encode(blob + hashlib.sha256(instance_id.encode()).digest()).decode()
