"""Host keys read through each provider's API open the VM that holds them, and no other.

Two namespace VMs boot with fresh host keys. VM A's keys are put into GCE's, Azure's and
OpenStack's answers in their recorded shapes (tests/data/providers/), read back through
libcloud's own drivers and our host-key sources, and handed to the daemon's SSH
connector: it reaches A, and refuses B, whose keys differ.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from libcloud.compute.base import Node, NodeAuthSSHKey
from libcloud.compute.types import NodeState

from slurm_burst.adapters.ssh.session import SshConnector, SshError
from slurm_burst.core.hostkeys import parse_console_host_keys
from tests.conftest import wait
from tests.providers import NOVA, Http, key_values

pytest.importorskip("responses", reason="needs responses (make test installs it)")


@pytest.fixture(scope="module")
def connector(tmp_path_factory: pytest.TempPathFactory) -> SshConnector:
    key = tmp_path_factory.mktemp("client") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return SshConnector("root", str(key), connect_timeout=5)


@pytest.fixture(scope="module")
def vms(nscloud: Any, connector: SshConnector) -> dict[str, tuple[Node, list[tuple[str, str]]]]:
    """Two running VMs, each with the host keys its console shows."""
    pub = Path(connector.key_path + ".pub").read_text().strip()
    size = next(s for s in nscloud.list_sizes() if s.id == "ns.cpu2")
    out = {}
    for name in ("vm-a", "vm-b"):
        node = nscloud.create_node(name, size, nscloud.list_images()[0], auth=NodeAuthSSHKey(pub))

        def running(node: Node = node) -> Node | None:
            now = nscloud.list_nodes(ex_node_ids=[node.id])[0]
            return now if now.state == NodeState.RUNNING else None

        node = wait(running, 30, f"{name} running")

        def published(node: Node = node) -> list[tuple[str, str]]:
            return parse_console_host_keys(nscloud.ex_get_console_output(node))

        keys = wait(published, 30, f"{name}'s host keys on its console")
        out[name] = (node, keys)
    assert out["vm-a"][1] != out["vm-b"][1]
    return out


def gce_attributes(http: Http, gce: Any, azure: Any, openstack: Any) -> list[tuple[str, str]]:
    cloud = gce(http)
    return list(cloud.host_keys(cloud.list_instances("c1")[0].id))


def gce_serial(http: Http, gce: Any, azure: Any, openstack: Any) -> list[tuple[str, str]]:
    cloud = gce(http, host_keys="serial-port")
    return list(cloud.host_keys(cloud.list_instances("c1")[0].id))


def azure_boot_diagnostics(
    http: Http, gce: Any, azure: Any, openstack: Any
) -> list[tuple[str, str]]:
    cloud = azure(http, {("GET", ".serialconsole.log"): (200, "serialconsole.log")})
    return list(cloud.host_keys(cloud.list_instances("c1")[0].id))


def openstack_console(http: Http, gce: Any, azure: Any, openstack: Any) -> list[tuple[str, str]]:
    http.on("GET", rf"{NOVA}/servers/detail", "openstack/servers_detail.json")
    http.on("POST", rf"{NOVA}/servers/srv-0001/action$", "openstack/server_console.json")
    return list(openstack.host_keys("srv-0001"))


Reader = Callable[[Http, Any, Any, Any], list[tuple[str, str]]]


@pytest.mark.parametrize(
    "read",
    [gce_attributes, gce_serial, azure_boot_diagnostics, openstack_console],
    ids=["gce-guest-attributes", "gce-serial-port", "azure-boot-diagnostics", "openstack"],
)
def test_keys_from_the_api_open_their_vm_and_no_other(
    read: Reader,
    vms: dict[str, tuple[Node, list[tuple[str, str]]]],
    connector: SshConnector,
    http: Http,
    gce: Any,
    azure: Any,
    openstack: Any,
) -> None:
    (a, a_keys), (b, _) = vms["vm-a"], vms["vm-b"]
    http.values.update(key_values(a_keys))
    keys = read(http, gce, azure, openstack)
    assert sorted(keys) == sorted(a_keys)
    session = connector.connect(a.public_ips[0], keys, time.monotonic() + 20)
    try:
        assert session.run(["hostname"]).strip() == "vm-a"
    finally:
        session.close()
    with pytest.raises(SshError) as refused:
        connector.connect(b.public_ips[0], keys, time.monotonic() + 20).close()
    assert refused.value.code == "HostKeyMismatch"
