"""Microsoft Azure through libcloud's ``azure_arm`` driver's connection: every launch a
scale-out of a Flexible scale set (:mod:`.sets`), one fleet view per set, ARM's
request limits read from every answer, host keys from the boot diagnostics serial log,
a service principal for credentials (docs/providers.md). Spot (libcloud 3.9's driver
has none) through the sets' ``priority``, a Spot set apart from an on-demand one;
Scheduled Events (``Preempt``...) read by the node agent; a placed job's own set, a
Uniform one for InfiniBand or a Flexible one in a proximity placement group."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from slurm_burst.adapters.cloud.providers import Finding, Provider, split_endpoint
from slurm_burst.adapters.cloud.providers.azure_arm import sets, uniform
from slurm_burst.adapters.cloud.providers.azure_arm.connection import arm_connection
from slurm_burst.core.cloud import (
    CLUSTER_TAG,
    GROUP_TAG,
    SPOT_WAIT_CODE,
    TOKEN_TAG,
    CapacityError,
    CloudError,
    InUseError,
    NotFoundError,
    QuotaError,
)
from slurm_burst.core.ratelimit import ApiTable, Limit

if TYPE_CHECKING:
    from libcloud.compute.base import Node

    from slurm_burst.adapters.cloud.compute import LibcloudCloud
    from slurm_burst.config.model import NodeGroup, ProviderConfig
    from slurm_burst.core.cloud import Instance, LaunchSpec

log = logging.getLogger(__name__)

VM_API = sets.COMPUTE_API
EMPTY_AFTER = 600.0  # seconds an empty scale set is kept after its last launch
METADATA = "http://169.254.169.254"  # the instance metadata service (IMDS), in the VM

# ARM's buckets per subscription and principal ("Understand how Azure Resource Manager
# throttles requests", read 2026-11): reads 250 refilled at 25 a second, writes (PUT,
# PATCH, POST) and deletes 200 at 10. Every request of the provider's connection takes
# a token of its kind (BudgetMeter); our own calls (launch, list...) are not limited
# apart. Every answer says what is left (x-ms-ratelimit-remaining-subscription-*), and
# our bucket never holds more than that: other tools spend the subscription's too.
API_TABLE = ApiTable(
    apis={"reads": Limit(250, 25), "writes": Limit(200, 10), "deletes": Limit(200, 10)},
    default=Limit(0, 0),  # our calls: paced by the requests they make
    resources={},
)


class AzureArm(Provider):
    name = "azure_arm"
    launch_batch = sets.SET_MOST  # one scale-out (a set holds 1,000 VMs)
    # a Uniform scale set per job, one placement group: its InfiniBand fabric (uniform.py)
    placements = ("infiniband", "proximity")
    spot = True  # priority = Spot, evictionPolicy = Delete (sets.profile_body)
    # Scheduled Events in the instance metadata service (Preempt, Terminate, Reboot,
    # Redeploy), polled by the node agent and acknowledged once handled
    interruption_notices = ("--azure-metadata", METADATA, "--notice-interval", "1")
    lists_fleet = True  # one listing per scale set, shared
    host_key_sources = MappingProxyType(
        {"boot-diagnostics": f"{__name__}.hostkeys:BootDiagnostics"}
    )
    # (this default is not used: ARM's table paces each request of a read, a managed
    # log's address being an ARM POST from the writes bucket, a blob read not ARM's; a
    # profile's own host_key_reads_per_second paces the reads as a whole)
    host_key_reads_per_second = 2.0
    standard_env = MappingProxyType(
        {
            "key": "AZURE_CLIENT_ID",
            "secret": "AZURE_CLIENT_SECRET",
            "tenant_id": "AZURE_TENANT_ID",
            "subscription_id": "AZURE_SUBSCRIPTION_ID",
        }
    )
    file_extras = ("tenant_id", "subscription_id")

    def api_table(self) -> ApiTable:
        return API_TABLE

    def budget_scope(self, prov: ProviderConfig) -> tuple[str, ...]:
        """ARM limits a subscription's requests per principal: every profile with the same
        credentials (a principal and its subscription) and endpoint shares one budget,
        whatever its region or resource group."""
        creds = prov.credentials
        return (
            prov.driver,
            (creds.file or creds.key_env) if creds else "",
            str(prov.options.get("endpoint", "")),
        )

    def profile_problems(self, prov: ProviderConfig) -> list[Finding]:
        out: list[Finding] = [
            (key, "azure_arm needs it")
            for key in ("resource_group", "network", "region")
            if not getattr(prov, key)
        ]
        if prov.zone and prov.zone not in ("1", "2", "3") and prov.zone != prov.region:
            out.append(("zone", "an Azure availability zone: 1, 2 or 3 (or none: regional)"))
        for key in sorted(prov.launch_options):
            out.append(
                (
                    f"launch_options.{key}",
                    "Azure launches are scale-outs of a scale set: launch_options takes nothing",
                )
            )
        for key in ("endpoint", "boot_diagnostics_storage"):
            if prov.options.get(key) is not None:
                try:
                    split_endpoint(str(prov.options[key]).rstrip("/"))
                except ValueError as exc:
                    out.append((f"options.{key}", str(exc)))
        ca_file = prov.options.get("ca_file")
        if ca_file is not None and not str(ca_file).startswith("/"):
            out.append(("options.ca_file", "an absolute path to a PEM CA bundle"))
        admin = prov.options.get("admin_user")
        if admin is not None and (
            not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,63}", str(admin))
            or str(admin).lower() in sets.RESERVED_USERS
        ):
            out.append(("options.admin_user", "a Linux user name Azure allows as the VMs' "
                        "admin (not root, admin, ...)"))  # fmt: skip
        storage = prov.options.get("boot_diagnostics_storage")
        sas_env = prov.options.get("boot_diagnostics_sas_env")
        if bool(storage) != bool(sas_env):
            out.append(("options.boot_diagnostics_sas_env", "boot_diagnostics_storage and "
                        "boot_diagnostics_sas_env go together (the storage account, and the "
                        "variable holding its read-only SAS)"))  # fmt: skip
        elif sas_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(sas_env)):
            out.append(("options.boot_diagnostics_sas_env", "an environment variable's name"))
        return out

    def group_warnings(self, group: NodeGroup) -> list[Finding]:
        """An RDMA size in Flexible sets (no InfiniBand there, in a proximity placement
        group either), and "infiniband" for sizes that have none."""
        rdma = sorted(s for s in group.sizes if uniform.needs_infiniband(s.split(":")[-1]))
        if rdma and group.placement != "infiniband":
            return [("placement", f"size(s) {', '.join(rdma)} have InfiniBand, which "
                     "Flexible scale sets do not give: set placement = \"infiniband\" (a "
                     "Uniform set per job, as CycleCloud does)")]  # fmt: skip
        plain = sorted(s for s in group.sizes if not uniform.needs_infiniband(s.split(":")[-1]))
        if group.placement == "infiniband" and plain:
            return [("placement", f"size(s) {', '.join(plain)} have no InfiniBand: a Uniform "
                     "set per job gives them nothing a Flexible set would not")]  # fmt: skip
        return []

    def group_problems(self, group: NodeGroup) -> list[Finding]:
        if not group.image.startswith("/subscriptions/") and (
            group.image.count(":") != 3 or not all(group.image.split(":"))
        ):
            return [
                (
                    "image",
                    "azure_arm needs a URN PUBLISHER:OFFER:SKU:VERSION or an image's resource id",
                )
            ]
        return []

    def construct(
        self, cls: Any, prov: ProviderConfig, kwargs: dict[str, Any], key: str, secret: str
    ) -> Any:
        """AzureNodeDriver(tenant_id, subscription_id, key, secret, region=...), its
        connection one that paces and reads every request (:func:`arm_connection`); with
        an ``endpoint`` option, ARM and the token exchange go there (the lab's emulator,
        an Azure Stack Hub's)."""
        tenant, subscription = kwargs.pop("tenant_id", ""), kwargs.pop("subscription_id", "")
        endpoint = kwargs.pop("endpoint", None)
        admin = str(kwargs.pop("admin_user", "") or sets.ADMIN_USER)
        ca_file = str(kwargs.pop("ca_file", "") or "")
        storage = str(kwargs.pop("boot_diagnostics_storage", "") or "")
        sas = ""
        sas_env = str(kwargs.pop("boot_diagnostics_sas_env", "") or "")
        if storage:
            import os

            from slurm_burst.adapters.cloud.credentials import CredentialsError

            sas = os.environ.get(sas_env, "")
            if not sas:
                raise CredentialsError(
                    f"provider {prov.name}: boot_diagnostics_storage needs a read-only "
                    f"account SAS in ${sas_env or '(boot_diagnostics_sas_env not set)'}"
                )
        if prov.region:
            kwargs.setdefault("region", prov.region)
        cls = type(
            f"{cls.__name__}Metered",
            (cls,),
            {"connectionCls": arm_connection(cls.connectionCls, str(endpoint or ""), ca_file)},
        )
        from libcloud.common.exceptions import BaseHTTPError
        from libcloud.common.types import LibcloudError

        from slurm_burst.core.cloud import AuthError, CloudError

        try:  # libcloud's driver logs in as it is made
            driver = cls(tenant, subscription, key, secret, **kwargs)
        except (LibcloudError, BaseHTTPError, OSError) as exc:
            kind = AuthError if getattr(exc, "code", None) in (400, 401, 403) else CloudError
            raise kind(f"provider {prov.name}: cannot log in to Azure at "
                       f"{endpoint or 'login.microsoftonline.com'}: {exc}", "AuthFailure"
                       if kind is AuthError else "LoginFailed") from None  # fmt: skip
        driver.boot_diagnostics_storage, driver.boot_diagnostics_sas = storage, sas
        driver.admin_user, driver.ca_file = admin, ca_file
        return driver

    def watch(self, cloud: LibcloudCloud) -> None:
        conn = getattr(cloud.driver, "connection", None)
        if conn is not None and hasattr(type(conn), "meter_of"):
            conn.meter_of = lambda: cloud.meter

    # -- launches -----------------------------------------------------------------------
    def launch_one(self, cloud: LibcloudCloud, spec: LaunchSpec) -> Instance:
        """A single node: a scale-out of one."""
        from dataclasses import replace

        return self.launch_many(cloud, replace(spec, count=1, names=(spec.node,)))[0]

    def launch_many(self, cloud: LibcloudCloud, spec: LaunchSpec) -> list[Instance]:
        """One scale-out of the group's set for the size and market (:mod:`.sets`), or of
        a placed job's own set (a Uniform one for InfiniBand, :mod:`.uniform`; a
        Flexible one in the job's proximity placement group). A Spot launch's capacity
        that has not come within ``spec.spot_wait`` is given up (its VMs deleted,
        ``SpotCapacityWait``), and a Spot quota is a refusal like any other: both move
        the launch to the group's on-demand fallback at once (:func:`spot_refusal`)."""

        from libcloud.common.exceptions import BaseHTTPError

        names = list(spec.names) or [spec.node]
        n = len(names)
        if n != spec.count or n > sets.SET_MOST:
            raise CloudError(
                f"{cloud.name}: {spec.count} VMs asked for, {n} names given "
                f"(at most {sets.SET_MOST} a launch)",
                "InvalidParameterValue",
            )
        try:
            return self._launch_many(cloud, spec, names)
        except BaseHTTPError as exc:  # the scale-out's PUT refused (a quota: at once)
            raise spot_refusal(spec, cloud.error_of(exc)) from exc
        except CloudError as exc:
            raise spot_refusal(spec, exc) from exc

    def _launch_many(
        self, cloud: LibcloudCloud, spec: LaunchSpec, names: list[str]
    ) -> list[Instance]:
        from slurm_burst.adapters.cloud.profiles import tags as launch_tags

        n = len(names)
        arm, bk = sets.Arm(cloud), sets.book(cloud)
        if spec.placement_group and spec.placement_kind != "proximity":
            # one job on one InfiniBand fabric: its Uniform set
            made_u = uniform.launch(cloud, spec, launch_tags(spec, True))
            uniform.addresses(arm, job_set_path(cloud, spec.placement_group, spec.spot))
            return uniform.instances(cloud, made_u, {CLUSTER_TAG: spec.cluster,
                                                     GROUP_TAG: spec.group,
                                                     TOKEN_TAG: spec.token})  # fmt: skip
        least = spec.min_count or n
        tags = {CLUSTER_TAG: spec.cluster, GROUP_TAG: spec.group}
        ppg = ""
        if spec.placement_group:  # one job in one proximity placement group: its own set
            ppg = self._ppg(arm, bk, spec)
            candidates = [sets.job_set(spec.placement_group, spec.spot)]
        else:
            base = sets.set_base(spec.cluster, spec.group, spec.size, spec.spot)
            candidates = [f"{base}-{number}" for number in range(1, 1000)]
        for name in candidates:
            with bk.lock(name):
                got = self._scale_out(cloud, arm, bk, name, spec, tags, launch_tags(spec, True),
                                      ppg)  # fmt: skip
            if got is None:
                continue  # that set is full: the next one (a job's own set is never full)
            made, failure = got
            if len(made) < least or _withheld(failure):
                for vm in made:  # never a scale-in by count: each VM by name
                    self._delete(arm, str(vm["name"]))
                if failure is not None:
                    raise failure
                raise CapacityError(f"{cloud.name}: {len(made)} of {least} made", "PartialCapacity")
            for vm in made[n:]:  # more than asked (a repeat that found more): not ours
                self._delete(arm, str(vm["name"]))
            self._addresses(cloud, arm, bk)
            return [
                sets.instance_of(
                    cloud.name, vm, bk.addresses, {**tags, TOKEN_TAG: spec.token}
                )._replace(launch_index=i)
                for i, vm in enumerate(made[:n])
            ]
        raise CloudError(f"{cloud.name}: no scale set of {base} has room", "InvalidParameterValue")

    def _scale_out(
        self,
        cloud: LibcloudCloud,
        arm: sets.Arm,
        bk: sets.SetBook,
        name: str,
        spec: LaunchSpec,
        tags: Mapping[str, str],
        launch_tags: Mapping[str, str],
        ppg: str = "",
    ) -> tuple[list[dict[str, Any]], Any] | None:
        """Scale set ``name`` out by the launch's VMs (the set's lock held): the VMs it
        made, oldest first, and the operation's error (typed) if it failed; None if the
        set has no room for them."""
        n = len(spec.names) or 1
        current = arm.get(arm.compute("virtualMachineScaleSets", name))
        token, began = sets.scaleout_mark(current)
        repeat = token == spec.token
        held = bk.inflight.get(name)
        before_names: frozenset[str] | None = held[1] if held and held[0] == spec.token else None
        if current is not None and not repeat:
            before = self._set_vms(arm, current["id"])
            if len(before) + n > sets.SET_MOST:
                return None
            before_names = frozenset(str(v["name"]) for v in before)
        elif current is None:
            before_names = frozenset()
        started = time.time()
        if repeat:  # when the first began (a tag someone edited: no VM counts as made)
            started = began if began is not None else float("inf")
        target = len(before_names or ()) + n
        body = sets.profile_body(
            cloud,
            spec,
            target,
            {
                **tags,
                **{k: v for k, v in launch_tags.items() if k != TOKEN_TAG},
                sets.SCALEOUT_TAG: f"{spec.token} {started:.3f}",
            },
            ppg=ppg,
        )
        op: dict[str, Any] = {"status": "Succeeded"}
        bk.inflight[name] = (spec.token, before_names or frozenset())
        try:
            if not repeat:  # a repeat sends nothing: the first made what it made
                resp = arm.request(arm.compute("virtualMachineScaleSets", name), "PUT", body)
                op = arm.wait(resp, sets.launch_wait(spec))
            else:
                op = self._settle(arm, name, sets.launch_wait(spec))
            after = self._set_vms(arm, arm.compute("virtualMachineScaleSets", name))
        finally:
            bk.inflight.pop(name, None)
        if before_names is not None:
            made = [v for v in after if str(v["name"]) not in before_names]
        else:  # a repeat after a restart: the VMs made since the launch began
            made = [v for v in after if sets.created(v) >= started - 1.0]
        made.sort(key=lambda v: (sets.created(v), str(v["name"])))
        failure = None
        if op.get("status") in ("InProgress", "Creating", "Updating"):  # waited spot_wait
            failure = sets.spot_waited(cloud, spec)
        elif op.get("status") != "Succeeded":
            failure = sets.op_error(cloud, op)
        log.info(
            "azure.scale_out set=%s token=%s asked=%d made=%d status=%s",
            name,
            spec.token,
            n,
            len(made),
            op.get("status"),
        )
        return made, failure

    def _settle(self, arm: sets.Arm, name: str, most: float) -> dict[str, Any]:
        """A repeated launch: wait (``most`` s at most) until the set's last operation is
        over (its provisioning state no longer Creating or Updating)."""
        path = arm.compute("virtualMachineScaleSets", name)
        doc = arm.poll(lambda: dict(arm.request(path).object or {}),
                       lambda d: _provisioning(d) not in ("Creating", "Updating"),
                       most)  # fmt: skip
        state = _provisioning(doc)
        return {"status": "Succeeded" if state == "Succeeded" else state}

    def _set_vms(
        self, arm: sets.Arm, set_id: str, before_page: Callable[[], None] = lambda: None
    ) -> list[dict[str, Any]]:
        """The set's VMs with their instance views: one filtered listing, in pages; each
        VM's serial log blob noted where the instance view names one (the site's storage
        account)."""
        vms = arm.pages(
            arm.compute("virtualMachines"),
            {
                "api-version": VM_API,
                "$filter": f"'virtualMachineScaleSet/id' eq '{set_id}'",
                "$expand": "instanceView",
            },
            before_page,
        )
        sets.note_logs(arm.cloud, vms)
        return vms

    def _addresses(
        self,
        cloud: LibcloudCloud,
        arm: sets.Arm,
        bk: sets.SetBook,
        before_page: Callable[[], None] = lambda: None,
    ) -> None:
        """The resource group's network interfaces, listed once: each VM's private IP."""
        nics = arm.pages(
            f"{arm.rg}/providers/Microsoft.Network/networkInterfaces",
            {"api-version": sets.NETWORK_API},
            before_page,
        )
        found = sets.nic_addresses(nics)
        kept = {k: v for k, v in bk.addresses.items() if "/virtualmachinescalesets/" in k}
        bk.addresses = kept | found  # (a Uniform set's VMs: their set's own NICs)

    def find(self, cloud: LibcloudCloud, token: str, cluster: str) -> list[Instance]:
        """Nothing: a repeat of the launch (same token) sends no second scale-out and
        returns what the first made (:meth:`launch_many`)."""
        return []

    # -- the fleet ----------------------------------------------------------------------
    def list_fleet(
        self, cloud: LibcloudCloud, cluster: str, before_page: Callable[[], None]
    ) -> list[Instance]:
        """The cluster's scale sets (one listing of the resource group's sets), each
        set's VMs (one filtered listing with instance views), the resource group's
        network interfaces (one listing, only while a VM's address is not known yet: it
        never changes); an empty set whose last launch is
        :data:`EMPTY_AFTER` s old is deleted here (the reconcile pass reads this)."""
        arm, bk = sets.Arm(cloud), sets.book(cloud)
        before_page()
        found = arm.request(arm.compute("virtualMachineScaleSets")).object or {}
        ours = [
            s for s in found.get("value") or [] if (s.get("tags") or {}).get(CLUSTER_TAG) == cluster
        ]
        vms: list[tuple[dict[str, Any], dict[str, str]]] = []
        for s in ours:
            name = str(s["name"])
            tags = {CLUSTER_TAG: cluster, GROUP_TAG: str(s["tags"].get(GROUP_TAG, ""))}
            if (s.get("properties") or {}).get("orchestrationMode") == "Uniform":
                mark = sets.scaleout_mark(s)[0]
                held_by = {**tags, TOKEN_TAG: mark} if mark else tags  # the job's launch
                found_u = uniform.members(arm, str(s["id"]), before_page)
                if any(str(v["id"]).lower() not in bk.addresses for v in found_u):
                    uniform.addresses(arm, str(s["id"]), before_page)
                vms += [(vm, dict(held_by)) for vm in found_u]
                continue
            members = self._set_vms(arm, str(s["id"]), before_page)
            held = bk.inflight.get(name)
            for vm in members:
                own = dict(tags)
                if held is not None and str(vm["name"]) not in held[1]:
                    own[TOKEN_TAG] = held[0]  # a launch in flight made it: its node's
                vms.append((vm, own))
            if not members:
                self._drop_if_idle(arm, bk, s)
        flexible = [vm for vm, _ in vms if str(vm["name"]) not in bk.uniform]
        if any(str(vm.get("id", "")).lower() not in bk.addresses for vm in flexible):
            self._addresses(cloud, arm, bk, before_page)  # a VM's address never changes
        out = [sets.instance_of(cloud.name, vm, bk.addresses, tags) for vm, tags in vms]
        return [i for i in out if i.state != "terminated"]

    def _drop_if_idle(self, arm: sets.Arm, bk: sets.SetBook, s: Mapping[str, Any]) -> None:
        name = str(s["name"])
        last = sets.scaleout_mark(s)[1] or 0.0
        if time.time() - last < EMPTY_AFTER:
            return
        lock = bk.lock(name)
        if not lock.acquire(blocking=False):
            return  # a launch is using it
        try:
            if self._set_vms(arm, str(s["id"])):
                return
            arm.request(arm.compute("virtualMachineScaleSets", name), "DELETE")
            log.info("azure.scale_set_deleted set=%s", name)
        finally:
            lock.release()

    def host_key_node(self, cloud: LibcloudCloud, instance_id: str, size: str) -> Node | None:
        """The VM by its resource id (what the boot diagnostics reader asks for)."""
        from libcloud.compute.base import Node
        from libcloud.compute.types import NodeState

        arm = sets.Arm(cloud)
        path = instance_id
        if not instance_id.startswith("/subscriptions/"):  # a VM's name: its id in its set
            path = arm.compute("virtualMachines", instance_id)
        name = instance_id.rsplit("/", 1)[-1]
        path = sets.book(cloud).uniform.get(name, path)  # a Uniform set's VM: through it
        log_uri = sets.book(cloud).logs.get(name, "")
        return Node(path, name, NodeState.UNKNOWN, [], [], cloud.driver,
                    extra={"serial_log": log_uri})  # fmt: skip

    def terminate(self, cloud: LibcloudCloud, instance_id: str) -> bool:
        """``DELETE`` the VM by name (its NIC and OS disk go with it: ``deleteOption``);
        the operation is not waited for. False if it was gone."""
        return self._delete(sets.Arm(cloud), instance_id)

    def _delete(self, arm: sets.Arm, name: str) -> bool:
        """Delete VM ``name``: a Flexible set's by name, a Uniform set's through its set
        (known from a listing, or tried once a Flexible delete finds no such VM)."""
        from libcloud.common.exceptions import BaseHTTPError

        bk = sets.book(arm.cloud)
        bk.logs.pop(name, None)
        if name in bk.uniform:
            return bool(uniform.delete(arm, name))
        try:
            arm.request(arm.compute("virtualMachines", name), "DELETE")
        except BaseHTTPError as exc:
            if exc.code == 404:
                return bool(uniform.delete(arm, name))
            raise
        return True

    # -- a job's placement: its own set (InfiniBand: Uniform; proximity: Flexible) ------
    def _ppg(self, arm: sets.Arm, bk: sets.SetBook, spec: LaunchSpec) -> str:
        """The job's proximity placement group, made once (a ``PUT``: the same again
        changes nothing), in the profile's zone or none; its id."""
        name = sets.ppg_name(spec.placement_group)
        path = arm.compute("proximityPlacementGroups", name)
        if name not in bk.ppgs:
            p = arm.cloud.placement
            body: dict[str, Any] = {
                "location": p.region,
                "tags": {CLUSTER_TAG: spec.cluster, GROUP_TAG: spec.group},
                "properties": {"proximityPlacementGroupType": "Standard"},
            }
            if p.zone in ("1", "2", "3"):  # one zone, fixed once made
                body["zones"] = [p.zone]
            arm.request(path, "PUT", body)
            bk.ppgs.add(name)
        return path

    def create_placement(self, cloud: LibcloudCloud, name: str) -> None:
        """Nothing to make beforehand: the job's launch makes its set (and its
        proximity placement group)."""

    def delete_placement(self, cloud: LibcloudCloud, name: str) -> None:
        """Delete the job's sets (on-demand and Spot) once they hold no VM, then its
        proximity placement group: NotFoundError if all are gone, InUseError while a VM
        is still in a set or the group is still referenced (the next reconcile pass
        tries again)."""
        from libcloud.common.exceptions import BaseHTTPError

        arm, bk = sets.Arm(cloud), sets.book(cloud)
        found = False
        for spot in (False, True):
            path = job_set_path(cloud, name, spot)
            doc = arm.get(path)
            if doc is None:
                continue
            found = True
            uniform_set = (doc.get("properties") or {}).get("orchestrationMode") == "Uniform"
            left = uniform.members(arm, path) if uniform_set else self._set_vms(arm, str(doc["id"]))
            if left:
                raise InUseError(f"{cloud.name}: scale set {path}: {len(left)} VMs")
            arm.request(path, "DELETE")
            log.info("azure.job_set_deleted set=%s", path.rsplit("/", 1)[-1])
        ppg = sets.ppg_name(name)
        try:
            arm.request(arm.compute("proximityPlacementGroups", ppg), "DELETE")
            found = True
        except BaseHTTPError as exc:
            if exc.code == 409:
                raise InUseError(f"{cloud.name}: proximity placement group {ppg}: in use") from exc
            if exc.code not in (204, 404):
                raise
        bk.ppgs.discard(ppg)
        if not found:
            raise NotFoundError(f"{cloud.name}: placement {name}: gone")

    def tag(self, cloud: LibcloudCloud, instance_id: str, tags: Mapping[str, str]) -> None:
        """``PATCH`` the VM's tags (a scale-out's VMs have none of their own)."""
        arm = sets.Arm(cloud)
        arm.request(arm.compute("virtualMachines", instance_id), "PATCH", {"tags": dict(tags)})


def _provisioning(doc: Mapping[str, Any]) -> str:
    return str((doc.get("properties") or {}).get("provisioningState", ""))


def job_set_path(cloud: LibcloudCloud, placement: str, spot: bool = False) -> str:
    """The resource path of placement ``placement``'s scale set (on-demand, or Spot)."""
    return sets.Arm(cloud).compute("virtualMachineScaleSets", sets.job_set(placement, spot))


def _withheld(failure: CloudError | None) -> bool:
    return failure is not None and failure.code == SPOT_WAIT_CODE


def spot_refusal(spec: LaunchSpec, err: CloudError) -> CloudError:
    """A Spot launch's quota error as a refusal (:class:`CapacityError`, its code kept):
    Spot cores have a quota of their own (``lowPriorityCores``), so the on-demand
    fallback may well fit; anything else as it is."""
    if spec.spot and isinstance(err, QuotaError):
        return CapacityError(str(err), err.code)
    return err


PROVIDER = AzureArm()
