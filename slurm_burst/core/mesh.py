"""WireGuard peers in our own terms (the hub adapter translates ``wg show`` output)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from slurm_burst.core.errors import BurstError


class MeshError(BurstError):
    """The hub cannot be set up or changed; the message names the command."""

    code = "MeshError"


class Refused(BurstError):
    """A request of a node's agent the node API does not serve; ``status`` is the HTTP
    answer (403: no live node of a directly tunnelling group at that address; 400: a bad
    endpoint)."""

    code = "NodeApiRefused"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message, self.code)
        self.status = status


@dataclass(frozen=True)
class Peer:
    public_key: str
    allowed_ips: tuple[str, ...]
    endpoint: str = ""
    latest_handshake: int = 0  # unix time, 0 = never
    comment: str = ""  # the node name, where the hub knows it


def hub_address(subnet: str) -> str:
    """The hub's address in the mesh: the subnet's first host."""
    return str(next(ipaddress.ip_network(subnet).hosts()))


def parking_address(subnet: str) -> str:
    """Where a released node's NodeAddr points: the mesh subnet's network address, never
    a node's. Reset to the node's name instead, every message slurmctld still sends to a
    node just failed (job kills, requeues) would wait ~10 s in getaddrinfo for a name no
    resolver knows, one node after another, holding slurmctld up; the hub routes the
    subnet unreachable, so a message to this address fails at once."""
    return str(ipaddress.ip_network(subnet).network_address)


@dataclass(frozen=True)
class NodeLink:
    """What a node's direct tunnels need of another cloud node: its WireGuard key, its
    mesh address, and where its tunnel listens (its private address and port), as its
    agent last said; ``provider`` is the provider profile (provider and region)."""

    node: str
    provider: str
    public_key: str
    address: str
    endpoint: str = ""


def direct_peers(me: NodeLink, others: Iterable[NodeLink]) -> list[NodeLink]:
    """The nodes ``me`` tunnels to directly: the others of its provider profile with a
    key, a mesh address and an endpoint, by name (deterministic for the agent's diff)."""
    return sorted(
        (
            o
            for o in others
            if o.node != me.node
            and o.provider == me.provider
            and o.public_key
            and o.address
            and o.endpoint
        ),
        key=lambda o: o.node,
    )


def endpoint_of(text: str, subnet: str) -> str:
    """An agent's ``ADDRESS:PORT`` (IPv6 in brackets) as given, checked: a unicast
    address outside the mesh subnet and a port 1..65535; raises ValueError saying why."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"endpoint {text[:60]!r}: ADDRESS:PORT with a port 1 to 65535")
    addr = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    if addr.is_multicast or addr.is_unspecified or addr.is_loopback:
        raise ValueError(f"endpoint {text[:60]!r}: not a unicast address")
    if addr in ipaddress.ip_network(subnet):
        raise ValueError(f"endpoint {text[:60]!r}: inside the mesh (a tunnel in a tunnel)")
    return f"[{addr}]:{port}" if addr.version == 6 else f"{addr}:{port}"
