"""Amazon EC2: whole jobs in one RunInstances, one paginated fleet listing, the API's
documented buckets, spot, cluster placement groups, the console's host keys and the
metadata service's interruption notices (docs/providers.md, docs/scale.md)."""

from __future__ import annotations

import base64
import importlib
import logging
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from slurm_burst.adapters.cloud.providers import METADATA, Provider
from slurm_burst.core.cloud import CLUSTER_TAG
from slurm_burst.core.hostkeys import parse_console_host_keys
from slurm_burst.core.ratelimit import ApiTable, Limit

if TYPE_CHECKING:
    from libcloud.compute.base import Node, NodeSize

    from slurm_burst.adapters.cloud.compute import LibcloudCloud
    from slurm_burst.adapters.cloud.profiles import Placement
    from slurm_burst.core.cloud import Instance, LaunchSpec

log = logging.getLogger(__name__)

NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
PAGE = 1000  # DescribeInstances' largest page
# every state but terminated: what a listing of the live fleet asks for
LIVE_STATES = ("pending", "running", "shutting-down", "stopping", "stopped")

# EC2's request-token buckets per account and region (EC2 API reference, "Request
# throttling"; see docs/scale.md): each API is evaluated on its own, with the bucket of
# its category. Non-mutating (Describe*, Get*) 100/20; DescribeInstances asked without
# a filter or pagination falls in the 50/10 category, which our listing never is.
API_TABLE = ApiTable(
    apis={
        "DescribeInstances": Limit(100, 20),
        "GetConsoleOutput": Limit(100, 20),
        "DescribeInstanceTypes": Limit(100, 20),
        "CreateTags": Limit(100, 10),
        "RunInstances": Limit(5, 2),
        "TerminateInstances": Limit(100, 5),
        "CreateFleet": Limit(50, 5),
    },
    default=Limit(50, 5),  # mutating actions
    resources={"RunInstances": Limit(1000, 2), "TerminateInstances": Limit(1000, 20)},
    total=Limit(10, 40),  # at most 50 calls in any second sent (a loaded machine bunches them)
)


class Ec2(Provider):
    name = "ec2"
    launch_batch = 500
    imports_key_pair = True
    spot = True
    placements = ("cluster",)  # a cluster placement group per job
    tag_filter = True
    lists_fleet = True
    api_names = MappingProxyType({
        "launch": "RunInstances", "find": "DescribeInstances", "get": "DescribeInstances",
        "list": "DescribeInstances", "tag": "CreateTags", "terminate": "TerminateInstances",
        "host_keys": "GetConsoleOutput", "create_placement": "CreatePlacementGroup",
        "delete_placement": "DeletePlacementGroup",
    })  # fmt: skip
    host_key_sources = MappingProxyType({"console": f"{__name__}:Ec2Console"})
    host_key_reads_per_second = 10.0
    # spot instance-action, from the instance metadata service: EC2 asks for a look
    # every 5 s; the service is local to the instance: every second
    interruption_notices = ("--imds", METADATA, "--notice-interval", "1")
    standard_env = MappingProxyType({"key": "AWS_ACCESS_KEY_ID", "secret": "AWS_SECRET_ACCESS_KEY"})
    optional_env = MappingProxyType({"token": "AWS_SESSION_TOKEN"})
    file_extras = ("token",)

    def api_table(self) -> ApiTable:
        return API_TABLE

    def launch_args(
        self, driver: Any, spec: LaunchSpec, p: Placement, size: NodeSize, tags: Mapping[str, str]
    ) -> dict[str, Any]:
        from slurm_burst.adapters.cloud.profiles import user_data_args

        types: Any = importlib.import_module("libcloud.compute.drivers.ec2")  # untyped
        kw = user_data_args(driver, spec, size, tags)
        kw["ex_clienttoken"] = spec.token
        kw["ex_terminate_on_shutdown"] = True  # a node that powers itself off is gone
        if p.key_name:
            kw["ex_keyname"] = p.key_name
        if p.subnet:
            kw["ex_subnet"] = types.EC2NetworkSubnet(p.subnet, p.subnet, "available")
        if p.security_groups:
            kw["ex_security_group_ids"] = list(p.security_groups)
        if p.zone:
            region = getattr(driver, "region_name", "")
            az = types.ExEC2AvailabilityZone(p.zone, "available", region)
            kw["location"] = types.EC2NodeLocation(p.zone, p.zone, "", driver, az)
        if spec.disk_gb:
            kw["ex_blockdevicemappings"] = [{
                "DeviceName": p.root_device,
                "Ebs": {"VolumeSize": spec.disk_gb, "VolumeType": "gp3",
                        "DeleteOnTermination": "true"},
            }]  # fmt: skip
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

    def tag(self, cloud: LibcloudCloud, instance_id: str, tags: Mapping[str, str]) -> None:
        # EC2's lists are 1-based (ResourceId.1, Tag.1.Key); libcloud's ex_create_tags
        # sends 0-based ones, which not every endpoint takes
        params = {"Action": "CreateTags", "ResourceId.1": instance_id}
        for i, (k, v) in enumerate(sorted(tags.items()), start=1):
            params[f"Tag.{i}.Key"], params[f"Tag.{i}.Value"] = k, v
        cloud.driver.connection.request(cloud.driver.path, params=params)

    def list_fleet(
        self, cloud: LibcloudCloud, cluster: str, before_page: Callable[[], None]
    ) -> list[Instance]:
        """One paginated DescribeInstances filtered on the cluster tag and the state:
        ``MaxResults`` 1000 a page, ``NextToken`` to the next; ``before_page`` before each
        page (it takes the page's token from the budget). libcloud's ``list_nodes`` neither
        pages nor skips its DescribeAddresses, so the request is made here through the
        driver's own signed connection."""
        driver = cloud.driver
        base = {
            "Action": "DescribeInstances",
            "MaxResults": str(PAGE),
            "Filter.1.Name": f"tag:{CLUSTER_TAG}",
            "Filter.1.Value.1": cluster,
            "Filter.2.Name": "instance-state-name",
            **{f"Filter.2.Value.{i}": s for i, s in enumerate(LIVE_STATES, start=1)},
        }
        out: list[Instance] = []
        token = ""
        for _page in range(10_000):  # 10 million instances: a loop that cannot end is a bug
            before_page()
            params = {**base, "NextToken": token} if token else base
            obj = driver.connection.request(driver.path, params=params).object
            for rs in obj.iterfind(f"{{{NS}}}reservationSet/{{{NS}}}item"):
                out += map(cloud.to_instance, driver._to_nodes(rs, "instancesSet/item"))
            token = (obj.findtext(f"{{{NS}}}nextToken") or "").strip()
            if not token:
                break
        return [i for i in out if i.tags.get(CLUSTER_TAG) == cluster]

    def host_key_node(self, cloud: LibcloudCloud, instance_id: str, size: str) -> Node | None:
        """With the instance's size known, no describe first: one GetConsoleOutput."""
        if not size:
            return cloud.node(instance_id)
        from libcloud.compute.base import Node
        from libcloud.compute.types import NodeState

        return Node(instance_id, instance_id, NodeState.UNKNOWN, [], [], cloud.driver,
                    extra={"instance_type": size})  # fmt: skip

    def terminate(self, cloud: LibcloudCloud, instance_id: str) -> bool:
        """One TerminateInstances by id (no describe first; terminating twice is no error)."""
        params = {"Action": "TerminateInstances", "InstanceId.1": instance_id}
        cloud.driver.connection.request(cloud.driver.path, params=params)
        return True


class Ec2Console:
    """GetConsoleOutput: cloud-init's key block, the latest output where the instance
    type is on Nitro. EC2 serves the *latest* output on request only on Nitro types
    (``Latest=true``; DescribeInstanceTypes says which, asked once per type); elsewhere
    output buffered at state changes, which can lag the boot by minutes."""

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
        from libcloud.common.exceptions import BaseHTTPError
        from libcloud.common.types import LibcloudError

        from slurm_burst.adapters.cloud.attest import throttled

        with self._lock:
            if instance_type in self._nitro:
                return self._nitro[instance_type]
        params = {"Action": "DescribeInstanceTypes", "InstanceType.1": instance_type}
        try:
            obj = self.driver.connection.request(self.driver.path, params=params).object
            hypervisors = [e.text or "" for e in obj.iter(f"{{{NS}}}hypervisor")]
        except (LibcloudError, BaseHTTPError) as exc:  # e.g. not allowed by the IAM policy
            if throttled(exc):
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

    def read(self, node: Node) -> list[tuple[str, str]]:
        params = {"Action": "GetConsoleOutput", "InstanceId": str(node.id)}
        if self.nitro(str((node.extra or {}).get("instance_type") or "")):
            params["Latest"] = "true"
        obj = self.driver.connection.request(self.driver.path, params=params).object
        found = obj.find(f"{{{NS}}}output")
        encoded = (found.text or "").strip() if found is not None else ""
        text = base64.b64decode(encoded).decode("utf-8", "replace") if encoded else ""
        return parse_console_host_keys(text)


PROVIDER = Ec2()
