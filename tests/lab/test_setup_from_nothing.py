"""Set-up from nothing (make test-full only: about a quarter of an hour): a clean copy of
this checkout on a blank Debian host (the deployment tests' image: systemd, sshd, python3
and nothing of ours) runs `make setup` and then `make test-fast`, as a new user's first
commands would. A package that scripts/setup-system.sh or the venv step forgets is found
here, not by a user.

The host reaches only its bridge, so what the set-up fetches goes through relays on the
bridge's spare addresses, each a registry's name pinned in the host's /etc/hosts: the
Debian mirror (apt), PyPI's index and files (pip), the npm registry (Azurite). The host
gets `make` first: the README's commands start with it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import paramiko
import pytest
from libcloud.compute.base import Node, NodeAuthSSHKey
from libcloud.compute.types import NodeState
from slurm_burst_lab import images
from slurm_burst_lab.mirror import MirrorRelay, TcpRelay

from tests.conftest import ROOT
from tests.lab.test_nscloud_contract import client_key, connect, size, ssh, wait_state

__all__ = ["client_key"]  # the fixture, shared with the namespace cloud's contract

pytestmark = [pytest.mark.full, pytest.mark.timeout(3600)]

# the registries the set-up reaches, each on a spare address of the bridge (.2 to .9 are
# kept for the lab's own use)
REGISTRIES = {"pypi.org": 2, "files.pythonhosted.org": 3, "registry.npmjs.org": 4}
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"


@pytest.fixture(scope="module")
def blank(nscloud: Any, client_key: paramiko.Ed25519Key) -> Iterator[Node]:
    image = images.ensure_blank()
    nscloud.ex_set_host_image(str(image), (), init="systemd")
    auth = NodeAuthSSHKey(f"{client_key.get_name()} {client_key.get_base64()}")
    try:
        node = nscloud.create_node("fresh-1", size(nscloud, "ns.cpu2"), nscloud.list_images()[0],
                                   auth=auth)  # fmt: skip
    finally:
        nscloud.ex_set_host_image(None)
    node = wait_state(nscloud, node, NodeState.RUNNING)
    yield node
    nscloud.destroy_node(node)


@pytest.fixture(scope="module")
def relays(nscloud: Any) -> Iterator[list[str]]:
    """The /etc/hosts lines that send the host's apt, pip and npm through the relays."""
    gateway = nscloud.gateway
    with ExitStack() as stack:
        mirror = stack.enter_context(MirrorRelay(str(gateway)))
        lines = [mirror.hosts_line()]
        for name, host in REGISTRIES.items():
            address = str(gateway + (host - 1))
            subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", nscloud.bridge],
                           check=True)  # fmt: skip
            stack.callback(subprocess.run, ["ip", "addr", "del", f"{address}/32", "dev",
                                            nscloud.bridge], check=False)  # fmt: skip
            stack.enter_context(TcpRelay(address, 443, name))
            lines.append(f"{address}\t{name}")
        yield lines


def put(node: Node, key: paramiko.Ed25519Key, data: bytes, path: str) -> None:
    """``data`` into ``path`` on the host over SFTP (the contract suite's pinned session)."""
    client = connect(node, key)
    try:
        with client.open_sftp() as sftp, sftp.open(path, "wb") as fh:
            fh.write(data)
    finally:
        client.close()


def on(node: Node, key: paramiko.Ed25519Key, command: str, log: str, minutes: float) -> None:
    """``command`` on the host, its output in ``log`` there; on failure, its last lines."""
    t = time.monotonic()
    said = ssh(node, key, f"({command}) > {log} 2>&1; echo rc=$?; tail -n 40 {log}",
               timeout=minutes * 60)  # fmt: skip
    print(f"\nfresh host: {command!r} in {time.monotonic() - t:.0f} s")
    assert said.startswith("rc=0\n"), said


def test_a_clean_clone_on_a_blank_host_sets_up_and_passes_the_unit_tier(
    blank: Node, relays: list[str], client_key: paramiko.Ed25519Key
) -> None:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"],
                             check=True, capture_output=True).stdout  # fmt: skip
    hosts = "\n".join(relays)
    ssh(blank, client_key, f"printf '%s\\n' '{hosts}' >> /etc/hosts && mkdir /root/slurm-burst")
    put(blank, client_key, archive, "/root/slurm-burst.tar")
    ssh(blank, client_key, "tar -xf /root/slurm-burst.tar -C /root/slurm-burst")
    # the trust this machine has (its CA bundle, which its pip and node are set to use):
    # the registries are reached through the same egress as from here
    put(blank, client_key, Path(HOST_CA).read_bytes(), "/root/host-ca.crt")
    trust = " ".join(f"{v}=/root/host-ca.crt" for v in ("PIP_CERT", "NODE_EXTRA_CA_CERTS",
                                                         "SSL_CERT_FILE"))  # fmt: skip
    apt = "DEBIAN_FRONTEND=noninteractive apt-get"
    on(blank, client_key, f"{apt} update -q && {apt} install -y -q make", "/root/make.log", 10)
    on(blank, client_key, f"cd /root/slurm-burst && {trust} make setup", "/root/setup.log", 40)
    on(blank, client_key, "cd /root/slurm-burst && make test-fast", "/root/test-fast.log", 15)
    said = ssh(blank, client_key, "tail -n 3 /root/test-fast.log")
    assert " passed" in said and " failed" not in said, said
    # a second set-up installs nothing (idempotent, as the README says)
    on(blank, client_key, f"cd /root/slurm-burst && {trust} make setup", "/root/setup2.log", 10)
    again = ssh(blank, client_key, "cat /root/setup2.log")
    assert "all" in again and "installing" not in again, again
