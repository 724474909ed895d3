"""What the lab's emulator tests share: the VMs an emulator booted, and a release of
nodes that leaves nothing behind (their VMs halted, their records torn down, no network
namespace left)."""

from __future__ import annotations

from slurm_burst_lab.labvms import LabVms
from slurm_burst_lab.service import Lab

from slurm_burst.adapters.state.store import Store
from tests.conftest import wait
from tests.lab.conftest import sh


def emulator_vms(lab: Lab, emulator: str) -> list[str]:
    """The ids of the VMs emulator ``emulator`` (ec2, gce, azure) has booted and not halted."""
    vms = lab.paths.state / emulator / "vms"
    return sorted(d.name for d in vms.iterdir()) if vms.is_dir() else []


def release(env: dict[str, str], lab: Lab, store: Store, nodes: list[str], emulator: str,
            vm_ids: set[str]) -> None:  # fmt: skip
    """Power ``nodes`` down; their VMs (``vm_ids``) halted, the nodes torn down, and no
    network namespace of those VMs left."""
    sh(env, "scontrol", "update", f"nodename={','.join(nodes)}", "state=power_down")
    wait(lambda: not vm_ids & set(emulator_vms(lab, emulator)), 240,
         f"the {emulator} VMs halted")  # fmt: skip
    wait(
        lambda: all(str(getattr(store.node(n), "state", "")) == "terminated" for n in nodes),
        120,
        f"the {emulator} nodes torn down",
    )
    left = [i for i in vm_ids if LabVms.netns_of(i).exists()]
    assert not left, left
