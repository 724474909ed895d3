"""What the daemon tells a cloud node's agent, and hears from it, over the mesh: its
direct peers, and the provider's interruption notices.

The node agent (``node/agent.py``, started by the bootstrap of a group with
``cloud_to_cloud = "wireguard"``) asks every ``mesh.sync_interval`` seconds for its
direct peers: the other live nodes of its provider profile (provider and region) whose
groups tunnel directly, with their keys, mesh addresses and endpoints. It says its own
endpoint (its private address and ``mesh.node_port``) in the same request; a node is
offered to others only once its agent has said where it listens.

**Who is asking** is the request's source address: the API listens on the hub's mesh
address, bound to the hub interface, and WireGuard delivers a packet from a peer only
with a source inside that peer's allowed addresses (the node's one mesh address). So an
address is a node, with no secret of its own to leak; one that is no live node's is
refused.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from slurm_burst.config import Fleet
from slurm_burst.core.interruption import Notice, parse_notice
from slurm_burst.core.jsonread import read_json
from slurm_burst.core.mesh import NodeLink, Refused, direct_peers, endpoint_of
from slurm_burst.core.nodestate import NodeState
from slurm_burst.core.records import NodeRecord
from slurm_burst.ports import Clock, NodeStore

log = logging.getLogger(__name__)

# the states in which a node has its tunnel to the hub, and so an agent that may ask
TUNNELLED = frozenset({NodeState.BOOTSTRAPPING, NodeState.JOINED})
DIRECT = "wireguard"
CACHE_SECONDS = 1.0  # the live nodes are read again at most this often


@dataclass(frozen=True)
class NodeApiSettings:
    fleet: Fleet
    subnet: str  # the mesh subnet: endpoints inside it are refused


class NodeApi:
    def __init__(self, settings: NodeApiSettings, store: NodeStore, clock: Clock) -> None:
        self.settings = settings
        self.fleet = settings.fleet
        self.store = store
        self.clock = clock
        self._endpoints: dict[str, str] = {}  # node -> where its tunnel listens (its agent)
        self._cache: tuple[float, list[NodeLink]] | None = None  # (when, live nodes)
        # what a node's interruption notice is handed to (services.interruptions)
        self.noticed: Callable[[NodeRecord, Notice], dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def notice(self, source: str, body: bytes) -> dict[str, Any]:
        """An interruption notice the node at ``source`` read from its provider."""
        rec = self.caller(source)
        if self.noticed is None:
            raise Refused(404, "this daemon takes no interruption notices")
        try:
            notice = parse_notice(read_json(body, "the notice"), self.clock.now())
        except ValueError as exc:  # json's errors are ValueErrors too
            raise Refused(400, str(exc)[:200]) from None
        return self.noticed(rec, notice)

    def caller(self, source: str) -> NodeRecord:
        """The live node whose mesh address ``source`` is; :class:`Refused` otherwise."""
        owner = {a: n for n, a in self.store.addresses().items()}.get(source)
        rec = self.store.node(owner) if owner else None
        if rec is None or rec.state not in TUNNELLED:
            raise Refused(403, f"{source} is no live cloud node's mesh address")
        return rec

    def peers(self, source: str, endpoint: str) -> dict[str, Any]:
        """The direct peers of the node at ``source``, which listens at ``endpoint``."""
        try:
            said = endpoint_of(endpoint, self.settings.subnet)
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        with self._lock:
            endpoints = dict(self._endpoints)
        links = self._links(endpoints)
        me = next((n for n in links if n.address == source), None)
        if me is None:
            raise Refused(403, f"{source} is no live node of a group that tunnels directly")
        with self._lock:
            if self._endpoints.get(me.node) != said:
                log.info("mesh.agent_endpoint node=%s endpoint=%s", me.node, said)
            self._endpoints[me.node] = said
        return {
            "node": me.node,
            "peers": [
                {"node": p.node, "key": p.public_key, "address": p.address, "endpoint": p.endpoint}
                for p in direct_peers(me, links)
            ],
        }

    def _links(self, endpoints: Mapping[str, str]) -> list[NodeLink]:
        """Every live node of a directly tunnelling group, with its agent's endpoint. The
        records are read at most once a second: a thousand agents asking every few
        seconds must not each read the whole state database."""
        now = self.clock.monotonic()
        with self._lock:
            cached = self._cache
        if cached is None or now - cached[0] >= CACHE_SECONDS:
            live = []
            for r in self.store.nodes():
                group = self.fleet.group_of(r.name)
                if r.state in TUNNELLED and group is not None and group.cloud_to_cloud == DIRECT:
                    live.append(NodeLink(r.name, r.provider, r.wg_pubkey, r.mesh_addr))
            cached = (now, live)
            with self._lock:
                self._cache = cached
        return [replace(n, endpoint=endpoints.get(n.node, "")) for n in cached[1]]
