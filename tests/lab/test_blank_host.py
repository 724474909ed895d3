"""A blank host: a VM booted from a debootstrapped image (systemd, sshd, python3 and
python3-apt, as a Debian cloud image has them; nothing else) with the image's systemd as
PID 1, reached over SSH like a real host. It is where the Ansible collection is deployed
(issue 16)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import paramiko
import pytest
from libcloud.compute.base import Node, NodeAuthSSHKey
from libcloud.compute.types import NodeState
from slurm_burst_lab import images
from slurm_burst_lab.mirror import MirrorRelay

from tests.lab.test_nscloud_contract import client_key, size, ssh, wait_state

__all__ = ["client_key"]  # the fixture, shared with the namespace cloud's contract


@pytest.fixture(scope="module")
def blank(nscloud: Any, client_key: paramiko.Ed25519Key) -> Node:
    image = images.ensure_blank()
    nscloud.ex_set_host_image(str(image), (), init="systemd")
    auth = NodeAuthSSHKey(f"{client_key.get_name()} {client_key.get_base64()}")
    node = nscloud.create_node("blank-1", size(nscloud, "ns.cpu2"), nscloud.list_images()[0],
                               auth=auth)  # fmt: skip
    return wait_state(nscloud, node, NodeState.RUNNING)


def test_the_blank_host_runs_systemd_and_answers_ssh(
    blank: Node, client_key: paramiko.Ed25519Key
) -> None:
    # the host key is the one the VM made and printed: ssh() trusts only that one
    state = ssh(blank, client_key, "systemctl is-system-running --wait || true").strip()
    assert state == "running", ssh(blank, client_key, "systemctl --failed --no-pager")
    assert ssh(blank, client_key, "cat /proc/1/comm").strip() == "systemd"
    assert ssh(blank, client_key, "systemctl is-active ssh.service").strip() == "active"
    assert ssh(blank, client_key, "python3 -c 'print(6*7)'").strip() == "42"
    # nothing of Slurm, munge or this project: the deployment has it all to do
    absent = "for p in slurmctld slurmd munged wg slurm-burst; do command -v $p; done; true"
    assert ssh(blank, client_key, absent).strip() == ""
    assert ssh(blank, client_key, "hostname").strip() == "blank-1"


def test_the_blank_host_gets_apt_through_the_mirror_relay(
    nscloud: Any, blank: Node, client_key: paramiko.Ed25519Key
) -> None:
    """No NAT here: the relay on the bridge's address carries apt to the host's mirror."""
    with MirrorRelay(str(nscloud.gateway)) as relay:
        ssh(blank, client_key, f"echo '{relay.hosts_line()}' >> /etc/hosts")
        out = ssh(blank, client_key, "apt-get update -q -o Acquire::Languages=none 2>&1",
                  timeout=120)  # fmt: skip
        assert f"http://{relay.host}" in out or f"https://{relay.host}" in out, out
        policy = ssh(blank, client_key, "apt-cache policy wireguard-tools")
        assert "Candidate:" in policy and "(none)" not in policy.split("Candidate:")[1], policy


def test_halting_the_blank_host_leaves_no_cgroup(
    nscloud: Any, blank: Node, client_key: paramiko.Ed25519Key
) -> None:
    netns = f"sbl-{blank.id}"
    cgroups = [Path(f"/sys/fs/cgroup/{h}/{netns}") for h in ("systemd", "unified")]
    assert all(c.is_dir() for c in cgroups)
    t = time.monotonic()
    nscloud.destroy_node(blank)
    print(f"\nblank host: systemd powered off and the VM removed in {time.monotonic() - t:.1f} s")
    assert not any(c.exists() for c in cgroups)
    nscloud.ex_set_host_image(None)
