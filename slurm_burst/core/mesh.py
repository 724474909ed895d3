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


_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated ::a.b.c.d
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def node_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """``text`` as an address a node could really have (a unicast address of its own
    network), its IPv4 form where it is an IPv4-mapped IPv6 one; ValueError saying why
    otherwise. Every IPv6 spelling of an IPv4 address (mapped, compatible, 6to4,
    Teredo, NAT64) is unwrapped or refused first, so that no check written for the IPv4
    form (loopback, the mesh's own addresses) is passed by another spelling."""
    addr = ipaddress.ip_address(text)  # ValueError for what is no address
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.scope_id:
            raise ValueError("an address with a zone")
        if addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        elif addr.sixtofour is not None or addr.teredo is not None:
            raise ValueError("a tunnelled IPv4 address (6to4, Teredo)")
        elif (addr in _IPV4_COMPATIBLE and int(addr) > 1) or addr in _NAT64:
            raise ValueError("an IPv4 address in IPv6 form (compatible, NAT64)")
    if addr.is_multicast or addr.is_unspecified or addr.is_loopback:
        raise ValueError("not a unicast address")
    if addr.is_link_local or addr.is_reserved:  # 169.254/16, fe80::/10, 240/4 and broadcast
        raise ValueError("not an address a node is reached at (link-local or reserved)")
    if addr in _THIS_NETWORK:
        raise ValueError("not an address a node is reached at (0.0.0.0/8)")
    return addr


def endpoint_of(text: str, subnet: str) -> str:
    """An agent's ``ADDRESS:PORT`` (IPv6 in brackets), checked: an address a node could
    have (:func:`node_address`), outside the mesh subnet, and a port 1..65535; written
    back in its one canonical form (an IPv4-mapped address as IPv4). ValueError saying
    why otherwise."""
    host, sep, port = text.rpartition(":")
    if not (sep and port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536):
        raise ValueError(f"endpoint {text[:60]!r}: ADDRESS:PORT with a port 1 to 65535")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed == (":" not in host):  # [IPv6]:PORT, IPv4:PORT
        raise ValueError(f"endpoint {text[:60]!r}: [IPv6]:PORT or IPv4:PORT")
    try:
        addr = node_address(host[1:-1] if bracketed else host)
    except ValueError as exc:
        raise ValueError(f"endpoint {text[:60]!r}: {exc}") from None
    if addr in ipaddress.ip_network(subnet):
        raise ValueError(f"endpoint {text[:60]!r}: inside the mesh (a tunnel in a tunnel)")
    return f"[{addr}]:{int(port)}" if addr.version == 6 else f"{addr}:{int(port)}"
