"""The WireGuard hub: one interface on the controller side, one peer per cloud node.

The hub's private key is generated here (``wg genkey``) into ``state_dir``
(0700), never printed or logged. The persistent configuration
(``<state_dir>/<iface>.conf``, 0600, wg(8) format) is the source of truth:
every change rewrites it under a lock and applies it with ``wg syncconf``, which
adds and removes only what differs, so live peers keep their sessions.

Where the kernel has no WireGuard module, the interface comes from
``wireguard-go`` (userspace). The hub forwards between peers (node-to-node
traffic such as ``srun`` step launches) with forwarding enabled on the hub
interface only, not host-wide.

**Routes.** The subnet is routed ``unreachable`` and each peer's /32 through the
interface. An address with no peer yet (a node still booting, whose NodeAddr the
daemon has already set) then fails at once with "No route to host"; with the
subnet routed to the interface, wireguard-go would drop the packets silently and
every slurmctld message to such a node (``scontrol reconfigure`` sends one to each
node powering up) would wait out its timeout.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path

from slurm_burst.adapters.filelock import locked
from slurm_burst.adapters.proc import CommandError, run
from slurm_burst.core.mesh import MeshError, Peer, hub_address
from slurm_burst.fileio import PRIVATE, FileRefused, ensure_dir

log = logging.getLogger(__name__)

USERSPACE_ENV = {"WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD": "1"}


class WireGuardHub:
    def __init__(
        self,
        interface: str,
        subnet: str,
        port: int,
        state_dir: str,
        endpoint: str = "",
        keepalive: int = 15,
    ) -> None:
        self.interface = interface
        self.net = ipaddress.ip_network(subnet)
        self.address = f"{hub_address(subnet)}/{self.net.prefixlen}"
        self.port = port
        self.endpoint = endpoint
        self.keepalive = keepalive
        self.dir = Path(state_dir)
        self.conf = self.dir / f"{interface}.conf"
        self.key = self.dir / f"{interface}.key"
        self._public_key: str | None = None

    # -- hub --------------------------------------------------------------------
    def ensure_hub(self) -> str:
        """Create the interface, key and config as needed; return the hub's public key."""
        with self._locked():
            try:
                ensure_dir(self.dir, 0o700, what="mesh.state_dir")
            except FileRefused as exc:
                raise MeshError(str(exc)) from None
            if not self.key.exists():
                private = self._wg("genkey").strip()
                fd = os.open(self.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | PRIVATE, 0o600)
                with os.fdopen(fd, "w") as fh:
                    fh.write(private + "\n")
                log.info("mesh.hub.key_generated path=%s", self.key)
            if not self.conf.exists():
                self._write_conf([])
            if not self._link_exists():
                self._create_link()
            self._sync()
            run(["ip", "address", "replace", self.address, "dev", self.interface])
            run(["ip", "link", "set", "dev", self.interface, "up"])
            Path(f"/proc/sys/net/ipv4/conf/{self.interface}/forwarding").write_text("1\n")
            # replaces the interface's own subnet route (same destination)
            run(["ip", "route", "replace", "unreachable", str(self.net)])
            for peer in self._read_conf():
                self._route(peer.allowed_ips, add=True)
        return self.public_key()

    def _route(self, allowed: Sequence[str], add: bool) -> None:
        """Route a peer's addresses through the interface (or stop): best effort on removal."""
        for a in allowed:
            if add:
                run(["ip", "route", "replace", a, "dev", self.interface])
                continue
            with contextlib.suppress(CommandError):  # gone with a recreated interface
                run(["ip", "route", "del", a, "dev", self.interface])

    def public_key(self) -> str:
        if self._public_key is None:
            self._public_key = self._wg("pubkey", input_text=self.key.read_text()).strip()
        return self._public_key

    def node_config(self, allowed: Sequence[str]) -> str:
        """A node's wg(8) config for this hub, without a private key (the node adds its own)."""
        return "\n".join(
            [
                "# slurm-burst: tunnel to the cluster's WireGuard hub",
                "[Peer]",
                f"PublicKey = {self.public_key()}",
                f"Endpoint = {self.endpoint}:{self.port}",
                f"AllowedIPs = {', '.join(allowed)}",
                f"PersistentKeepalive = {self.keepalive}",
                "",
            ]
        )

    def down(self) -> None:
        """Remove the interface (wireguard-go exits with it); keep key and config."""
        if self._link_exists():
            run(["ip", "link", "delete", "dev", self.interface])
        with contextlib.suppress(CommandError):  # not there
            run(["ip", "route", "del", "unreachable", str(self.net)])

    def _create_link(self) -> None:
        try:
            run(["ip", "link", "add", "dev", self.interface, "type", "wireguard"])
            return
        except CommandError:
            pass  # no kernel module: userspace
        try:
            run(["wireguard-go", self.interface], env=USERSPACE_ENV, timeout=15)
        except CommandError as exc:
            raise MeshError(f"cannot create {self.interface}: {exc}") from exc
        log.info("mesh.hub.created interface=%s userspace=wireguard-go", self.interface)

    def _link_exists(self) -> bool:
        return Path(f"/sys/class/net/{self.interface}").exists()

    # -- peers --------------------------------------------------------------------
    def add_peer(self, public_key: str, address: str, node: str) -> None:
        """Add (or update) the node's peer: its /32 only; idempotent."""
        allowed = f"{ipaddress.ip_address(address)}/32"
        with self._locked():
            peers = [
                p
                for p in self._read_conf()
                if p.public_key != public_key and allowed not in p.allowed_ips
            ]
            peers.append(Peer(public_key, (allowed,), comment=node))
            self._write_conf(peers)
            self._sync()
            self._route((allowed,), add=True)
        log.info("mesh.peer.added node=%s address=%s", node, address)

    def remove_peer(self, public_key: str) -> None:
        with self._locked():
            peers = self._read_conf()
            kept = [p for p in peers if p.public_key != public_key]
            if len(kept) != len(peers):
                self._write_conf(kept)
                self._sync()
                gone = {a for p in peers if p.public_key == public_key for a in p.allowed_ips}
                self._route(sorted(gone - {a for p in kept for a in p.allowed_ips}), add=False)
                log.info("mesh.peer.removed peers_left=%d", len(kept))

    def peers(self) -> list[Peer]:
        """Live peers from ``wg show dump`` (with handshake times), commented from config."""
        comments = {p.public_key: p.comment for p in self._read_conf()}
        out = []
        try:
            dump = self._wg("show", self.interface, "dump")
        except MeshError:
            return []
        for line in dump.splitlines()[1:]:
            f = line.split("\t")
            if len(f) < 8:
                continue
            out.append(
                Peer(
                    public_key=f[0],
                    allowed_ips=tuple(a for a in f[3].split(",") if a and a != "(none)"),
                    endpoint="" if f[2] == "(none)" else f[2],
                    latest_handshake=int(f[4] or 0),
                    comment=comments.get(f[0], ""),
                )
            )
        return out

    # -- config file ----------------------------------------------------------------
    def _read_conf(self) -> list[Peer]:
        if not self.conf.exists():
            return []
        peers: list[Peer] = []
        cur: dict[str, str] | None = None
        comment = ""
        for raw in self.conf.read_text().splitlines():
            line = raw.strip()
            if line.startswith("# node "):
                comment = line.removeprefix("# node ").strip()
            elif line == "[Peer]":
                if cur:
                    peers.append(_peer(cur))
                cur = {"comment": comment}
                comment = ""
            elif cur is not None and "=" in line:
                k, v = line.split("=", 1)
                cur[k.strip()] = v.strip()
        if cur:
            peers.append(_peer(cur))
        return peers

    def _write_conf(self, peers: list[Peer]) -> None:
        lines = [
            "# slurm-burst WireGuard hub; written by the daemon, applied with wg syncconf.",
            "[Interface]",
            f"PrivateKey = {self.key.read_text().strip()}",
            f"ListenPort = {self.port}",
        ]
        for p in peers:
            lines += [
                "",
                f"# node {p.comment}",
                "[Peer]",
                f"PublicKey = {p.public_key}",
                f"AllowedIPs = {', '.join(p.allowed_ips)}",
            ]
        tmp = self.conf.with_name(self.conf.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | PRIVATE, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        os.replace(tmp, self.conf)

    def _sync(self) -> None:
        self._wg("syncconf", self.interface, str(self.conf))

    def _wg(self, *args: str, input_text: str | None = None) -> str:
        try:
            return run(["wg", *args], input_text=input_text, timeout=15).stdout
        except CommandError as exc:
            # wg's own messages never contain key material; ours must not either
            raise MeshError(f"wg {args[0]}: {exc.stderr or exc.reason}") from exc

    def _locked(self) -> AbstractContextManager[None]:
        return locked(self.dir)


def _peer(d: dict[str, str]) -> Peer:
    return Peer(
        public_key=d.get("PublicKey", ""),
        allowed_ips=tuple(a.strip() for a in d.get("AllowedIPs", "").split(",") if a.strip()),
        comment=d.get("comment", ""),
    )
