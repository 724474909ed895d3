"""Provider profiles: one launch (a node group's size, image, GPUs, spot, disk, tags,
user-data, and the profile's network placement) mapped onto a libcloud driver's
``create_node`` keyword arguments by the provider's own module
(:meth:`~slurm_burst.adapters.cloud.providers.Provider.launch_args`); any other libcloud
driver gets the generic mapping (name, size, image, the daemon's SSH key, and user-data /
tags where its ``create_node`` takes them). Only public material ever goes into a
request: the daemon's SSH *public* key and user-data without secrets.

What each built-in provider's placement settings mean:

========  ===========================  =========================  ==================
driver    network / subnet             security_groups            spot
========  ===========================  =========================  ==================
ec2       - / SubnetId                 SecurityGroupId.N          InstanceMarketOptions
gce       network / subnetwork         network tags               scheduling.preemptible
azure_arm virtual network / subnet     (NSG of the subnet)        not in libcloud 3.9
openstack network UUIDs / -            security group names       (none)
========  ===========================  =========================  ==================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from libcloud.compute.base import NodeImage, NodeSize

from slurm_burst.adapters.cloud.registry import provider
from slurm_burst.core.cloud import CLUSTER_TAG, GROUP_TAG, NODE_TAG, TOKEN_TAG, LaunchSpec


@dataclass(frozen=True)
class Placement:
    """Where a provider's instances go: the provider profile's network settings."""

    network: str = ""
    subnet: str = ""
    security_groups: tuple[str, ...] = ()
    key_name: str = ""
    zone: str = ""
    region: str = ""  # the profile's region (GCE: a batch with no zone goes to the region)
    resource_group: str = ""
    root_device: str = "/dev/sda1"
    ssh_user: str = "root"
    host_keys: str = ""  # the host-key source (Provider.host_key_sources); '' the default
    extra: Mapping[str, Any] = field(default_factory=dict)  # passed to create_node as is


def tags(spec: LaunchSpec, batch: bool = False) -> dict[str, str]:
    """The tags every instance carries; a batch's node tag is set per instance afterwards."""
    out = {
        CLUSTER_TAG: spec.cluster,
        GROUP_TAG: spec.group,
        TOKEN_TAG: spec.token,
        **spec.tags,
    }
    if not batch:
        out[NODE_TAG] = spec.node
    return out


def image(driver: Any, spec: LaunchSpec) -> NodeImage:
    """The launch's image by its id, without a lookup."""
    return NodeImage(id=spec.image, name=spec.image, driver=driver)


def user_data_args(
    driver: Any, spec: LaunchSpec, size: NodeSize, tags: Mapping[str, str]
) -> dict[str, Any]:
    """What EC2's and OpenStack's ``create_node`` share: the name, size and image, the
    user-data and the tags as metadata."""
    return {
        "name": spec.node,
        "size": size,
        "image": image(driver, spec),
        "ex_userdata": spec.user_data,
        "ex_metadata": dict(tags),
    }


def create_kwargs(
    kind: str, driver: Any, spec: LaunchSpec, placement: Placement, size: NodeSize
) -> dict[str, Any]:
    """``create_node`` keyword arguments for one launch (``spec.count`` instances)."""
    kw = provider(kind).launch_args(driver, spec, placement, size, tags(spec, spec.count > 1))
    kw.update(placement.extra)
    return kw
