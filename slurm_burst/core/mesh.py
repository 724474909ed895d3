"""WireGuard peers in our own terms (the hub adapter translates ``wg show`` output)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from slurm_burst.core.errors import BurstError


class MeshError(BurstError):
    """The hub cannot be set up or changed; the message names the command."""

    code = "MeshError"


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
