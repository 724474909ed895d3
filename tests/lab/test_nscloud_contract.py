"""Contract suite for cloud drivers, run here against the namespace cloud.

Any libcloud driver slurm-burst relies on must pass these checks (the EC2
emulator suite will reuse them): create is asynchronous and reaches running,
user-data ran as root, the SSH host key the provider reports is the one sshd
presents, tags filter listings, tokens make create idempotent, destroy leaves
nothing behind and may be repeated.
"""

from __future__ import annotations

import base64
import subprocess
import time
from pathlib import Path
from typing import Any

import paramiko
import pytest
from libcloud.common.types import LibcloudError
from libcloud.compute.base import Node, NodeAuthSSHKey
from libcloud.compute.types import NodeState

USERDATA = "#!/bin/sh\nset -e\nid -un > /root/userdata-ran\nhostname >> /root/userdata-ran\n"


def size(driver: Any, name: str) -> Any:
    return next(s for s in driver.list_sizes() if s.id == name)


def wait_state(driver: Any, node: Node, state: str, timeout: float = 10) -> Node:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current: Node = driver.list_nodes(ex_node_ids=[node.id])[0]
        if current.state == state:
            return current
        time.sleep(0.05)
    raise AssertionError(
        f"{node.id} not {state} after {timeout} s: {current.state} {current.extra}"
    )


def connect(node: Node, key: paramiko.Ed25519Key, wait: float = 5) -> paramiko.SSHClient:
    """An SSH session to ``node`` as root, trusting only the host key the provider
    reported (retried for ``wait`` seconds while sshd starts or the address's neighbour
    settles)."""
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    keytype, b64 = node.extra["ssh_host_key"].split()[:2]
    host_key = paramiko.PKey.from_type_string(keytype, base64.b64decode(b64))
    client.get_host_keys().add(node.public_ips[0], keytype, host_key)
    deadline = time.monotonic() + wait
    while True:
        try:
            client.connect(
                node.public_ips[0],
                username="root",
                pkey=key,
                timeout=2,
                allow_agent=False,
                look_for_keys=False,
            )
            return client
        except (paramiko.ssh_exception.NoValidConnectionsError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def ssh(
    node: Node, key: paramiko.Ed25519Key, command: str, timeout: float = 10, wait: float = 5
) -> str:
    """Run ``command`` over SSH (:func:`connect`, ``wait``); its output, once it exited 0."""
    client = connect(node, key, wait)
    try:
        _, out, err = client.exec_command(command, timeout=timeout)
        text = out.read().decode()
        assert out.channel.recv_exit_status() == 0, err.read().decode()
        return text
    finally:
        client.close()


@pytest.fixture(scope="module")
def client_key() -> paramiko.Ed25519Key:
    path = Path("/tmp/sbt-client-key")
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        input="y\n",
        text=True,
        capture_output=True,
    )
    key = paramiko.Ed25519Key.from_private_key_file(str(path))
    path.unlink()
    Path(str(path) + ".pub").unlink()
    return key


@pytest.fixture(scope="module")
def booted(nscloud: Any, client_key: paramiko.Ed25519Key) -> Node:
    auth = NodeAuthSSHKey(f"{client_key.get_name()} {client_key.get_base64()}")
    node = nscloud.create_node(
        "vm-contract",
        size(nscloud, "ns.gpu1"),
        nscloud.list_images()[0],
        auth=auth,
        ex_userdata=USERDATA,
        ex_metadata={"slurm-burst:cluster": "t", "slurm-burst:node": "vm-1"},
    )
    assert node.state == NodeState.PENDING
    return wait_state(nscloud, node, NodeState.RUNNING)


def test_catalogue(nscloud: Any) -> None:
    gpu = size(nscloud, "ns.gpu1")
    assert gpu.extra["gpus"] == 2 and gpu.extra["price_per_hour"] > 0
    assert [i.id for i in nscloud.list_images()] == ["host"]


def test_running_node_has_address_and_host_key(booted: Node) -> None:
    assert booted.public_ips and booted.public_ips[0].startswith("10.252.0.")
    assert booted.extra["ssh_host_key"].startswith("ssh-ed25519 ")


def test_sshd_presents_the_recorded_host_key_and_userdata_ran(
    booted: Node, client_key: paramiko.Ed25519Key
) -> None:
    assert ssh(booted, client_key, "cat /root/userdata-ran").split() == ["root", "vm-contract"]


def test_wrong_host_key_is_rejected(booted: Node, client_key: paramiko.Ed25519Key) -> None:
    """A valid ed25519 key that is not the VM's: the connection must be refused."""
    wrong = f"{client_key.get_name()} {client_key.get_base64()}"
    forged = Node(
        id=str(booted.id),
        name=booted.name,
        state=booted.state,
        public_ips=booted.public_ips,
        private_ips=[],
        driver=booted.driver,
        extra={"ssh_host_key": wrong},
    )
    with pytest.raises(paramiko.BadHostKeyException):
        ssh(forged, client_key, "true")


def test_vm_is_private(booted: Node, client_key: paramiko.Ed25519Key) -> None:
    """The VM sees the host's files as its image, never the host's secrets or hostname."""
    out = ssh(
        booted,
        client_key,
        "hostname; test ! -e /etc/munge/munge.key && echo no-munge-key; "
        "ls /etc/ssh | grep -c ssh_host_; cut -d' ' -f1 /proc/uptime; ls /run/simgpu",
    )
    lines = out.split()
    assert lines[0] == "vm-contract" and lines[1] == "no-munge-key"
    assert lines[2] == "2"  # only the fresh ed25519 pair
    assert float(lines[3]) < 60  # the time namespace makes it a fresh boot
    assert lines[4:] == ["nvidia0", "nvidia1"]  # the GPU size's device files
    assert Path("/etc/munge/munge.key").exists()  # ... and the host still has its own


def test_list_filters_by_tag(nscloud: Any, booted: Node) -> None:
    assert [n.id for n in nscloud.list_nodes(ex_filters={"tag:slurm-burst:node": "vm-1"})] == [
        booted.id
    ]
    assert nscloud.list_nodes(ex_filters={"tag:slurm-burst:node": "vm-2"}) == []


def test_token_makes_create_idempotent(nscloud: Any) -> None:
    args = ("vm-token", size(nscloud, "ns.cpu2"), nscloud.list_images()[0])
    first = nscloud.create_node(*args, ex_token="tok-1")
    second = nscloud.create_node(*args, ex_token="tok-1")
    assert first.id == second.id
    assert len([n for n in nscloud.list_nodes() if n.name == "vm-token"]) == 1
    nscloud.destroy_node(first)


def test_bad_requests_are_typed(nscloud: Any) -> None:
    img = nscloud.list_images()[0]
    bogus = size(nscloud, "ns.cpu2")
    bogus.id = "ns.huge"
    with pytest.raises(LibcloudError, match="InvalidParameterValue"):
        nscloud.create_node("vm-x", bogus, img)
    with pytest.raises(LibcloudError, match="bad instance name"):
        nscloud.create_node("vm;reboot", size(nscloud, "ns.cpu2"), img)


def test_destroy_leaves_nothing_and_is_repeatable(nscloud: Any) -> None:
    node = nscloud.create_node("vm-gone", size(nscloud, "ns.cpu2"), nscloud.list_images()[0])
    node = wait_state(nscloud, node, NodeState.RUNNING)
    vmdir = Path(nscloud.state_dir) / "vms" / str(node.id)
    assert nscloud.destroy_node(node) is True
    assert nscloud.list_nodes(ex_node_ids=[node.id])[0].state == NodeState.TERMINATED
    assert nscloud.destroy_node(node) is True  # already gone is success
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"sbl-{node.id}" not in netns
    assert not Path(f"/sys/class/net/sbv{str(node.id)[3:]}").exists()
    assert str(vmdir) not in Path("/proc/mounts").read_text()
    procs = subprocess.run(["pgrep", "-f", str(vmdir)], capture_output=True, text=True).stdout
    assert procs == ""
    assert sorted(p.name for p in vmdir.iterdir()) == ["meta.json"]


def test_destroy_during_boot_delay(nscloud: Any) -> None:
    node = nscloud.create_node("vm-early", size(nscloud, "ns.cpu2"), nscloud.list_images()[0])
    assert nscloud.destroy_node(node)
    assert nscloud.list_nodes(ex_node_ids=[node.id])[0].state == NodeState.TERMINATED
    assert (
        f"sbl-{node.id}"
        not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    )
