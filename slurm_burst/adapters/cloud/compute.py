"""The Cloud port over any libcloud compute driver.

The only module that turns libcloud ``Node`` objects into our :class:`Instance`
and libcloud exceptions into our typed :class:`CloudError`. What differs per
provider is in the provider's own module (:mod:`.providers`, looked up in
:mod:`.registry`): the ``create_node`` arguments, batching, server-side tag filters, the
fleet listing, tagging, termination and the host-key source; a new provider is a module,
not a branch here or in a service.

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
from typing import Any

from libcloud.common.exceptions import BaseHTTPError
from libcloud.common.types import LibcloudError
from libcloud.compute.base import Node, NodeSize

from slurm_burst.adapters.cloud.attest import HostKeySource, NoSource
from slurm_burst.adapters.cloud.profiles import Placement, create_kwargs
from slurm_burst.adapters.cloud.registry import provider
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


class LibcloudCloud:
    """One provider profile: ``name`` is its key in the config's [providers]."""

    def __init__(
        self, name: str, driver: Any, placement: Placement | None = None, batch: int = 0
    ) -> None:
        self.name = name
        self.driver = driver
        self.kind = str(getattr(driver, "type", "") or "")
        self.provider = provider(self.kind)
        self.placement = placement or Placement()
        self.batch_max = batch or self.provider.launch_batch
        self.api_names = self.provider.api_names
        self.lists_fleet = self.provider.lists_fleet  # booting nodes read one shared listing
        self.provider.prepare(driver)
        self.source: HostKeySource | None
        try:
            self.source = self.provider.host_key_source(driver, self.placement.host_keys)
        except NoSource:
            self.source = None  # `config check` refuses such a profile; a join would fail
        self._sizes: dict[str, NodeSize] = {}
        self._remembered: dict[str, Any] = {}  # what a provider looked up once (an image)
        self._keypair = ""
        self._lock = threading.Lock()
        # the budget's turn for an API call made inside another (a bulk launch's wait
        # and listing): set by the ManagedCloud around this one; none without it
        self.turn: Callable[[str], None] = lambda api: None
        # how a provider's own connection takes each request's turn (Azure): the
        # ManagedCloud's meter; without one, requests go at once and throttles raise
        self.meter: Meter = Meter()
        self.provider.watch(self)

    # -- launch ---------------------------------------------------------------
    def create_kwargs(self, spec: LaunchSpec) -> dict[str, Any]:
        placement = self.placement
        if self.provider.imports_key_pair and not placement.key_name:
            placement = _replace(placement, key_name=self._import_key(spec.ssh_public_key))
        try:
            return create_kwargs(self.kind, self.driver, spec, placement, self._size(spec.size))
        except ValueError as exc:
            raise CloudError(f"{self.name}: {exc}", "InvalidParameterValue") from exc

    def launch(self, spec: LaunchSpec) -> Instance:
        started = time.monotonic()
        try:
            alone = self.provider.launch_one(self, spec)
        except _ERRORS as exc:
            raise self._error(exc) from exc
        if alone is None:
            node = self._create(spec)
            alone = self.to_instance(node[0] if isinstance(node, list) else node)
        log.info(
            "cloud.create_node provider=%s node=%s size=%s instance=%s seconds=%.2f",
            self.name,
            spec.node,
            spec.size,
            alone.id,
            time.monotonic() - started,
        )
        return alone

    def launch_many(self, spec: LaunchSpec) -> list[Instance]:
        """Between ``spec.min_count`` (0: all) and ``spec.count`` instances in one call,
        ordered by launch index.

        EC2: one RunInstances with MinCount and MaxCount; EC2 makes as many as it has
        capacity for, or none (InsufficientInstanceCapacity) if fewer than MinCount.
        The instances carry the batch's tags; each is tagged with its node's name by
        :meth:`tag` once the caller has mapped them.
        """
        started = time.monotonic()
        try:
            bulk = self.provider.launch_many(self, spec)
        except _ERRORS as exc:
            raise self._error(exc) from exc
        if bulk is not None:
            out = bulk
        else:
            made = self._create(spec)
            nodes = made if isinstance(made, list) else [made]
            out = sorted((self.to_instance(n) for n in nodes), key=lambda i: i.launch_index)
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
        try:
            own = self.provider.find(self, token, cluster)
        except _ERRORS as exc:
            raise self._error(exc) from exc
        if own is not None:
            return own
        found = [
            i
            for i in self._list(cluster, {TOKEN_TAG: token})
            if i.tags.get(TOKEN_TAG) == token and i.state not in ("terminated", "shutting-down")
        ]
        return sorted(found, key=lambda i: i.launch_index)

    def tag(self, instance_id: str, tags: Mapping[str, str]) -> None:
        """Add tags to one instance (idempotent)."""
        try:
            self.provider.tag(self, instance_id, dict(tags))
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

    # -- placement per job ------------------------------------------------------
    def create_placement(self, name: str) -> None:
        """The per-job placement ``name``, as the provider makes it (EC2: a cluster
        placement group; GCE: a compact placement policy). One that exists already is
        no error: the call is repeated after a crash or per size."""
        try:
            self.provider.create_placement(self, name)
        except ExistsError:
            return
        except _ERRORS as exc:
            raise self._error(exc) from exc
        log.info("cloud.placement_created provider=%s name=%s", self.name, name)

    def delete_placement(self, name: str) -> None:
        """Delete placement ``name``; one that is gone is no error, one with instances
        still in it (shutting down included) raises :class:`InUseError`."""
        try:
            self.provider.delete_placement(self, name)
        except NotFoundError:
            return
        except _ERRORS as exc:
            raise self._error(exc) from exc
        log.info("cloud.placement_deleted provider=%s name=%s", self.name, name)

    def driver_call(self, method: str, *args: Any) -> Any:
        """The driver's ``method`` (an ``ex_`` extension), its errors typed; NotSupported
        where the driver has none."""
        call = getattr(self.driver, method, None)
        if call is None:
            raise CloudError(f"{self.name}: driver {self.kind} has no {method}",
                             "NotSupported")  # fmt: skip
        try:
            return call(*args)
        except _ERRORS as exc:
            raise self._error(exc) from exc

    # -- read -----------------------------------------------------------------
    def get(self, instance_id: str) -> Instance | None:
        node = self.node(instance_id)
        return None if node is None else self.to_instance(node)

    def node(self, instance_id: str) -> Node | None:
        """The driver's node of ``instance_id`` (None: not found)."""
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
            if self.provider.tag_filter:
                nodes = self.driver.list_nodes(ex_filters=filters)
            else:
                nodes = self.driver.list_nodes()
        except _ERRORS as exc:
            raise self._error(exc) from exc
        out = [self.to_instance(n) for n in nodes]
        return [i for i in out if i.tags.get(CLUSTER_TAG) == cluster]

    def list_fleet(self, cluster: str, before_page: Callable[[], None]) -> list[Instance]:
        """The cluster's instances that are not terminated, as the provider lists its fleet
        (EC2: paginated, filtered on the server); ``before_page`` is called before each
        page (it takes the page's token from the budget)."""
        try:
            return self.provider.list_fleet(self, cluster, before_page)
        except _ERRORS as exc:
            raise self._error(exc) from exc

    def host_keys(self, instance_id: str, size: str = "") -> list[tuple[str, str]]:
        """The SSH host keys the instance published where the provider lets us read them
        (``[]`` until it has); see :mod:`.attest`. With the instance's ``size`` known a
        provider may skip the describe (EC2: one GetConsoleOutput)."""
        if self.source is None:
            raise CloudError(
                f"{self.name}: driver {self.kind} offers no way to read an instance's SSH "
                "host keys through its API; no host key to trust",
                "NoHostKeySource",
            )
        try:
            node = self.provider.host_key_node(self, instance_id, size)
        except _ERRORS as exc:
            raise self._error(exc) from exc
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
        """Destroy the instance; one that is already gone counts as destroyed."""
        try:
            done = self.provider.terminate(self, instance_id)
        except _ERRORS as exc:
            err = self._error(exc)
            if isinstance(err, NotFoundError):
                return
            raise err from exc
        log.info("cloud.terminate provider=%s instance=%s%s", self.name, instance_id,
                 "" if done else " already gone")  # fmt: skip

    # -- translation ------------------------------------------------------------
    def to_instance(self, node: Node) -> Instance:
        """Our :class:`Instance` of a libcloud node."""
        extra = node.extra or {}
        tags = extra.get("tags") or extra.get("labels") or extra.get("metadata") or {}
        if not isinstance(tags, Mapping):  # GCE: extra["tags"] are network tags (a list)
            tags = extra.get("labels") or {}
        size = extra.get("size") or extra.get("instance_type") or extra.get("machineType") or ""
        return Instance(
            id=str(node.id),
            name=str(node.name),
            state=state_of(node),
            provider=self.name,
            size=str(size),
            public_ips=tuple(node.public_ips or ()),
            private_ips=tuple(node.private_ips or ()),
            tags=dict(zip(map(str, tags), map(str, tags.values()), strict=True)),
            launch_index=int(extra.get("launch_index") or 0),
            fault=_fault(extra.get("fault")),
        )

    def remembered(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()``'s answer, asked once per profile (a lookup that does not change)."""
        with self._lock:
            if key in self._remembered:
                return self._remembered[key]
        got = make()
        with self._lock:
            return self._remembered.setdefault(key, got)

    def error_of(self, exc: Exception) -> CloudError:
        """A libcloud error as our typed one (a provider module's calls use it)."""
        return self._error(exc)

    def _error(self, exc: Exception) -> CloudError:
        code = getattr(exc, "code", None)  # GCE: the error's code, not in its message
        err = classify(
            f"{self.name}: {code}: {exc}" if isinstance(code, str) else f"{self.name}: {exc}"
        )
        if isinstance(exc, BaseHTTPError) and exc.code in (429, 503) and not err.retryable:
            err = ThrottledError(str(err), f"HTTP{exc.code}")
        after = getattr(exc, "retry_after", 0)  # the provider's Retry-After (libcloud's 429)
        if isinstance(err, ThrottledError) and isinstance(after, int | float) and after > 0:
            err.after = float(after)
        if isinstance(err, ThrottledError) and getattr(exc, "metered", False):
            err.counted = True  # the meter counted it and cut the budget already
        return err


class Meter:
    """How each request of a provider's own connection is paced (Azure's, by the kind
    ARM counts it as: reads, writes, deletes). This one does nothing; the daemon's
    :class:`~slurm_burst.services.cloudcalls.ManagedCloud` puts its own in its place."""

    def before(self, kind: str) -> None:
        """Before a request of ``kind``: wait for its turn (or raise Busy)."""

    def after(self, kind: str, remaining: float) -> None:
        """An answer said ``remaining`` requests of ``kind`` are left."""

    def throttled(self, kind: str, retry_after: float) -> bool:
        """A request of ``kind`` was throttled: True once it may be repeated (after
        ``retry_after`` s), False to raise the throttle to the caller."""
        return False


def state_of(node: Node) -> str:
    """A libcloud node's state as our text (``running``, ``terminated``...)."""
    return str(getattr(node.state, "value", node.state))


def _fault(fault: Any) -> str:
    """OpenStack's server fault ({"code": 500, "message": ...}) as text; '' if none."""
    if isinstance(fault, Mapping):
        return str(fault.get("message") or "")
    return str(fault or "")


def _replace(p: Placement, **kw: Any) -> Placement:
    import dataclasses

    return dataclasses.replace(p, **kw)
