"""The Cloud port over any libcloud compute driver.

The only module that turns libcloud ``Node`` objects into our :class:`Instance`
and libcloud exceptions into our typed :class:`CloudError`. Per-driver
differences (the idempotency-token argument, tag filters, console output
shapes) are tables here, so a new provider is a row, not a branch in a service.
Provider profiles for EC2/GCE/Azure/OpenStack (networks, spot, disks) extend
``create_kwargs``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from libcloud.common.exceptions import BaseHTTPError
from libcloud.common.types import LibcloudError
from libcloud.compute.base import Node, NodeAuthSSHKey, NodeImage, NodeSize

from slurm_burst.core.cloud import (
    CloudError,
    Instance,
    LaunchSpec,
    NotFoundError,
    ThrottledError,
    classify,
)
from slurm_burst.core.hostkeys import parse_console_host_keys

log = logging.getLogger(__name__)

CLUSTER_TAG = "slurm-burst-cluster"
NODE_TAG = "slurm-burst-node"
GROUP_TAG = "slurm-burst-group"

# driver type -> keyword argument of create_node that carries an idempotency token
TOKEN_ARG = {"nscloud": "ex_token", "ec2": "ex_clienttoken"}
# drivers whose create_node takes tags as ex_metadata, and list_nodes filters on them
METADATA_TAGS = {"nscloud", "ec2", "openstack"}
TAG_FILTERS = {"nscloud", "ec2"}

_ERRORS = (LibcloudError, BaseHTTPError, OSError)


class LibcloudCloud:
    """One provider profile: ``name`` is its key in the config's [providers]."""

    def __init__(self, name: str, driver: Any) -> None:
        self.name = name
        self.driver = driver
        self.kind = str(getattr(driver, "type", "") or "")
        self._sizes: dict[str, NodeSize] = {}
        self._lock = threading.Lock()

    # -- launch ---------------------------------------------------------------
    def create_kwargs(self, spec: LaunchSpec) -> dict[str, Any]:
        tags = {CLUSTER_TAG: spec.cluster, NODE_TAG: spec.node, GROUP_TAG: spec.group, **spec.tags}
        kwargs: dict[str, Any] = {
            "name": spec.node,
            "size": self._size(spec.size),
            "image": NodeImage(id=spec.image, name=spec.image, driver=self.driver),
            "auth": NodeAuthSSHKey(spec.ssh_public_key),
            "ex_userdata": spec.user_data,
        }
        if self.kind in METADATA_TAGS:
            kwargs["ex_metadata"] = tags
        token_arg = TOKEN_ARG.get(self.kind)
        if token_arg:
            kwargs[token_arg] = spec.token
        return kwargs

    def launch(self, spec: LaunchSpec) -> Instance:
        kwargs = self.create_kwargs(spec)
        started = time.monotonic()
        try:
            node = self.driver.create_node(**kwargs)
        except _ERRORS as exc:
            raise self._error(exc) from exc
        log.info(
            "cloud.create_node provider=%s node=%s size=%s instance=%s seconds=%.2f",
            self.name,
            spec.node,
            spec.size,
            node.id,
            time.monotonic() - started,
        )
        return self._to_instance(node)

    def _size(self, size_id: str) -> NodeSize:
        with self._lock:
            if not self._sizes:
                try:
                    self._sizes = {s.id: s for s in self.driver.list_sizes()}
                except _ERRORS as exc:
                    raise self._error(exc) from exc
        try:
            return self._sizes[size_id]
        except KeyError:
            raise CloudError(
                f"{self.name}: size {size_id!r} is not offered", "InvalidParameterValue"
            ) from None

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
        try:
            if self.kind in TAG_FILTERS:
                nodes = self.driver.list_nodes(ex_filters={f"tag:{CLUSTER_TAG}": cluster})
            else:
                nodes = self.driver.list_nodes()
        except _ERRORS as exc:
            raise self._error(exc) from exc
        out = [self._to_instance(n) for n in nodes]
        return [i for i in out if i.tags.get(CLUSTER_TAG) == cluster]

    def host_keys(self, instance_id: str) -> list[tuple[str, str]]:
        """The SSH host keys the instance printed on its console (empty until it has)."""
        node = self._node(instance_id)
        if node is None:
            raise NotFoundError(f"{self.name}: instance {instance_id} not found")
        try:
            console = self.driver.ex_get_console_output(node)
        except AttributeError as exc:
            raise CloudError(
                f"{self.name}: driver {self.kind} cannot read the console; no host key to trust",
                "NoConsole",
            ) from exc
        except _ERRORS as exc:
            raise self._error(exc) from exc
        if isinstance(console, dict):  # EC2: {"instance_id", "timestamp", "output"}
            console = console.get("output") or ""
        return parse_console_host_keys(str(console))

    # -- terminate ------------------------------------------------------------
    def terminate(self, instance_id: str) -> None:
        """Destroy the instance; one that is already gone counts as destroyed."""
        node = self._node(instance_id)
        if node is None or _state(node) == "terminated":
            log.info("cloud.terminate provider=%s instance=%s already gone", self.name, instance_id)
            return
        try:
            self.driver.destroy_node(node)
        except _ERRORS as exc:
            err = self._error(exc)
            if isinstance(err, NotFoundError):
                return
            raise err from exc
        log.info("cloud.terminate provider=%s instance=%s", self.name, instance_id)

    # -- translation ------------------------------------------------------------
    def _to_instance(self, node: Node) -> Instance:
        extra = node.extra or {}
        tags = extra.get("tags") or extra.get("metadata") or {}
        size = extra.get("size") or extra.get("instance_type") or ""
        return Instance(
            id=str(node.id),
            name=str(node.name),
            state=_state(node),
            provider=self.name,
            size=str(size),
            public_ips=tuple(node.public_ips or ()),
            private_ips=tuple(node.private_ips or ()),
            tags=dict(zip(map(str, tags), map(str, tags.values()), strict=True)),
        )

    def _error(self, exc: Exception) -> CloudError:
        err = classify(f"{self.name}: {exc}")
        if isinstance(exc, BaseHTTPError) and exc.code in (429, 503) and not err.retryable:
            err = ThrottledError(str(err), f"HTTP{exc.code}")
        return err


def _state(node: Node) -> str:
    return str(getattr(node.state, "value", node.state))
