"""Provider profiles: one launch (a node group's size, image, GPUs, spot, disk, tags,
user-data, and the provider's network placement) mapped onto a libcloud driver's
``create_node`` keyword arguments.

A table, not branches in the services: ``PROFILES[driver type]`` builds the
arguments for EC2, GCE, Azure ARM and OpenStack; any other libcloud compute driver
gets the generic mapping (name, size, image, the daemon's SSH key, and user-data /
tags where its ``create_node`` takes them). Only public material ever goes into a
request: the daemon's SSH *public* key and user-data without secrets.

What each provider's arguments mean, and where they come from:

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

import importlib
import inspect
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from libcloud.compute.base import NodeAuthSSHKey, NodeImage, NodeLocation, NodeSize

from slurm_burst import extensions
from slurm_burst.core.cloud import CLUSTER_TAG, GROUP_TAG, NODE_TAG, TOKEN_TAG, LaunchSpec
from slurm_burst.core.hostkeys import SERIAL_PORT_SCRIPT

# drivers that make many instances in one call (EC2: RunInstances MinCount/MaxCount)
BATCH_DEFAULT = {"ec2": 500}
# the provider API behind each of our calls, where its throttling is per API (EC2)
API_NAMES: dict[str, dict[str, str]] = {
    "ec2": {
        "launch": "RunInstances", "find": "DescribeInstances", "get": "DescribeInstances",
        "list": "DescribeInstances", "tag": "CreateTags", "terminate": "TerminateInstances",
        "host_keys": "GetConsoleOutput", "create_placement": "CreatePlacementGroup",
        "delete_placement": "DeletePlacementGroup",
    },
}  # fmt: skip
# drivers that filter a listing by tag on the server side (a plugin's says so itself)
TAG_FILTERS = frozenset({"ec2"})
# destroy_node arguments: Azure polls until the VM is gone, then deletes its NIC and disk
# (libcloud's default: a first wait of 10 s, 10 polls); VMs take 30-120 s to delete
DESTROY_KWARGS: dict[str, dict[str, Any]] = {"azure_arm": {"ex_poll_wait": 3, "ex_poll_qty": 60}}


@dataclass(frozen=True)
class Placement:
    """Where a provider's instances go: the provider profile's network settings."""

    network: str = ""
    subnet: str = ""
    security_groups: tuple[str, ...] = ()
    key_name: str = ""
    zone: str = ""
    resource_group: str = ""
    root_device: str = "/dev/sda1"
    ssh_user: str = "root"
    host_keys: str = ""  # the host-key source (core.hostkeys.SOURCES); '' the driver's default
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


def gce_label(text: str) -> str:
    """A GCE label key or value: lower case letters, digits, '_' and '-', at most 63."""
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


Builder = Callable[[Any, LaunchSpec, Placement, NodeSize, Mapping[str, str]], dict[str, Any]]


def _types(driver_module: str) -> Any:
    """A libcloud driver module (its resource classes), imported when first needed."""
    return importlib.import_module(f"libcloud.compute.drivers.{driver_module}")


def _image(driver: Any, spec: LaunchSpec) -> NodeImage:
    return NodeImage(id=spec.image, name=spec.image, driver=driver)


def ec2(
    driver: Any, spec: LaunchSpec, p: Placement, size: NodeSize, tagset: Mapping[str, str]
) -> dict[str, Any]:
    ec2_types = _types("ec2")
    kw: dict[str, Any] = {
        "name": spec.node,
        "size": size,
        "image": _image(driver, spec),
        "ex_userdata": spec.user_data,
        "ex_metadata": dict(tagset),
        "ex_clienttoken": spec.token,
        "ex_terminate_on_shutdown": True,  # a node that powers itself off is gone, not billed
    }
    if p.key_name:
        kw["ex_keyname"] = p.key_name
    if p.subnet:
        kw["ex_subnet"] = ec2_types.EC2NetworkSubnet(p.subnet, p.subnet, "available")
    if p.security_groups:
        kw["ex_security_group_ids"] = list(p.security_groups)
    if p.zone:
        az = ec2_types.ExEC2AvailabilityZone(
            p.zone, "available", getattr(driver, "region_name", "")
        )
        kw["location"] = ec2_types.EC2NodeLocation(p.zone, p.zone, "", driver, az)
    if spec.disk_gb:
        kw["ex_blockdevicemappings"] = [
            {
                "DeviceName": p.root_device,
                "Ebs": {
                    "VolumeSize": spec.disk_gb,
                    "VolumeType": "gp3",
                    "DeleteOnTermination": "true",
                },
            }
        ]
    if spec.spot:
        kw["ex_spot"] = True
        if spec.spot_max_price:
            kw["ex_spot_max_price"] = spec.spot_max_price
    if spec.placement_group:
        kw["ex_placement_group"] = spec.placement_group
    if spec.count > 1:  # EC2 makes as many as it can between the two, or none
        kw["ex_maxcount"] = spec.count
        kw["ex_mincount"] = spec.min_count or spec.count
    return kw


def gce(
    driver: Any, spec: LaunchSpec, p: Placement, size: NodeSize, tagset: Mapping[str, str]
) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "name": spec.node,
        "size": size,
        "image": spec.image,
        "ex_network": p.network or "default",
        "use_existing_disk": False,  # a fresh boot disk each launch, never a leftover
        "ex_labels": {gce_label(k): gce_label(v) for k, v in tagset.items()},
        "ex_metadata": {
            "startup-script": spec.user_data,
            "ssh-keys": f"{p.ssh_user}:{spec.ssh_public_key.strip()}",
        },
    }
    # where the daemon will read the host keys (attest.py): the guest environment's
    # hostkeys/ guest attributes, or the block our startup script prints to serial port 1
    if (p.host_keys or extensions.default_host_key_source("gce")) == "serial-port":
        kw["ex_metadata"]["startup-script"] = spec.user_data + SERIAL_PORT_SCRIPT
    else:
        kw["ex_metadata"]["enable-guest-attributes"] = "TRUE"
    if p.zone:
        kw["location"] = p.zone
    if p.subnet:
        kw["ex_subnetwork"] = p.subnet
    if p.security_groups:
        kw["ex_tags"] = list(p.security_groups)  # GCE firewall rules select by network tag
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


def azure_arm(
    driver: Any, spec: LaunchSpec, p: Placement, size: NodeSize, tagset: Mapping[str, str]
) -> dict[str, Any]:
    azure_image = _types("azure_arm").AzureImage
    location = NodeLocation(p.zone, p.zone, "", driver)
    parts = spec.image.split(":")
    if len(parts) != 4:
        raise ValueError(f"azure image {spec.image!r} must be a URN PUBLISHER:OFFER:SKU:VERSION")
    publisher, offer, sku, version = parts
    kw: dict[str, Any] = {
        "name": spec.node,
        "size": size,
        "image": azure_image(version, sku, offer, publisher, p.zone, driver),
        "auth": NodeAuthSSHKey(spec.ssh_public_key),
        "ex_resource_group": p.resource_group,
        "location": location,
        "ex_user_name": p.ssh_user,
        "ex_network": p.network,
        "ex_subnet": p.subnet or "default",
        "ex_tags": dict(tagset),
        # bytes: libcloud 3.9 base64-encodes it with b64encode (see azure_connection_fix)
        "ex_customdata": spec.user_data.encode(),
        "ex_use_managed_disks": True,
    }
    if spec.disk_gb:
        kw["ex_disk_size"] = spec.disk_gb
    return kw


def openstack(
    driver: Any, spec: LaunchSpec, p: Placement, size: NodeSize, tagset: Mapping[str, str]
) -> dict[str, Any]:
    os_types = _types("openstack")
    kw: dict[str, Any] = {
        "name": spec.node,
        "size": size,
        "image": _image(driver, spec),
        "ex_userdata": spec.user_data,
        "ex_metadata": dict(tagset),
    }
    if p.key_name:
        kw["ex_keyname"] = p.key_name
    if p.network:
        kw["networks"] = [
            os_types.OpenStackNetwork(n, n, None, driver) for n in p.network.split(",") if n.strip()
        ]
    if p.security_groups:
        kw["ex_security_groups"] = [
            os_types.OpenStackSecurityGroup(None, None, g, "", driver) for g in p.security_groups
        ]
    if p.zone:
        kw["ex_availability_zone"] = p.zone
    if spec.disk_gb:  # boot from a volume of that size, made from the image
        kw["ex_blockdevicemappings"] = [
            {
                "boot_index": 0,
                "uuid": spec.image,
                "source_type": "image",
                "destination_type": "volume",
                "volume_size": spec.disk_gb,
                "delete_on_termination": True,
            }
        ]
    return kw


def generic(
    driver: Any, spec: LaunchSpec, p: Placement, size: NodeSize, tagset: Mapping[str, str]
) -> dict[str, Any]:
    """Any libcloud driver: the arguments its ``create_node`` takes, no more."""
    params = inspect.signature(driver.create_node).parameters
    accepts = set(params)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        accepts |= {"auth", "ex_userdata", "ex_metadata"}  # a wrapper passing all through
    kw: dict[str, Any] = {"name": spec.node, "size": size, "image": _image(driver, spec)}
    if "auth" in accepts:
        kw["auth"] = NodeAuthSSHKey(spec.ssh_public_key)
    if "ex_userdata" in accepts:
        kw["ex_userdata"] = spec.user_data
    if "ex_metadata" in accepts:
        kw["ex_metadata"] = dict(tagset)
    elif "ex_tags" in accepts:
        kw["ex_tags"] = dict(tagset)
    if "ex_token" in accepts:
        kw["ex_token"] = spec.token
    return kw


def azure_connection_fix(driver: Any) -> None:
    """Two changes to what libcloud 3.9's azure_arm driver sends, at its JSON encoder:

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
        return json.dumps(data, default=lambda o: o.decode("ascii") if isinstance(o, bytes) else o)

    conn.encode_data = encode_data
    conn._slurm_burst_fixed = True


PROFILES: dict[str, Builder] = {
    "ec2": ec2,
    "gce": gce,
    "azure_arm": azure_arm,
    "openstack": openstack,
}


def filters_by_tag(kind: str) -> bool:
    return extensions.offers(kind, TAG_FILTERS, lambda d: d.tag_filter)


def _builder(kind: str) -> Builder:
    if kind in PROFILES:
        return PROFILES[kind]
    plugin = extensions.cloud_driver(kind)
    if plugin is not None and plugin.launch_args:
        built: Builder = extensions.resolve(plugin.launch_args)
        return built
    return generic


def create_kwargs(
    kind: str, driver: Any, spec: LaunchSpec, placement: Placement, size: NodeSize
) -> dict[str, Any]:
    """``create_node`` keyword arguments for one launch (``spec.count`` instances)."""
    builder = _builder(kind)
    kw = builder(driver, spec, placement, size, tags(spec, batch=spec.count > 1))
    kw.update(placement.extra)
    return kw
