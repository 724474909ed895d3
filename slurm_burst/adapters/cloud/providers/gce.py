"""Google Compute Engine through libcloud's ``gce`` driver: every launch a ``bulkInsert``
(a batch, or a single node as a bulk insert of one), one fleet listing, labels for tags,
Spot VMs (``provisioningModel = SPOT``, deleted when preempted; the legacy preemptible
model where a profile asks for it), a compact placement policy per placed job, the
metadata server's preemption notices, host keys from the guest attributes or serial port
1, a service account key for credentials (docs/providers.md)."""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import TYPE_CHECKING, Any

from slurm_burst.adapters.cloud.providers import METADATA, Finding, Provider, split_endpoint
from slurm_burst.core.cloud import CLUSTER_TAG, NODE_TAG, TOKEN_TAG
from slurm_burst.core.hostkeys import (
    SERIAL_PORT_SCRIPT,
    key_entry,
    parse_console_host_keys,
)
from slurm_burst.core.ratelimit import ApiTable, Limit, Quota

if TYPE_CHECKING:
    from libcloud.compute.base import Node

    from slurm_burst.adapters.cloud.compute import LibcloudCloud
    from slurm_burst.adapters.cloud.profiles import Placement
    from slurm_burst.config.model import NodeGroup, ProviderConfig
    from slurm_burst.core.cloud import CloudError, Instance, LaunchSpec

log = logging.getLogger(__name__)

CREDENTIALS_VAR = "GOOGLE_APPLICATION_CREDENTIALS"
# Compute's instance states as libcloud's GCE driver maps them
STATES = MappingProxyType({"PROVISIONING": "pending", "STAGING": "pending", "RUNNING": "running",
                           "STOPPING": "pending", "SUSPENDED": "suspended",
                           "TERMINATED": "stopped"})  # fmt: skip
WAITS = 10  # operations.wait calls (each up to two minutes) before a launch gives up
# launch_options a GCE profile takes (every launch is a bulk insert: nothing else of
# libcloud's create_node applies): preemptible = true asks for the legacy preemptible
# model instead of Spot (a 24-hour limit, no termination action: docs/providers.md)
LAUNCH_OPTIONS = ("preemptible",)

# Compact placement policies ("Placement policies overview", Compute Engine docs, read
# 2026-11): the machine series that take one, and the most instances in one policy
# without a maxDistance; compact placement needs onHostMaintenance = TERMINATE (no live
# migration). Google adds series over time: config check warns, it does not refuse.
COMPACT_SERIES = frozenset({"a2", "c2", "c2d", "g2", "n2", "n2d"})
COMPACT_MOST = 150
IN_USE = ("resourceInUseByAnotherResource", "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE")
NOT_READY = ("resourceNotReady", "RESOURCE_NOT_READY")  # a policy still being made

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
        "zoneOperations.list": "list_requests", "globalOperations.aggregatedList": "list_requests",
        "zoneOperations.get": "operation_read_requests",
        "zoneOperations.wait": "operation_read_requests",
        "regionOperations.get": "operation_read_requests",
        "regionOperations.wait": "operation_read_requests",
    },
)  # fmt: skip


def is_zone(name: str) -> bool:
    """Whether ``name`` is a zone's (us-central1-a), not a region's (us-central1)."""
    return bool(re.fullmatch(r"[a-z]+-[a-z]+\d+-[a-z]", name))


def label(text: str) -> str:
    """A GCE label key or value: lower case letters, digits, '_' and '-', at most 63."""
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def series(machine_type: str) -> str:
    """A machine type's series: n2-standard-2 -> n2, a2-highgpu-1g -> a2."""
    return machine_type.split("-", 1)[0].lower()


def policy_name(name: str) -> str:
    """A resource policy's name for placement ``name`` (Compute's names: a lower-case
    letter, then letters, digits and '-', at most 63, not ending in '-'); the same every
    time, so that a delete names what the create made."""
    text = re.sub(r"[^a-z0-9-]", "-", name.lower())
    if not text[:1].isalpha():
        text = f"sb-{text}"
    return text[:63].rstrip("-") or "sb"


class Gce(Provider):
    name = "gce"
    spot = True  # scheduling.provisioningModel = SPOT (or preemptible, where asked)
    placements = ("compact",)  # a compact placement policy per job (resourcePolicies)
    # instance/preempted and maintenance-event, waited on (wait_for_change), not polled
    interruption_notices = ("--gce-metadata", METADATA)
    host_key_sources = MappingProxyType({
        "guest-attributes": f"{__name__}:GuestAttributes",
        "serial-port": f"{__name__}:SerialPort",
    })  # fmt: skip
    host_key_reads_per_second = 10.0
    file_extras = ("project",)
    launch_batch = 1000  # one bulkInsert (Compute takes up to 5,000 a call)
    lists_fleet = True  # booting nodes and the reconcile pass read one aggregatedList
    api_names = MappingProxyType({
        "launch": "instances.insert", "find": "instances.aggregatedList",
        "list": "instances.aggregatedList", "get": "instances.get",
        "tag": "instances.setLabels", "terminate": "instances.delete",
        "host_keys": "instances.getGuestAttributes",
        "create_placement": "resourcePolicies.insert",
        "delete_placement": "resourcePolicies.delete",
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
        out: list[Finding] = []
        if group.gpus and not (group.accelerator or group.gpu_type):
            out.append(("accelerator", "GCE needs the accelerator type for the GPUs"))
        return out

    def group_warnings(self, group: NodeGroup) -> list[Finding]:
        """What Google documents against a group's compact placement: a machine series
        that takes none, jobs larger than one policy holds."""
        out: list[Finding] = []
        if group.placement != "compact":
            return out
        other = sorted({s for s in group.sizes if series(s) not in COMPACT_SERIES})
        if other:
            out.append(("placement", f"size(s) {', '.join(other)}: Google documents compact "
                        f"placement for the {', '.join(sorted(COMPACT_SERIES))} series only; "
                        "a launch there may be refused (docs/providers.md)"))  # fmt: skip
        most = group.max_nodes or group.count
        if most > COMPACT_MOST:
            out.append(
                (
                    "placement",
                    f"a compact placement policy holds at most {COMPACT_MOST} "
                    f"instances (Google's documented limit): a job of more than "
                    f"{COMPACT_MOST} of this group's {most} nodes cannot launch placed",
                )
            )
        return out

    def profile_problems(self, prov: ProviderConfig) -> list[Finding]:
        out: list[Finding] = []
        if not prov.zone and not prov.region:
            out.append(("zone", "a GCE profile needs its zone, or a region to launch into"))
        for key in sorted(set(prov.launch_options) - set(LAUNCH_OPTIONS)):
            out.append((f"launch_options.{key}", "GCE launches are bulk inserts: launch_options "
                        f"takes only {', '.join(LAUNCH_OPTIONS)}"))  # fmt: skip
        if not isinstance(prov.launch_options.get("preemptible", False), bool):
            out.append(("launch_options.preemptible", "must be true or false"))
        endpoint = prov.options.get("endpoint")
        if endpoint is None:
            return out
        try:
            split_endpoint(str(endpoint))
        except ValueError as exc:
            out.append(("options.endpoint", str(exc)))
        return out

    def construct(
        self, cls: Any, prov: ProviderConfig, kwargs: dict[str, Any], key: str, secret: str
    ) -> Any:
        """GCENodeDriver(user_id, key, datacenter=zone, project=...) (a profile with a
        region and no zone: no default zone; its launches go to the region); with an ``endpoint``
        option, every API call and the token exchange go there instead of Google's own
        hosts (a Private Service Connect endpoint; the lab's emulator)."""
        kwargs.setdefault("datacenter", prov.zone or (prov.region if is_zone(prov.region)
                                                      else None))  # fmt: skip
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

    def metadata(self, spec: LaunchSpec, p: Placement) -> dict[str, str]:
        """The instance's metadata: its startup script, the daemon's SSH key, and where
        it will publish its host keys: the guest environment's ``hostkeys/`` guest
        attributes, or the block our startup script prints to serial port 1."""
        out = {"startup-script": spec.user_data,
               "ssh-keys": f"{p.ssh_user}:{spec.ssh_public_key.strip()}"}  # fmt: skip
        if (p.host_keys or self.default_host_key_source) == "serial-port":
            out["startup-script"] = spec.user_data + SERIAL_PORT_SCRIPT
        else:
            out["enable-guest-attributes"] = "TRUE"
        return out

    # -- bulk launches ---------------------------------------------------------------
    def launch_many(self, cloud: LibcloudCloud, spec: LaunchSpec) -> list[Instance]:
        """One bulk insert for the batch: ``instances.bulkInsert`` in the profile's zone, or
        ``regionInstances.bulkInsert`` in its region where it names none (Compute picks
        the zone that has the capacity; a whole job's nodes in one zone:
        ``targetShape = ANY_SINGLE_ZONE``). Each instance is named after its node
        (``perInstanceProperties``), ``minCount`` the fewest worth having, the launch
        token as its ``requestId`` (a repeat after a crash is the same request: nothing
        is made twice) and as a label. Waits for the operation, then lists what it made
        by that label; fewer than ``minCount``: the operation's error, typed (a capacity
        error moves the batch to the next size, as on EC2). The wait and the listings
        take their turns from their own quota groups (``cloud.turn``)."""
        from slurm_burst.adapters.cloud.profiles import tags as launch_tags
        from slurm_burst.core.cloud import CapacityError, CloudError

        names = list(spec.names) or [spec.node]
        if len(names) != spec.count:
            raise CloudError(f"{cloud.name}: {spec.count} instances asked for, "
                             f"{len(names)} names given", "InvalidParameterValue")  # fmt: skip
        scope, where = self._scope(cloud)
        labels = {label(k): label(v) for k, v in launch_tags(spec, batch=True).items()}
        least = spec.min_count or len(names)
        body: dict[str, Any] = {
            "count": str(len(names)), "minCount": str(least),
            "perInstanceProperties": {n: {} for n in names},
            "instanceProperties": self.instance_properties(cloud, spec, labels),
        }  # fmt: skip
        if scope == "regions" and least == len(names) > 1:  # a whole job: one zone
            body["locationPolicy"] = {"targetShape": "ANY_SINGLE_ZONE"}
        request_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"slurm-burst:{spec.token}"))
        op = self._bulk_insert(cloud, spec, f"/{scope}/{where}/instances/bulkInsert", body,
                               request_id)  # fmt: skip
        failure = self._outcome(cloud, scope, where, str(op["name"]))
        # what it made, by the token's label: one listing, and their places learnt with it
        made = self._aggregated(cloud, f'labels.{label(TOKEN_TAG)} = "{labels[label(TOKEN_TAG)]}"',
                                lambda: cloud.turn("instances.aggregatedList"))  # fmt: skip
        if len(made) < len(names):  # why the others were not made: their own operations
            failure = self._instance_errors(cloud, op, made) or failure
        if len(made) < least:
            if failure is not None:
                raise failure
            raise CapacityError(f"{cloud.name}: {len(made)} of {least} made", "PartialCapacity")
        return made

    def _bulk_insert(
        self, cloud: LibcloudCloud, spec: LaunchSpec, path: str, body: Mapping[str, Any], rid: str
    ) -> dict[str, Any]:
        """The bulk insert's call (the operation it started). One that names a placement
        policy Compute has not finished making (``resourceNotReady``: its insert was not
        waited for) waits for that insert, then is made again, once."""
        from libcloud.common.google import GoogleBaseError

        def post() -> dict[str, Any]:
            answer = cloud.driver.connection.request(path, method="POST", data=body,
                                                     params={"requestId": rid})  # fmt: skip
            return dict(answer.object)

        making = cloud.remembered("gce-policy-ops", dict)  # policy -> (region, its insert)
        policy = policy_name(spec.placement_group) if spec.placement_group else ""
        try:
            op = post()
        except GoogleBaseError as exc:
            if str(getattr(exc, "code", "")) not in NOT_READY or policy not in making:
                raise
            region, name = making.pop(policy)
            log.info("gce.policy_not_ready provider=%s policy=%s: waiting for its insert",
                     cloud.name, policy)  # fmt: skip
            failure = self._outcome(cloud, "regions", region, name)
            if failure is not None:
                raise failure from exc
            cloud.turn("instances.bulkInsert")
            op = post()
        making.pop(policy, None)
        return op

    def launch_one(self, cloud: LibcloudCloud, spec: LaunchSpec) -> Instance:
        """A single node: a bulk insert of one (in the zone, or the region where the
        profile names no zone), so that it asks what a batch asks (Spot, a placement
        policy: libcloud's ``insert`` knows neither)."""
        return self.launch_many(cloud, replace(spec, count=1, min_count=1, names=(spec.node,)))[0]

    def _instance_errors(
        self, cloud: LibcloudCloud, op: Mapping[str, Any], made: list[Instance]
    ) -> CloudError | None:
        """The errors of a bulk insert's instances that were not made: each its own insert
        operation, sharing the bulk operation's ``operationGroupId`` (one listing, from the
        ``list_requests`` quota); each logged, the first one's typed (a capacity code moves
        the batch on, as the bulk operation's own would). An instance that exists already
        (``RESOURCE_ALREADY_EXISTS``: a repeat) is no error."""
        from libcloud.common.types import LibcloudError

        from slurm_burst.core.cloud import CODES, CloudError

        group = str(op.get("operationGroupId") or "")
        if not group:
            return None
        cloud.turn("globalOperations.aggregatedList")
        try:
            listed = cloud.driver.connection.request(
                "/aggregated/operations", method="GET",
                params={"filter": f'operationGroupId = "{group}"', "maxResults": 500},
            ).object  # fmt: skip
        except (LibcloudError, OSError) as exc:  # the batch's outcome stands without them
            log.warning("gce.instance_errors provider=%s group=%s error=%s", cloud.name, group,
                        str(exc)[:200])  # fmt: skip
            return None
        have = {i.name for i in made}
        first: CloudError | None = None
        ops = [o for scoped in (listed.get("items") or {}).values()
               for o in scoped.get("operations") or []]  # fmt: skip
        for item in ops:
            name = str(item.get("targetLink", "")).rsplit("/", 1)[-1]
            errors = ((item.get("error") or {}).get("errors")) or []
            codes = [str(e.get("code", "")) for e in errors if e.get("code")]
            if name in have or not codes or codes == ["RESOURCE_ALREADY_EXISTS"]:
                continue
            text = str(errors[0].get("message", ""))[:300]
            log.warning("gce.instance_not_made provider=%s instance=%s code=%s error=%s",
                        cloud.name, name, codes[0], text)  # fmt: skip
            if first is None:
                first = CODES.get(codes[0], CloudError)(f"{cloud.name}: {name}: {text}", codes[0])
        return first

    def instance_properties(
        self, cloud: LibcloudCloud, spec: LaunchSpec, labels: Mapping[str, str]
    ) -> dict[str, Any]:
        """A bulk insert's ``instanceProperties``: what ``launch_args`` asks of a single
        ``create_node``, in Compute's own terms."""
        p = cloud.placement
        init: dict[str, Any] = {"sourceImage": self._image(cloud, spec.image)}
        if spec.disk_gb:
            init["diskSizeGb"] = str(spec.disk_gb)
        nic: dict[str, Any] = {
            "network": f"global/networks/{p.network or 'default'}",
            "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}],
        }
        if p.subnet:
            nic["subnetwork"] = f"regions/{self._region(cloud)}/subnetworks/{p.subnet}"
        props: dict[str, Any] = {
            "machineType": spec.size,
            "disks": [{"boot": True, "autoDelete": True, "type": "PERSISTENT",
                       "mode": "READ_WRITE", "initializeParams": init}],
            "networkInterfaces": [nic],
            "metadata": {"items": [{"key": k, "value": v}
                                   for k, v in self.metadata(spec, p).items()]},
            "labels": dict(labels),
        }  # fmt: skip
        if p.security_groups:
            props["tags"] = {"items": list(p.security_groups)}
        scheduling: dict[str, Any] = {}
        if spec.gpus:
            props["guestAccelerators"] = [{"acceleratorType": spec.accelerator,
                                           "acceleratorCount": spec.gpus}]  # fmt: skip
        if spec.gpus or spec.spot or spec.placement_group:  # none of them migrates
            scheduling.update(onHostMaintenance="TERMINATE", automaticRestart=False)
        if spec.spot and p.extra.get("preemptible"):  # the legacy model, where asked
            scheduling["preemptible"] = True
        elif spec.spot:  # reclaimed: deleted, as a released node's instance would be
            scheduling.update(provisioningModel="SPOT", instanceTerminationAction="DELETE")
        if scheduling:
            props["scheduling"] = scheduling
        if spec.placement_group:
            props["resourcePolicies"] = [
                f"regions/{self._region(cloud)}/resourcePolicies/{policy_name(spec.placement_group)}"
            ]
        return props

    # -- compact placement policies -----------------------------------------------------
    def create_placement(self, cloud: LibcloudCloud, name: str) -> None:
        """A compact placement policy (``resourcePolicies.insert``, collocation
        COLLOCATED) in the profile's region, named after ``name``, its ``requestId`` the
        name's (a repeat is the same request). Not waited for: Compute makes a policy in
        moments, and the launch that names it follows at once; the rare launch that comes
        first (``resourceNotReady``) waits for the insert then (:meth:`_bulk_insert`), so
        a placement costs a job two calls, its insert and its delete. ExistsError if it
        was made already."""
        from libcloud.common.google import ResourceExistsError

        from slurm_burst.core.cloud import ExistsError

        region = self._region(cloud)
        body = {"name": policy_name(name), "description": "slurm-burst: one job's nodes",
                "groupPlacementPolicy": {"collocation": "COLLOCATED"}}  # fmt: skip
        rid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"slurm-burst:placement:{name}"))
        try:
            op = cloud.driver.connection.request(
                f"/regions/{region}/resourcePolicies", method="POST", data=body,
                params={"requestId": rid},
            ).object  # fmt: skip
        except ResourceExistsError as exc:
            raise ExistsError(f"{cloud.name}: placement policy {body['name']} exists") from exc
        if op.get("status") != "DONE":  # waited for only by a launch that finds it not ready
            cloud.remembered("gce-policy-ops", dict)[body["name"]] = (region, str(op["name"]))

    def delete_placement(self, cloud: LibcloudCloud, name: str) -> None:
        """``resourcePolicies.delete`` (not waited for); NotFoundError if it is gone,
        InUseError while an instance still names it (Compute refuses the delete)."""
        from libcloud.common.google import GoogleBaseError, ResourceNotFoundError

        from slurm_burst.core.cloud import InUseError, NotFoundError

        where = f"/regions/{self._region(cloud)}/resourcePolicies/{policy_name(name)}"
        try:
            cloud.driver.connection.request(where, method="DELETE")
        except ResourceNotFoundError as exc:
            raise NotFoundError(f"{cloud.name}: {where}: gone") from exc
        except GoogleBaseError as exc:
            if str(getattr(exc, "code", "")) in IN_USE:
                raise InUseError(f"{cloud.name}: {where}: in use", str(exc.code)) from exc
            raise

    @staticmethod
    def instance_of(provider: str, doc: Mapping[str, Any]) -> Instance:
        """Our :class:`Instance` of Compute's instance resource (as libcloud's GCE
        driver maps its states: PROVISIONING and STAGING pending, TERMINATED stopped).
        An instance is named after its node at launch: that name is its node tag."""
        from slurm_burst.core.cloud import Instance

        nics = doc.get("networkInterfaces") or []
        tags = {str(k): str(v) for k, v in (doc.get("labels") or {}).items()}
        tags.setdefault(NODE_TAG, str(doc["name"]))
        return Instance(
            id=str(doc["id"]), name=str(doc["name"]),
            state=STATES.get(str(doc.get("status")), "unknown"), provider=provider,
            size=str(doc.get("machineType", "")).rsplit("/", 1)[-1],
            public_ips=tuple(ac["natIP"] for n in nics for ac in n.get("accessConfigs") or []
                             if ac.get("natIP")),
            private_ips=tuple(n["networkIP"] for n in nics if n.get("networkIP")),
            tags=tags,
        )  # fmt: skip

    # -- the fleet, read once for all --------------------------------------------------
    def list_fleet(
        self, cloud: LibcloudCloud, cluster: str, before_page: Callable[[], None]
    ) -> list[Instance]:
        """One ``instances.aggregatedList`` filtered on the cluster's label, 500 a page,
        ``before_page`` before each (it takes the page's turn from the quota): every zone
        at once, no disk listing (libcloud's ``list_nodes`` adds one), and where each
        instance is, for the host-key reads and teardowns that follow."""
        wanted = f'labels.{label(CLUSTER_TAG)} = "{label(cluster)}"'
        out = self._aggregated(cloud, wanted, before_page)
        return [i for i in out if i.tags.get(CLUSTER_TAG) == label(cluster)]

    def _aggregated(
        self, cloud: LibcloudCloud, wanted: str, before_page: Callable[[], None] = lambda: None
    ) -> list[Instance]:
        conn = cloud.driver.connection
        places = cloud.remembered("gce-places", dict)  # instance id -> (zone, name)
        out: list[Instance] = []
        token = ""
        for _page in range(20_000):  # 10 million instances: a loop that cannot end is a bug
            before_page()
            params: dict[str, Any] = {"filter": wanted, "maxResults": 500}
            if token:
                params["pageToken"] = token
            page = conn.request("/aggregated/instances", method="GET", params=params).object
            for scope, found in (page.get("items") or {}).items():
                for doc in found.get("instances") or []:
                    inst = self.instance_of(cloud.name, doc)
                    places[inst.id] = (scope.rsplit("/", 1)[-1], inst.name)
                    out.append(inst)
            token = str(page.get("nextPageToken") or "")
            if not token:
                break
        return out

    def _place(self, cloud: LibcloudCloud, instance_id: str) -> tuple[str, str] | None:
        """Where instance ``instance_id`` is (zone, name): from the last listing, else
        one listing filtered on its id (not libcloud's every instance and disk)."""
        places = cloud.remembered("gce-places", dict)
        if instance_id not in places:
            self._aggregated(cloud, f'id = "{instance_id}"')
        return places.get(instance_id)  # type: ignore[no-any-return]

    def host_key_node(self, cloud: LibcloudCloud, instance_id: str, size: str) -> Node | None:
        """What the host-key readers need of the instance (its zone and name), without a
        lookup when the fleet listing has seen it."""
        from libcloud.compute.base import Node
        from libcloud.compute.types import NodeState

        place = self._place(cloud, instance_id)
        if place is None:
            return None
        zone, name = place
        return Node(instance_id, name, NodeState.UNKNOWN, [], [], cloud.driver,
                    extra={"zone": SimpleNamespace(name=zone), "name": name})  # fmt: skip

    def terminate(self, cloud: LibcloudCloud, instance_id: str) -> bool:
        """``instances.delete`` by the instance's zone and name; the operation is not
        waited for (the listing shows the instance going); False if it was gone."""
        from libcloud.common.google import ResourceNotFoundError

        place = self._place(cloud, instance_id)
        if place is None:
            return False
        zone, name = place
        try:
            cloud.driver.connection.request(f"/zones/{zone}/instances/{name}", method="DELETE")
        except ResourceNotFoundError:
            return False
        cloud.remembered("gce-places", dict).pop(instance_id, None)
        return True

    def _region(self, cloud: LibcloudCloud) -> str:
        """The region launches go to (a resource policy's, a subnetwork's)."""
        scope, where = self._scope(cloud)
        return where if scope == "regions" else where.rsplit("-", 1)[0]

    def _scope(self, cloud: LibcloudCloud) -> tuple[str, str]:
        """Where a launch goes: ("zones", the profile's zone), else ("regions", its region)."""
        p = cloud.placement
        zone = p.zone or getattr(getattr(cloud.driver, "zone", None), "name", "") or (
            p.region if is_zone(p.region) else "")  # fmt: skip
        if zone:
            return "zones", str(zone)
        if p.region:
            return "regions", p.region
        from slurm_burst.core.cloud import CloudError

        raise CloudError(f"{cloud.name}: a GCE profile needs its zone or region",
                         "InvalidParameterValue")  # fmt: skip

    def _image(self, cloud: LibcloudCloud, image: str) -> str:
        """The image's self link, looked up once (as the single launch's libcloud does:
        the project's own images, then Google's public image projects)."""
        if image.startswith(("https://", "projects/", "global/")):
            return image

        def look_up() -> str:
            return str(cloud.driver.ex_get_image(image).extra["selfLink"])

        return str(cloud.remembered(f"gce-image:{image}", look_up))

    def _outcome(self, cloud: LibcloudCloud, scope: str, where: str, name: str
                 ) -> CloudError | None:  # fmt: skip
        """Wait for operation ``name`` (Compute's ``wait``, two minutes a call at most);
        its error, typed, or None."""
        from libcloud.common.google import GoogleBaseError

        from slurm_burst.core.cloud import CloudError

        conn = cloud.driver.connection
        api = "zoneOperations.wait" if scope == "zones" else "regionOperations.wait"
        for _ in range(WAITS):
            cloud.turn(api)
            try:
                op = conn.request(f"/{scope}/{where}/operations/{name}/wait", method="POST",
                                  data={}).object  # fmt: skip
            except GoogleBaseError as exc:  # libcloud raises on an operation's error
                return cloud.error_of(exc)
            if op.get("status") == "DONE":
                return None
        return CloudError(f"{cloud.name}: operation {name} not done after {WAITS} waits",
                          "OperationTimeout")  # fmt: skip


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
