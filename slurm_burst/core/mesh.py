"""WireGuard peers in our own terms (the hub adapter translates ``wg show`` output)."""

from __future__ import annotations

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
