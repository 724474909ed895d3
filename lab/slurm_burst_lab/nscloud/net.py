"""Bridges, veth pairs and network namespaces, through iproute2 (argument lists only)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
from pathlib import Path

from slurm_burst.adapters.proc import CommandError, run

NETNS_DIR = Path("/run/netns")


def link_exists(name: str) -> bool:
    return bool(name) and Path("/sys/class/net", name).exists()


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def ensure_bridge(name: str, gateway_cidr: str) -> None:
    """Create bridge ``name`` holding ``gateway_cidr`` (idempotent)."""
    if not link_exists(name):
        run(["ip", "link", "add", "name", name, "type", "bridge"])
    iface = ipaddress.ip_interface(gateway_cidr)
    have = run(["ip", "-o", "addr", "show", "dev", name]).stdout
    if f" {iface.with_prefixlen} " not in have:
        run(["ip", "addr", "add", iface.with_prefixlen, "dev", name])
    run(["ip", "link", "set", name, "up"])
    # Bridged frames must not be judged by the host's iptables (Docker-style hosts drop them).
    nf = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    if nf.exists() and nf.read_text().strip() != "0":
        with contextlib.suppress(OSError):
            nf.write_text("0")


def delete_link(name: str) -> None:
    if name and link_exists(name):
        try:
            run(["ip", "link", "del", name])
        except CommandError:
            if link_exists(name):
                raise


def create_guest_network(
    netns: str, host_if: str, bridge: str, address_cidr: str, gateway: str
) -> None:
    """Network namespace ``netns`` with eth0 = ``address_cidr`` on ``bridge`` via veth."""
    if not netns_exists(netns):
        run(["ip", "netns", "add", netns])
    if not link_exists(host_if):
        run(["ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", netns])
    run(["ip", "link", "set", host_if, "master", bridge, "up"])
    ns = ["ip", "-n", netns]
    run([*ns, "link", "set", "lo", "up"])
    have = run([*ns, "-o", "addr", "show", "dev", "eth0"]).stdout
    if f" {address_cidr} " not in have:
        run([*ns, "addr", "add", address_cidr, "dev", "eth0"])
    run([*ns, "link", "set", "eth0", "up"])
    run([*ns, "route", "replace", "default", "via", gateway])


def delete_guest_network(netns: str, host_if: str) -> None:
    delete_link(host_if)
    if netns_exists(netns):
        try:
            run(["ip", "netns", "del", netns])
        except CommandError:
            if netns_exists(netns):
                raise


def list_netns(prefix: str) -> list[str]:
    if not NETNS_DIR.is_dir():
        return []
    return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(prefix))
