"""The WireGuard hub in memory."""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Sequence
from dataclasses import replace

from slurm_burst.core.mesh import MeshError, Peer
from slurm_burst.ports import Clock


def wg_key(seed: str) -> str:
    """A WireGuard public key's shape (44 characters of base64), stable per seed."""
    return base64.b64encode(hashlib.sha256(seed.encode()).digest()).decode()


class FakeMesh:
    """The Mesh port. A peer's first handshake happens when the node brings its tunnel
    up (the fake node calls :meth:`handshake`), unless ``silent`` (packets dropped on
    the way). ``fail_add`` makes ``add_peer`` fail as ``wg set`` would."""

    def __init__(self, clock: Clock, endpoint: str = "192.0.2.1:51820") -> None:
        self.clock = clock
        self.endpoint = endpoint
        self.public_key = wg_key("hub")
        self._peers: dict[str, Peer] = {}
        self.silent = False
        self.fail_add = False
        self._lock = threading.Lock()

    def ensure_hub(self) -> str:
        return self.public_key

    def add_peer(self, public_key: str, address: str, node: str) -> None:
        if self.fail_add:
            raise MeshError(f"wg set: peer {public_key[:8]}...: interface is gone")
        allowed = f"{address}/32"
        with self._lock:
            old = self._peers.get(public_key)
            for key in [k for k, p in self._peers.items() if allowed in p.allowed_ips]:
                del self._peers[key]  # an address moves to its new holder
            self._peers[public_key] = Peer(
                public_key,
                (allowed,),
                latest_handshake=old.latest_handshake if old else 0,
                comment=node,
            )

    def remove_peer(self, public_key: str) -> None:
        with self._lock:
            self._peers.pop(public_key, None)

    def peers(self) -> list[Peer]:
        with self._lock:
            return list(self._peers.values())

    def node_config(self, allowed: Sequence[str]) -> str:
        return (
            "[Peer]\n"
            f"PublicKey = {self.public_key}\n"
            f"Endpoint = {self.endpoint}\n"
            f"AllowedIPs = {', '.join(allowed)}\n"
            "PersistentKeepalive = 15\n"
        )

    # -- what the fake node does ---------------------------------------------------
    def handshake(self, public_key: str) -> None:
        with self._lock:
            peer = self._peers.get(public_key)
            if peer is not None and not self.silent:
                self._peers[public_key] = replace(peer, latest_handshake=int(self.clock.now()))
