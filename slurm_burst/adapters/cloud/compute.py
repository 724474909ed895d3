"""The Cloud port over any libcloud compute driver.

The only module that turns libcloud ``Node`` objects into our :class:`Instance`
and libcloud exceptions into our typed :class:`CloudError`. What differs per
provider is in tables: the ``create_node`` arguments in :mod:`.profiles`, the
idempotency-token argument, server-side tag filters and batching here; a new
provider is a row, not a branch in a service.

Idempotency: every launch carries a token, fixed in the state database before the
call, and the token is also a tag on the instance. EC2 (and the lab) take it as
the request's own idempotency token; for every provider, a retry first looks for
instances carrying the token (:meth:`LibcloudCloud.find`), so a crash between
the call and the record never makes a second instance.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from libcloud.common.exceptions import BaseHTTPError
from libcloud.common.types import LibcloudError
from libcloud.compute.base import Node, NodeSize
from libcloud.compute.types import NodeState

from slurm_burst.adapters.cloud.attest import EC2_NS, HostKeySource, NoSource, host_key_source
from slurm_burst.adapters.cloud.profiles import (
    API_NAMES,
    BATCH_DEFAULT,
    DESTROY_KWARGS,
    Placement,
    azure_connection_fix,
    create_kwargs,
    filters_by_tag,
)
from slurm_burst.core.cloud import (
    CLUSTER_TAG,
    GROUP_TAG,
    NODE_TAG,
    TOKEN_TAG,
    CloudError,
    ExistsError,
    Instance,
    LaunchSpec,
    NotFoundError,
    ThrottledError,
    classify,
)

__all__ = ["CLUSTER_TAG", "GROUP_TAG", "NODE_TAG", "TOKEN_TAG", "LibcloudCloud"]

log = logging.getLogger(__name__)

_ERRORS = (LibcloudError, BaseHTTPError, OSError)
# drivers whose key pair is imported once and then named at launch
KEYPAIR_IMPORT = {"ec2", "openstack"}
EC2_PAGE = 1000  # DescribeInstances' largest page
# every state but terminated: what a listing of the live fleet asks for
EC2_LIVE_STATES = ("pending", "running", "shutting-down", "stopping", "stopped")


class LibcloudCloud:
    """One provider profile: ``name`` is its key in the config's [providers]."""

    def __init__(
        self, name: str, driver: Any, placement: Placement | None = None, batch: int = 0
    ) -> None:
        self.name = name
        self.driver = driver
        self.kind = str(getattr(driver, "type", "") or "")
        self.placement = placement or Placement()
        self.batch_max = batch or BATCH_DEFAULT.get(self.kind, 1)
        self.api_names = API_NAMES.get(self.kind, {})
        self.lists_fleet = self.kind == "ec2"  # booting nodes read one shared listing
        if self.kind == "azure_arm":
            azure_connection_fix(driver)
        self.source: HostKeySource | None
        try:
            self.source = host_key_source(self.kind, driver, self.placement.host_keys)
        except NoSource:
            self.source = None  # `config check` refuses such a profile; a join would fail
        self._sizes: dict[str, NodeSize] = {}
        self._keypair = ""
        self._lock = threading.Lock()

    # -- launch ---------------------------------------------------------------
    def create_kwargs(self, spec: LaunchSpec) -> dict[str, Any]:
        placement = self.placement
        if self.kind in KEYPAIR_IMPORT and not placement.key_name:
            placement = _replace(placement, key_name=self._import_key(spec.ssh_public_key))
        try:
            return create_kwargs(self.kind, self.driver, spec, placement, self._size(spec.size))
        except ValueError as exc:
            raise CloudError(f"{self.name}: {exc}", "InvalidParameterValue") from exc

    def launch(self, spec: LaunchSpec) -> Instance:
        started = time.monotonic()
        node = self._create(spec)
        node = node[0] if isinstance(node, list) else node
        log.info(
            "cloud.create_node provider=%s node=%s size=%s instance=%s seconds=%.2f",
            self.name,
            spec.node,
            spec.size,
            node.id,
            time.monotonic() - started,
        )
        return self._to_instance(node)

    def launch_many(self, spec: LaunchSpec) -> list[Instance]:
        """Between ``spec.min_count`` (0: all) and ``spec.count`` instances in one call,
        ordered by launch index.

        EC2: one RunInstances with MinCount and MaxCount; EC2 makes as many as it has
        capacity for, or none (InsufficientInstanceCapacity) if fewer than MinCount.
        The instances carry the batch's tags; each is tagged with its node's name by
        :meth:`tag` once the caller has mapped them.
        """
        started = time.monotonic()
        made = self._create(spec)
        nodes = made if isinstance(made, list) else [made]
        out = sorted((self._to_instance(n) for n in nodes), key=lambda i: i.launch_index)
        log.info(
            "cloud.create_nodes provider=%s count=%d size=%s token=%s seconds=%.2f",
            self.name,
            len(out),
            spec.size,
            spec.token,
            time.monotonic() - started,
        )
        if not (spec.min_count or spec.count) <= len(out) <= spec.count:
            raise CloudError(
                f"{self.name}: asked for {spec.min_count or spec.count}..{spec.count} "
                f"instances, got {len(out)}",
                "PartialLaunch",
            )
        return out

    def _create(self, spec: LaunchSpec) -> Any:
        kwargs = self.create_kwargs(spec)
        try:
            return self.driver.create_node(**kwargs)
        except _ERRORS as exc:
            raise self._error(exc) from exc

    def find(self, token: str, cluster: str) -> list[Instance]:
        """Live instances a launch with ``token`` made (a retry adopts them)."""
        found = [
            i
            for i in self._list(cluster, {TOKEN_TAG: token})
            if i.tags.get(TOKEN_TAG) == token and i.state not in ("terminated", "shutting-down")
        ]
        return sorted(found, key=lambda i: i.launch_index)

    def tag(self, instance_id: str, tags: Mapping[str, str]) -> None:
        """Add tags to one instance (idempotent)."""
        if self.kind == "ec2":
            # EC2's lists are 1-based (ResourceId.1, Tag.1.Key); libcloud's
            # ex_create_tags sends 0-based ones, which not every endpoint takes.
            params = {"Action": "CreateTags", "ResourceId.1": instance_id}
            for i, (k, v) in enumerate(sorted(tags.items()), start=1):
                params[f"Tag.{i}.Key"], params[f"Tag.{i}.Value"] = k, v
            try:
                self.driver.connection.request(self.driver.path, params=params)
            except _ERRORS as exc:
                raise self._error(exc) from exc
            return
        setter = getattr(self.driver, "ex_create_tags", None)
        if setter is None:
            raise CloudError(f"{self.name}: driver {self.kind} cannot tag", "NotSupported")
        node = self._node(instance_id)
        if node is None:
            raise NotFoundError(f"{self.name}: instance {instance_id} not found")
        try:
            setter(node, dict(tags))
        except _ERRORS as exc:
            raise self._error(exc) from exc

    def _import_key(self, public_key: str) -> str:
        """The name of a key pair holding the daemon's public key, imported once.

        Named after the key's SHA-256, so every daemon with the same key finds it
        (no fingerprint matching: providers compute ED25519 fingerprints differently).
        """
        digest = hashlib.sha256(public_key.split()[1].encode()).hexdigest()[:16]
        name = f"slurm-burst-{digest}"
        with self._lock:
            if self._keypair:
                return self._keypair
            try:
                if name not in {k.name for k in self.driver.list_key_pairs()}:
                    self.driver.import_key_pair_from_string(name, public_key)
                    log.info("cloud.key_imported provider=%s key_pair=%s", self.name, name)
            except _ERRORS as exc:
                raise self._error(exc) from exc
            self._keypair = name
        return name

    def _size(self, size_id: str) -> NodeSize:
        with self._lock:
            if not self._sizes:
                try:
                    self._sizes = {s.id: s for s in self.driver.list_sizes()}
                except _ERRORS as exc:
                    raise self._error(exc) from exc
        size = self._sizes.get(size_id) or next(
            (z for z in self._sizes.values() if z.name == size_id), None
        )
        if size is None:
            raise CloudError(f"{self.name}: size {size_id!r} is not offered", "InvalidSize")
        return size

    # -- placement groups -------------------------------------------------------
    def create_placement(self, name: str) -> None:
        """A cluster placement group ``name`` (EC2's CreatePlacementGroup through
        libcloud; a plugin driver offering placement has the same method). One that
        exists already is no error: the call is repeated after a crash or per size."""
        try:
            self._placement_call("ex_create_placement_group", name)
        except ExistsError:
            return
        log.info("cloud.placement_created provider=%s name=%s", self.name, name)

    def delete_placement(self, name: str) -> None:
        """Delete placement group ``name``; one that is gone is no error, one with
        instances still in it (shutting down included) raises :class:`InUseError`."""
        try:
            self._placement_call("ex_delete_placement_group", name)
        except NotFoundError:
            return
        log.info("cloud.placement_deleted provider=%s name=%s", self.name, name)

    def _placement_call(self, method: str, name: str) -> None:
        call = getattr(self.driver, method, None)
        if call is None:
            raise CloudError(f"{self.name}: driver {self.kind} makes no placement groups",
                             "NotSupported")  # fmt: skip
        try:
            call(name)
        except _ERRORS as exc:
            raise self._error(exc) from exc

    # -- read -----------------------------------------------------------------
    def get(self, instance_id: str) -> Instance | None:
        node = self._node(instance_id)
        return None if node is None else self._to_instance(node)

    def _node(self, instance_id: str) -> Node | None:
        try:
            nodes = self.driver.list_nodes(ex_node_ids=[instance_id])
        except TypeError:  # a driver without ex_node_ids
            nodes = self.driver.list_nodes()
        except _ERRORS as exc:
            err = self._error(exc)
            if isinstance(err, NotFoundError):
                return None
            raise err from exc
        return next((n for n in nodes if str(n.id) == instance_id), None)

    def list_instances(self, cluster: str) -> list[Instance]:
        """Every instance tagged with ``cluster`` (terminated ones included, if listed)."""
        return self._list(cluster, {})

    def _list(self, cluster: str, also: Mapping[str, str]) -> list[Instance]:
        filters = {f"tag:{k}": v for k, v in {CLUSTER_TAG: cluster, **also}.items()}
        try:
            if filters_by_tag(self.kind):
                nodes = self.driver.list_nodes(ex_filters=filters)
            else:
                nodes = self.driver.list_nodes()
        except _ERRORS as exc:
            raise self._error(exc) from exc
        out = [self._to_instance(n) for n in nodes]
        return [i for i in out if i.tags.get(CLUSTER_TAG) == cluster]

    def list_fleet(self, cluster: str, before_page: Callable[[], None]) -> list[Instance]:
        """The cluster's instances that are not terminated, as one paginated
        DescribeInstances (EC2) filtered on the cluster tag and the state: ``MaxResults``
        1000 a page, ``NextToken`` to the next; ``before_page`` is called before each
        page (it takes the page's token from the budget). libcloud's ``list_nodes``
        neither pages nor skips its DescribeAddresses, so the request is made here
        through the driver's own signed connection."""
        if self.kind != "ec2":
            before_page()
            return [i for i in self.list_instances(cluster) if i.state != "terminated"]
        base = {
            "Action": "DescribeInstances",
            "MaxResults": str(EC2_PAGE),
            "Filter.1.Name": f"tag:{CLUSTER_TAG}",
            "Filter.1.Value.1": cluster,
            "Filter.2.Name": "instance-state-name",
            **{f"Filter.2.Value.{i}": s for i, s in enumerate(EC2_LIVE_STATES, start=1)},
        }
        out: list[Instance] = []
        token = ""
        for _page in range(10_000):  # 10 million instances: a loop that cannot end is a bug
            before_page()
            params = {**base, "NextToken": token} if token else base
            try:
                obj = self.driver.connection.request(self.driver.path, params=params).object
            except _ERRORS as exc:
                raise self._error(exc) from exc
            for rs in obj.iterfind(f"{{{EC2_NS}}}reservationSet/{{{EC2_NS}}}item"):
                nodes = self.driver._to_nodes(rs, "instancesSet/item")
                out += (self._to_instance(n) for n in nodes)
            token = (obj.findtext(f"{{{EC2_NS}}}nextToken") or "").strip()
            if not token:
                break
        return [i for i in out if i.tags.get(CLUSTER_TAG) == cluster]

    def host_keys(self, instance_id: str, size: str = "") -> list[tuple[str, str]]:
        """The SSH host keys the instance published where the provider lets us read them
        (``[]`` until it has); see :mod:`.attest`. EC2, with the instance's ``size``
        known: one GetConsoleOutput, no describe first."""
        if self.source is None:
            raise CloudError(
                f"{self.name}: driver {self.kind} offers no way to read an instance's SSH "
                "host keys through its API; no host key to trust",
                "NoHostKeySource",
            )
        if self.kind == "ec2" and size:
            node: Node | None = Node(
                instance_id, instance_id, NodeState.UNKNOWN, [], [], self.driver,
                extra={"instance_type": size},
            )  # fmt: skip
        else:
            node = self._node(instance_id)
        if node is None:
            raise NotFoundError(f"{self.name}: instance {instance_id} not found")
        try:
            return self.source.read(node)
        except NoSource as exc:
            raise CloudError(f"{self.name}: {exc}", "NoHostKeySource") from exc
        except _ERRORS as exc:
            raise self._error(exc) from exc

    # -- terminate ------------------------------------------------------------
    def terminate(self, instance_id: str) -> None:
        """Destroy the instance; one that is already gone counts as destroyed. EC2: one
        TerminateInstances by id (no describe first; terminating twice is no error)."""
        destroy: Callable[[], Any]
        if self.kind == "ec2":
            params = {"Action": "TerminateInstances", "InstanceId.1": instance_id}
            destroy = partial(self.driver.connection.request, self.driver.path, params=params)
        else:
            node = self._node(instance_id)
            if node is None or _state(node) == "terminated":
                log.info("cloud.terminate provider=%s instance=%s already gone",
                         self.name, instance_id)  # fmt: skip
                return
            destroy = partial(self.driver.destroy_node, node, **DESTROY_KWARGS.get(self.kind, {}))
        try:
            destroy()
        except _ERRORS as exc:
            err = self._error(exc)
            if isinstance(err, NotFoundError):
                return
            raise err from exc
        log.info("cloud.terminate provider=%s instance=%s", self.name, instance_id)

    # -- translation ------------------------------------------------------------
    def _to_instance(self, node: Node) -> Instance:
        extra = node.extra or {}
        tags = extra.get("tags") or extra.get("labels") or extra.get("metadata") or {}
        if not isinstance(tags, Mapping):  # GCE: extra["tags"] are network tags (a list)
            tags = extra.get("labels") or {}
        size = extra.get("size") or extra.get("instance_type") or extra.get("machineType") or ""
        return Instance(
            id=str(node.id),
            name=str(node.name),
            state=_state(node),
            provider=self.name,
            size=str(size),
            public_ips=tuple(node.public_ips or ()),
            private_ips=tuple(node.private_ips or ()),
            tags=dict(zip(map(str, tags), map(str, tags.values()), strict=True)),
            launch_index=int(extra.get("launch_index") or 0),
            fault=_fault(extra.get("fault")),
        )

    def _error(self, exc: Exception) -> CloudError:
        code = getattr(exc, "code", None)  # GCE: the error's code, not in its message
        err = classify(
            f"{self.name}: {code}: {exc}" if isinstance(code, str) else f"{self.name}: {exc}"
        )
        if isinstance(exc, BaseHTTPError) and exc.code in (429, 503) and not err.retryable:
            err = ThrottledError(str(err), f"HTTP{exc.code}")
        return err


def _state(node: Node) -> str:
    return str(getattr(node.state, "value", node.state))


def _fault(fault: Any) -> str:
    """OpenStack's server fault ({"code": 500, "message": ...}) as text; '' if none."""
    if isinstance(fault, Mapping):
        return str(fault.get("message") or "")
    return str(fault or "")


def _replace(p: Placement, **kw: Any) -> Placement:
    import dataclasses

    return dataclasses.replace(p, **kw)
