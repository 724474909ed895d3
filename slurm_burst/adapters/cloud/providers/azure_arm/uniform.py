"""Azure's Uniform scale sets, one per job: what a group whose nodes need InfiniBand
launches into (``placement = "infiniband"``).

Flexible sets have no InfiniBand; a job's nodes on one InfiniBand fabric need a Uniform
set with ``singlePlacementGroup = true`` (at most 100 VMs), as CycleCloud makes them. The
set is the job's placement (the launcher's per-job placement: named after the job's
nodes, recorded before it exists, deleted by the reconcile pass once its nodes are gone,
never split): the launch makes it with the job's capacity in one ``PUT``
(``overprovision = false``: Azure makes no extra VMs to delete), waits for the operation
and lists the set's VMs and their NICs, which are the set's own (not in the resource
group's listing). Its VMs are named ``{set}_{instance id}``; one is deleted through the
set by its instance id. A launch that gets fewer than the job deletes the set: a job's
InfiniBand nodes are all on one fabric or not launched.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from slurm_burst.adapters.cloud.providers.azure_arm import sets
from slurm_burst.core.cloud import CLUSTER_TAG, GROUP_TAG, TOKEN_TAG

if TYPE_CHECKING:
    from slurm_burst.adapters.cloud.compute import LibcloudCloud
    from slurm_burst.core.cloud import Instance, LaunchSpec

log = logging.getLogger(__name__)

SINGLE_GROUP_MOST = 100  # VMs in a Uniform set with singlePlacementGroup = true
# an RDMA-capable size: its additive features (after the vCPU count) hold an "r"
# (Standard_ND96asr_v4, Standard_HB120rs_v3, Standard_NC24rs_v3, Standard_H16r)
RDMA = re.compile(r"(?i)^(?:standard_)?[a-z]+\d+(?:-\d+)?([a-z]*)(?:_|$)")


def needs_infiniband(size: str) -> bool:
    """Whether Azure size ``size`` is RDMA-capable (its InfiniBand needs a Uniform set)."""
    m = RDMA.match(size)
    return bool(m and "r" in m.group(1).lower())


def launch(
    cloud: LibcloudCloud, spec: LaunchSpec, launch_tags: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The job's Uniform set, made with its capacity (or found made by this launch's
    token: a repeat sends nothing), its operation waited for; its VMs, oldest first.
    Fewer than asked: the set is deleted and the operation's error (typed) raised; a
    Spot launch whose capacity has not come within ``spec.spot_wait``: the same, with
    ``SpotCapacityWait``."""

    from slurm_burst.core.cloud import CapacityError, CloudError

    arm = sets.Arm(cloud)
    name = sets.job_set(spec.placement_group, spec.spot)
    n = len(spec.names) or 1
    if n > SINGLE_GROUP_MOST:
        raise CloudError(
            f"{cloud.name}: a job of {n} InfiniBand nodes: a Uniform set with one "
            f"placement group holds {SINGLE_GROUP_MOST}",
            "InvalidParameterValue",
        )
    path = arm.compute("virtualMachineScaleSets", name)
    op: dict[str, Any] = {"status": "Succeeded"}
    if sets.scaleout_mark(arm.get(path))[0] != spec.token:
        body = sets.profile_body(
            cloud,
            spec,
            n,
            {
                CLUSTER_TAG: spec.cluster,
                GROUP_TAG: spec.group,
                **{k: v for k, v in launch_tags.items() if k != TOKEN_TAG},
                sets.SCALEOUT_TAG: f"{spec.token} 0",
            },
            mode="Uniform",
        )
        op = arm.wait(arm.request(path, "PUT", body), sets.launch_wait(spec))
    made = members(arm, path)
    log.info(
        "azure.uniform_set set=%s token=%s asked=%d made=%d status=%s",
        name,
        spec.token,
        n,
        len(made),
        op.get("status"),
    )
    if len(made) >= n and op.get("status") == "Succeeded":
        return made[:n]
    arm.request(path, "DELETE")  # one fabric or none: the job's set goes whole
    if op.get("status") == "InProgress":
        raise sets.spot_waited(cloud, spec)
    if op.get("error"):
        raise sets.op_error(cloud, op)
    raise CapacityError(f"{cloud.name}: {len(made)} of {n} made", "PartialCapacity")


def members(
    arm: sets.Arm, set_path: str, before_page: Callable[[], None] = lambda: None
) -> list[dict[str, Any]]:
    """A Uniform set's VMs with their instance views (pages), oldest first; each noted
    in the book (its set, its instance id; its serial log where the view names one)."""
    vms = arm.pages(
        f"{set_path}/virtualMachines",
        {"api-version": sets.COMPUTE_API, "$expand": "instanceView"},
        before_page,
    )
    bk = sets.book(arm.cloud)
    bk.uniform.update((str(vm["name"]), str(vm["id"])) for vm in vms)
    sets.note_logs(arm.cloud, vms)
    vms.sort(key=lambda v: (int(str(v.get("instanceId", "0")) or 0), str(v["name"])))
    return vms


def addresses(arm: sets.Arm, set_path: str, before_page: Callable[[], None] = lambda: None) -> None:
    """A Uniform set's NICs (its own sub-resources): each VM's private IP, into the book."""
    nics = arm.pages(
        f"{set_path}/networkInterfaces", {"api-version": sets.COMPUTE_API}, before_page
    )
    sets.book(arm.cloud).addresses.update(sets.nic_addresses(nics))


def instances(
    cloud: LibcloudCloud, vms: list[dict[str, Any]], tags: Mapping[str, str]
) -> list[Instance]:
    bk = sets.book(cloud)
    return [
        sets.instance_of(cloud.name, vm, bk.addresses, tags)._replace(launch_index=i)
        for i, vm in enumerate(vms)
    ]


def delete(arm: sets.Arm, name: str) -> bool | None:
    """Delete a Uniform set's VM ``name`` through its set; None: not a Uniform VM we
    know (the book, or ``{set}_{digits}`` of a Uniform set), False: gone."""
    from libcloud.common.exceptions import BaseHTTPError

    bk = sets.book(arm.cloud)
    vm_id = bk.uniform.get(name)
    if vm_id is None:
        base, _, number = name.rpartition("_")
        if not (base and number.isdigit()):
            return None
        vm_id = f"{arm.compute('virtualMachineScaleSets', base)}/virtualMachines/{number}"
    try:
        arm.request(vm_id, "DELETE")
    except BaseHTTPError as exc:
        if exc.code == 404:
            bk.uniform.pop(name, None)
            return False
        raise
    bk.uniform.pop(name, None)
    bk.logs.pop(name, None)
    return True
