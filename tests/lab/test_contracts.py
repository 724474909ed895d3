"""The port contracts on the real adapters that need root: the namespace cloud through the
Cloud adapter, the WireGuard hub (wireguard-go), SSH to a namespace VM's sshd, and Slurm's
own slurmctld. The in-memory fakes pass the same suites (tests/unit/test_fakes_contract.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from libcloud.compute.base import NodeAuthSSHKey
from slurm_burst_lab.service import Lab

from slurm_burst.adapters.clock import SystemClock
from slurm_burst.adapters.cloud.compute import LibcloudCloud
from slurm_burst.adapters.mesh.wireguard import WireGuardHub
from slurm_burst.adapters.proc import run
from slurm_burst.adapters.slurm.cli import SlurmCli
from slurm_burst.adapters.ssh.session import SshConnector, generate_key
from slurm_burst.core.cloud import Instance, LaunchSpec
from tests.conftest import wait
from tests.contracts.cloud import CloudContract
from tests.contracts.mesh import MeshContract
from tests.contracts.slurm import SchedulerContract
from tests.contracts.ssh import ShellContract


@pytest.fixture(scope="module")
def daemon_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A key pair as the daemon makes its own: (private key path, public key line)."""
    path = str(tmp_path_factory.mktemp("ssh") / "id_ed25519")
    return path, generate_key(path)


class TestNamespaceCloudContract(CloudContract):
    @pytest.fixture()
    def cloud(self, nscloud: Any) -> LibcloudCloud:
        return LibcloudCloud("lab", nscloud)

    @pytest.fixture()
    def cluster(self) -> str:
        return "contract"

    @pytest.fixture()
    def make_spec(self, daemon_key: tuple[str, str]) -> Callable[..., LaunchSpec]:
        def make(node: str, token: str, count: int = 1) -> LaunchSpec:
            return LaunchSpec(node, "contract", "cpu", "ns.cpu2", "host", token, daemon_key[1],
                              "#!/bin/sh\n", count=count)  # fmt: skip

        return make

    @pytest.fixture()
    def settle(self) -> Callable[[], None]:
        return lambda: time.sleep(0.5)


class TestWireGuardHubContract(MeshContract):
    @pytest.fixture()
    def mesh(self, tmp_path: Path) -> Iterator[WireGuardHub]:
        hub = WireGuardHub("sbt-wg0", "10.66.0.0/24", 51899, str(tmp_path / "wg"), "10.66.0.1")
        yield hub
        hub.down()

    def test_an_address_without_a_peer_is_unreachable_at_once(self, mesh: WireGuardHub) -> None:
        """Not silently dropped (wireguard-go would): slurmctld's message to a node that
        is still booting fails at once instead of waiting out its timeout."""
        import socket

        mesh.ensure_hub()
        key = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
        mesh.add_peer(key, "10.66.0.7", "n7")

        def route(addr: str) -> str:
            return run(["ip", "route", "get", addr], check=False).stdout

        assert "dev sbt-wg0" in route("10.66.0.7")
        t = time.monotonic()
        with pytest.raises(OSError, match="No route to host"):
            socket.create_connection(("10.66.0.8", 6818), timeout=5)
        assert time.monotonic() - t < 1
        mesh.remove_peer(key)
        assert "dev sbt-wg0" not in route("10.66.0.7")
        mesh.down()
        assert "10.66.0.0/24" not in run(["ip", "route"]).stdout  # down removes it


@pytest.fixture(scope="module")
def vm(nscloud: Any, daemon_key: tuple[str, str]) -> Iterator[tuple[str, Any]]:
    """A namespace VM with the daemon's key in root's authorized keys: (address, its cloud
    and instance id)."""
    size = next(s for s in nscloud.list_sizes() if s.id == "ns.cpu2")
    node = nscloud.create_node(
        "vm-ssh-contract", size, nscloud.list_images()[0], auth=NodeAuthSSHKey(daemon_key[1])
    )
    cloud = LibcloudCloud("lab", nscloud)

    def running() -> Instance | None:
        inst = cloud.get(node.id)
        return inst if inst is not None and inst.state == "running" and inst.address else None

    yield wait(running, 30, "the VM running").address, (cloud, node.id)
    nscloud.destroy_node(node)


class TestSshContract(ShellContract):
    @pytest.fixture()
    def node(self, vm: tuple[str, Any]) -> tuple[str, list[tuple[str, str]]]:
        address, (cloud, node_id) = vm
        keys = wait(lambda: cloud.host_keys(node_id), 30, "the VM's host key on its console")
        return address, keys

    @pytest.fixture()
    def connector(self, daemon_key: tuple[str, str]) -> SshConnector:
        return SshConnector("root", daemon_key[0], connect_timeout=1.0)

    @pytest.fixture()
    def clock(self) -> SystemClock:
        return SystemClock()

    @pytest.fixture()
    def nowhere(self) -> str:
        return "10.252.0.250"  # in the cloud's subnet, no VM there


class TestSlurmContract(SchedulerContract):
    @pytest.fixture()
    def scheduler(self, lab: Lab) -> SlurmCli:
        return lab.slurm

    @pytest.fixture()
    def names(self) -> list[str]:
        return ["burst-gpu-1", "burst-gpu-2"]
