"""The Ansible collection deploys slurm-burst onto a blank host, and a job bursts through it.

The blank host is a VM on the lab's cloud bridge booted from a debootstrapped image
(systemd, sshd, python3 and python3-apt, nothing else), reached over SSH like a real host
(``ansible-playbook`` with OpenSSH, the VM's own host key pinned). ``deploy/site.yml``
plays the site's own Slurm and munge roles (Debian's slurmctld, apt through the lab's
mirror relay); then ``playbooks/controller.yml`` installs slurm-burst from a wheelhouse
built from this checkout, configures it for EC2 against the lab's EC2 emulator (relayed
onto the bridge), and starts it under systemd. A batch job on the burst partition then
runs on EC2 instances that deployed daemon launched, bootstrapped and joined over its
WireGuard hub; a second run changes nothing; a broken variable stops the play and leaves
the running daemon as it was.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import paramiko
import pytest
import yaml
from libcloud.compute.base import Node, NodeAuthSSHKey
from libcloud.compute.providers import get_driver
from libcloud.compute.types import NodeState, Provider
from slurm_burst_lab import images
from slurm_burst_lab.components import EC2_CREDENTIALS
from slurm_burst_lab.labvms import register_image
from slurm_burst_lab.mirror import MirrorRelay, TcpRelay
from slurm_burst_lab.service import Lab

from slurm_burst.config import Config
from slurm_burst.core.cloud import CLUSTER_TAG
from tests.conftest import ROOT, wait
from tests.lab.conftest import DEPLOY
from tests.lab.test_nscloud_contract import size, ssh, wait_state
from tests.lab.test_x_ec2 import emulator_calls

COLLECTION = ROOT / "ansible"
SITE = Path(__file__).parent / "deploy"
RULES = ROOT / "slurm-conf" / "prometheus" / "slurm-burst.rules.yml"  # the role installs it
BIN = Path(sys.executable).parent
HOST = "ctl-1"
LAN_ADDR = "10.240.0.10"  # the controller's "LAN" address (on lo): where users reach it
CLUSTER = "deploylab"
NODES = "burst-ec2-[1-2]"
NODE_AMI = "ami-0a1b2c3d4e5f60718"  # the image the node_image role bakes
ALL_NODES = f"{NODES},burst-img-1"  # the ec2 group and the one node of the baked image


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("deploy")


@pytest.fixture(scope="module")
def wheelhouse(work: Path) -> Path:
    """This checkout's two wheels, the product's and the lab's, with every dependency as a
    wheel (the host has no index); the controller role installs the product's only."""
    out = work / "wheelhouse"
    t = time.monotonic()
    for project in (ROOT, ROOT / "lab"):
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(out),
             str(project)],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
    subprocess.run(  # the product's dependencies (the lab's are not the host's business)
        [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(out),
         str(next(out.glob("slurm_burst-*.whl")))],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    assert len(list(out.glob("slurm_burst_lab-*.whl"))) == 1
    DEPLOY["wheelhouse (pip wheel)"] = time.monotonic() - t
    return out


@pytest.fixture(scope="module")
def key(work: Path) -> Path:
    path = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def boot_blank(cloud: Any, name: str, key: Path, pkey: paramiko.Ed25519Key) -> Node:
    """A blank host, on the lab's cloud bridge (beside the EC2 emulator's instances)."""
    t = time.monotonic()
    image = images.ensure_blank()
    cloud.ex_set_host_image(str(image), (), init="systemd")
    try:
        node = cloud.create_node(
            name=name, size=size(cloud, "ns.cpu2"), image=cloud.list_images()[0],
            auth=NodeAuthSSHKey(Path(f"{key}.pub").read_text().strip()),
        )  # fmt: skip
    finally:
        cloud.ex_set_host_image(None)  # the lab's own VMs boot the host again
    node = wait_state(cloud, node, NodeState.RUNNING, timeout=30)
    # sshd answers: the image's systemd starts it after the VM is RUNNING, seconds later
    # on a loaded machine (CI once took over the 5 s a vminit VM is given)
    ssh(node, pkey, "true", wait=120)
    DEPLOY[f"boot {name}"] = time.monotonic() - t
    return node


def reach(work: Path, node: Node, key: Path, mirror: MirrorRelay) -> dict[str, str]:
    """How Ansible reaches ``node``: root, the test's key, only the host key it printed."""
    known = work / f"known_hosts.{node.name}"
    known.write_text(f"{node.public_ips[0]} {node.extra['ssh_host_key']}\n")
    return {
        "ansible_host": node.public_ips[0],
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(key),
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes",
        "ansible_python_interpreter": "/usr/bin/python3",
        "lab_mirror_hosts_line": mirror.hosts_line(),  # the lab's apt, for the site play
    }


@pytest.fixture(scope="module")
def controller(
    lab: Lab, lab_config: Config, cloud: Any, key: Path, pkey: paramiko.Ed25519Key
) -> Iterator[Node]:
    node = boot_blank(cloud, HOST, key, pkey)
    yield node
    cloud.destroy_node(node)
    # whatever the deployed daemon did not get to release (a failed test) goes too
    ec2 = get_driver(Provider.EC2)(
        EC2_CREDENTIALS["key"], EC2_CREDENTIALS["secret"], region="us-east-1",
        host="127.0.0.1", port=int(lab_config.providers["aws"].options["port"]), secure=False,
    )  # fmt: skip
    for instance in ec2.list_nodes():
        if (
            instance.extra.get("tags", {}).get(CLUSTER_TAG) == CLUSTER
            and instance.state != "terminated"
        ):
            ec2.destroy_node(instance)


@pytest.fixture(scope="module")
def relays(lab: Lab, lab_config: Config) -> Iterator[tuple[MirrorRelay, TcpRelay]]:
    """apt's mirror and the EC2 emulator's API, on the cloud bridge's address."""
    gateway = str(next(ip_network(lab_config.providers["lab"].options["subnet"]).hosts()))
    port = int(lab_config.providers["aws"].options["port"])
    with MirrorRelay(gateway) as mirror, TcpRelay(gateway, port, "127.0.0.1") as ec2:
        yield mirror, ec2


@pytest.fixture(scope="module")
def pkey(key: Path) -> paramiko.Ed25519Key:
    return paramiko.Ed25519Key.from_private_key_file(str(key))


def run_on(node: Node, pkey: paramiko.Ed25519Key, command: str, timeout: float = 60) -> str:
    """``command`` on ``node`` over SSH: its output (a failure fails the test)."""
    return ssh(node, pkey, command, timeout=timeout)


def on(node: Node, pkey: paramiko.Ed25519Key) -> Callable[..., str]:
    """``run(command, timeout=60)`` on ``node``: :func:`run_on` bound to it."""
    return partial(run_on, node, pkey)


def site_config(node: Node, ec2: TcpRelay) -> dict[str, Any]:
    """The slurm-burst config the site writes as YAML: EC2 (the lab's emulator)."""
    return {
        "cluster": {"name": CLUSTER, "controller_host": HOST, "controller_addr": LAN_ADDR},
        "slurm": {
            "hook_dir": "/usr/local/libexec/slurm-burst",
            "resume_timeout": 180,
            "suspend_timeout": 20,  # released nodes are free again soon (default 120)
            "suspend_time": 300,
            "onprem_partitions": ["batch"],
            "power_save_interval": 1,
        },
        "partitions": {
            "burst-ec2": {"suspend_time": 300, "max_time": "1:00:00"},
            "burst-img": {"suspend_time": 300, "max_time": "1:00:00"},
        },
        "providers": {
            "aws": {
                "driver": "ec2",
                "region": "us-east-1",
                "credentials": {"file": "/etc/slurm-burst/aws.toml"},
                "options": {
                    "host": ec2.listen,
                    "port": ec2.port,
                    "secure": False,
                    "signature_version": "4",
                },
            }
        },
        "node_groups": {
            "ec2": {
                "pattern": "burst-ec2-{n}",
                "count": 2,
                "partition": "burst-ec2",
                "providers": ["aws"],
                "sizes": ["t3.micro"],
                "image": "ami-12345678",
                "cpus": 2,
                "memory_mb": 1000,
                "features": ["cloud", "ec2"],
                "price_per_hour": {"t3.micro": 0.0104},
            },
            # instances of the image the node_image role baked (test_a_node_image_...)
            "img": {
                "pattern": "burst-img-{n}",
                "count": 1,
                "partition": "burst-img",
                "providers": ["aws"],
                "sizes": ["t3.micro"],
                "image": NODE_AMI,
                "cpus": 2,
                "memory_mb": 1000,
                "features": ["cloud", "img"],
                "price_per_hour": {"t3.micro": 0.0104},
            },
        },
        "mesh": {"subnet": "10.77.0.0/24", "endpoint": node.public_ips[0], "port": 51820},
        "ledger": {"url": "sqlite:////var/lib/slurm-burst/ledger.db", "ingest_interval": 5},
        "daemon": {"group": "slurm", "boot_timeout": 60, "bootstrap_timeout": 90},
    }


@pytest.fixture(scope="module")
def inventory(
    work: Path, controller: Node, key: Path, wheelhouse: Path,
    relays: tuple[MirrorRelay, TcpRelay],
) -> Path:  # fmt: skip
    """An inventory as a site writes one: the host, how to reach it, the role's variables."""
    mirror, ec2 = relays
    wheel = next(wheelhouse.glob("slurm_burst-*.whl"))
    host = {
        **reach(work, controller, key, mirror),
        # the site play's
        "lab_lan_addr": LAN_ADDR,
        "lab_cluster": CLUSTER,
        # the controller role's
        "slurm_burst_install_from": "wheel",
        "slurm_burst_wheel": str(wheel),
        "slurm_burst_wheelhouse": str(wheelhouse),
        "slurm_burst_packages": ["wireguard-tools", "wireguard-go"],  # no kernel module
        "slurm_burst_accounts": ["physics"],
        "slurm_burst_cluster_users": ["root"],
        "slurm_burst_prometheus_rules_dir": "/etc/prometheus/rules",
        "slurm_burst_credentials": {
            "aws.toml": f'key = "{EC2_CREDENTIALS["key"]}"\n'
            f'secret = "{EC2_CREDENTIALS["secret"]}"\n'
        },
        "slurm_burst_config": site_config(controller, ec2),
    }
    path = work / "hosts.yml"
    path.write_text(yaml.safe_dump(
        {"all": {"children": {"slurm_controller": {"hosts": {HOST: host}}}}}
    ))  # fmt: skip
    return path


def play(work: Path, inventory: Path, playbook: Path, *extra: str) -> tuple[int, str]:
    """ansible-playbook, as a site runs it, with this checkout's collection."""
    collections = work / "collections"
    ns = collections / "ansible_collections" / "slurm_burst"
    if not ns.is_dir():
        ns.mkdir(parents=True)
        (ns / "deploy").symlink_to(COLLECTION)
    env = {
        **os.environ,
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_PIPELINING": "true",
        "ANSIBLE_TIMEOUT": "30",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_LOCAL_TEMP": str(work / "ansible-tmp"),
        "ANSIBLE_HOME": str(work / "ansible-home"),
        # each task's seconds (ansible-core's JUnit callback): the slowest go in the summary
        "ANSIBLE_CALLBACKS_ENABLED": "junit",
        "JUNIT_OUTPUT_DIR": str(work / "junit"),
        "JUNIT_HIDE_TASK_ARGUMENTS": "true",
    }
    argv = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook), *extra]
    before = set((work / "junit").glob("*.xml"))
    t = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    took = time.monotonic() - t
    said = f"{playbook.name} {' '.join(extra)}".strip()
    while said in DEPLOY:
        said += " (again)"
    DEPLOY[said] = took
    for task, secs in slowest_tasks(set((work / "junit").glob("*.xml")) - before):
        DEPLOY[f"  {task}"] = secs
    print(f"\n{said}: rc {proc.returncode} in {took:.0f} s")
    return proc.returncode, proc.stdout + proc.stderr


def slowest_tasks(reports: set[Path], over: float = 5.0, most: int = 3) -> list[tuple[str, float]]:
    """The ``most`` slowest tasks over ``over`` seconds in a play's JUnit ``reports``."""
    tasks = []
    for report in reports:
        for case in ET.parse(report).iter("testcase"):
            secs = float(case.get("time") or 0)
            if secs >= over:  # named "[host] play: task" (a role's: "role : task")
                name = str(case.get("name") or "?").split("] ", 1)[-1]
                task = name.split(": ", 1)[-1].replace("slurm_burst.deploy.", "")
                task = task.replace(" : ", ": ")
                tasks.append((task if len(task) <= 68 else "..." + task[-65:], secs))
    return sorted(tasks, key=lambda t: -t[1])[:most]


def recap(out: str, host: str = HOST) -> dict[str, int]:
    """The PLAY RECAP counters of ``host``."""
    m = re.search(rf"^{re.escape(host)}\s*:\s*(.*)$", out, re.M)
    assert m, out[-3000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


def changed_tasks(out: str) -> list[str]:
    """The tasks and handlers the play reported changed."""
    blocks = re.split(r"^(?:TASK|RUNNING HANDLER) \[(.*?)\] \**$", out, flags=re.M)
    return [name for name, body in zip(blocks[1::2], blocks[2::2], strict=True)
            if re.search(r"^changed: ", body, re.M)]  # fmt: skip


def daemon_pid(node: Node, pkey: paramiko.Ed25519Key) -> int:
    return int(run_on(node, pkey, "systemctl show -P MainPID slurm-burst.service").strip())


@dataclass(frozen=True)
class Deployed:
    """The site play, then the collection's controller play, run once per module."""

    site_conf: list[str]  # /etc/slurm/slurm.conf as the site's own play left it
    out: str  # the controller play's output


@pytest.fixture(scope="module")
def deployed(work: Path, inventory: Path, controller: Node, pkey: paramiko.Ed25519Key) -> Deployed:
    rc, out = play(work, inventory, SITE / "site.yml")
    assert rc == 0, out[-4000:]
    site_conf = run_on(controller, pkey, "cat /etc/slurm/slurm.conf").splitlines()
    rc, out = play(work, inventory, COLLECTION / "playbooks" / "controller.yml")
    assert rc == 0, out[-6000:]
    return Deployed(site_conf, out)


@dataclass(frozen=True)
class Ran:
    """A batch job run on the deployed cluster, to its end or the wait's."""

    job: str
    out: str  # sbatch's output, then rc=N: the job's exit code (or why there is none)
    show: str  # scontrol show job, after it ended (or at the end of the wait)
    seconds: float


ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL",
                   "DEADLINE", "OUT_OF_MEMORY", "PREEMPTED"})  # fmt: skip


def run_job(node: Node, pkey: paramiko.Ed25519Key, args: str, within: float = 420) -> Ran:
    """Submit, then follow the job in ``scontrol show job`` until it ends: a job that does
    not end in time is a failed test that shows the job's state and reason, not a bare
    socket timeout (``sbatch --wait`` over SSH gave CI nothing else to go on)."""
    run = on(node, pkey)
    t = time.monotonic()
    out = run(f"cd /tmp && sbatch --parsable {args} 2>&1; echo rc=$?")
    job = out.split()[0]
    if not job.isdigit():
        return Ran(job, out, "", time.monotonic() - t)
    show = ""
    while time.monotonic() < t + within:
        show = run(f"scontrol show job {job}")
        state = re.search(r"\bJobState=(\S+)", show)
        if state and state.group(1) in ENDED:
            code = re.search(r"\bExitCode=(\d+):", show)
            return Ran(job, f"{job}\nrc={code.group(1) if code else '?'}", show,
                       time.monotonic() - t)  # fmt: skip
        time.sleep(2)
    return Ran(job, f"{job}\nrc=none: not ended within {within:.0f} s", show, time.monotonic() - t)


@pytest.fixture(scope="module")
def ec2_job(
    lab_config: Config, deployed: Deployed, controller: Node, pkey: paramiko.Ed25519Key
) -> tuple[Ran, dict[str, int]]:
    """The job on two EC2 nodes, with the emulator's call counts from before it."""
    before = emulator_calls(lab_config)
    ran = run_job(controller, pkey, "-A physics -p burst-ec2 -N2 -t 5 -o /dev/null "
                  "--wrap 'test \"$(hostname)\" != ctl-1'")  # fmt: skip
    return ran, before


def test_the_collection_deploys_a_running_daemon_onto_the_blank_host(
    deployed: Deployed, controller: Node, pkey: paramiko.Ed25519Key
) -> None:
    run = on(controller, pkey)
    out = deployed.out
    assert recap(out)["failed"] == 0
    state = run("systemctl is-active slurm-burst.service || true").strip()
    assert state == "active", run("journalctl -u slurm-burst.service -n 40 --no-pager")
    status = json.loads(wait(
        lambda: run("/opt/slurm-burst/bin/slurm-burst status --json 2>/dev/null || true").strip(),
        60, "the deployed daemon's heartbeat",
    ))  # fmt: skip
    assert status["daemon"]["running"] and status["leader"] == status["daemon"]["node_id"], status
    assert status["daemon"]["pid"] == daemon_pid(controller, pkey), status
    # the product alone: the wheelhouse held the lab's wheel too, and the role took none of it
    assert "slurm-burst-lab" not in run("/opt/slurm-burst/bin/python -m pip list 2>/dev/null")
    assert run("/opt/slurm-burst/bin/python -c 'import slurm_burst_lab' 2>&1 || true").strip()
    # of the site's slurm.conf, exactly two lines are the role's; nothing else changed
    site_conf = deployed.site_conf
    after = run("cat /etc/slurm/slurm.conf").splitlines()
    assert [ln for ln in site_conf if ln not in after] == []
    assert sorted(ln for ln in after if ln not in site_conf) == [
        "AccountingStorageEnforce=associations,limits,safe", "Include slurm-burst.conf"
    ], after  # fmt: skip
    assocs = run("sacctmgr -n -P show association format=account,user").split()
    assert "physics|root" in assocs, assocs
    assert "ResumeProgram=/usr/local/libexec/slurm-burst/" in run("cat /etc/slurm/slurm-burst.conf")
    # the restarted slurmctld took the fragment: the burst nodes exist, powered down
    sinfo = run("sinfo -h -p burst-ec2 -o '%N %t'").split()
    assert sinfo == [NODES, "idle~"], sinfo
    # modes and owners: credentials root-only; config readable by SlurmUser's group
    modes = run("stat -c '%n %a %U %G' /etc/slurm-burst/aws.toml /etc/slurm-burst/slurm-burst.toml"
                " /var/lib/slurm-burst")  # fmt: skip
    assert modes.split("\n")[:3] == [
        "/etc/slurm-burst/aws.toml 600 root root",
        "/etc/slurm-burst/slurm-burst.toml 640 root slurm",
        "/var/lib/slurm-burst 770 root slurm",
    ], modes
    assert "secret" not in out and EC2_CREDENTIALS["secret"] not in out  # never logged
    # the shipped alert rules, where the site's Prometheus reads them
    rules = run("cat /etc/prometheus/rules/slurm-burst.rules.yml")
    assert rules.strip() == RULES.read_text().strip()


def test_a_batch_job_runs_on_ec2_nodes_the_deployed_daemon_launched(
    lab_config: Config, ec2_job: tuple[Ran, dict[str, int]], controller: Node,
    pkey: paramiko.Ed25519Key,
) -> None:  # fmt: skip
    ran, before = ec2_job
    run = on(controller, pkey)
    assert ran.out.strip().endswith("rc=0"), ran.out + run(
        "tail -40 /var/log/slurm-burst/*.log; journalctl -u slurm-burst -n 60 --no-pager"
    )
    assert "JobState=COMPLETED" in ran.show and "ExitCode=0:0" in ran.show, ran.show
    assert f"NodeList={NODES}" in ran.show, ran.show
    print(f"\ndeployed daemon: sbatch -N2 to completed in {ran.seconds:.1f} s")
    nodes = json.loads(run("/opt/slurm-burst/bin/slurm-burst nodes --json"))["nodes"]
    assert {"burst-ec2-1", "burst-ec2-2"} <= {n["name"] for n in nodes}, nodes
    ec2 = [n for n in nodes if n["name"].startswith("burst-ec2-")]
    assert all(n["instance_id"].startswith("i-") and n["provider"] == "aws" for n in ec2), nodes
    calls = emulator_calls(lab_config)
    assert calls.get("RunInstances", 0) > before.get("RunInstances", 0)


def test_a_second_run_changes_nothing(
    work: Path, inventory: Path, deployed: Deployed, controller: Node, pkey: paramiko.Ed25519Key
) -> None:
    pid = daemon_pid(controller, pkey)
    rc, out = play(work, inventory, COLLECTION / "playbooks" / "controller.yml")
    assert rc == 0, out[-4000:]
    assert recap(out)["changed"] == 0, changed_tasks(out)
    assert daemon_pid(controller, pkey) == pid  # not restarted


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        # Ansible's argument_specs: before any task runs
        (
            "slurm_burst_ledger",
            "mysql",
            "value of slurm_burst_ledger must be one of: sqlite, postgresql, got: mysql",
        ),
        # slurm-burst config check, on the host, before the new config replaces the old one
        ("slurm_burst_config", "count0", "node_groups.ec2.count: must be between 1 and"),
    ],
)
def test_a_broken_variable_stops_the_play_and_leaves_the_daemon_running(
    work: Path, inventory: Path, deployed: Deployed, controller: Node, pkey: paramiko.Ed25519Key,
    relays: tuple[MirrorRelay, TcpRelay], variable: str, value: str, message: str,
) -> None:  # fmt: skip
    pid = daemon_pid(controller, pkey)
    config = "sha256sum /etc/slurm-burst/slurm-burst.toml /etc/slurm/slurm-burst.conf"
    before = run_on(controller, pkey, config)
    if value == "count0":
        cfg = site_config(controller, relays[1])
        cfg["node_groups"]["ec2"]["count"] = 0
        extra = work / "broken.json"
        extra.write_text(json.dumps({variable: cfg}))
        arg = f"@{extra}"
    else:
        arg = json.dumps({variable: value})
    rc, out = play(work, inventory, COLLECTION / "playbooks" / "controller.yml", "-e", arg)
    assert rc != 0 and recap(out)["failed"] == 1, out[-4000:]
    assert message in out, out[-4000:]
    assert daemon_pid(controller, pkey) == pid
    assert run_on(controller, pkey, "systemctl is-active slurm-burst.service").strip() == "active"
    assert run_on(controller, pkey, config) == before


@dataclass(frozen=True)
class Baked:
    """What the node_image role did on a blank builder, and the image it left."""

    plays: tuple[tuple[int, str], ...]  # the bake, the bake again, the generalizing run
    slurmd: str  # slurmd -V on the builder
    sshd: str  # sshd -T's root and password lines
    root: Path  # the builder's root file system, exported: the image


@pytest.fixture(scope="module")
def node_image(
    work: Path, lab: Lab, cloud: Any, key: Path, pkey: paramiko.Ed25519Key,
    relays: tuple[MirrorRelay, TcpRelay],
) -> Iterator[Baked]:  # fmt: skip
    """The node_image role on a blank builder; its root file system becomes an AMI of
    the emulator (a cloud's CreateImage), registered while the module runs."""
    builder = boot_blank(cloud, "img-1", key, pkey)
    playbook = COLLECTION / "playbooks" / "node_image.yml"
    try:
        run_on(builder, pkey, f"echo '{relays[0].hosts_line()}' >> /etc/hosts")  # apt
        inv = work / "builder.yml"
        inv.write_text(yaml.safe_dump(
            {"all": {"hosts": {"img-1": reach(work, builder, key, relays[0])}}}
        ))  # fmt: skip
        keep = json.dumps({"slurm_burst_node_generalize": False})
        bake = play(work, inv, playbook, "-e", keep)
        again = play(work, inv, playbook, "-e", keep)
        slurmd = run_on(builder, pkey, "slurmd -V").strip()
        sshd = run_on(builder, pkey, "sshd -T | grep -E '^(permitrootlogin|passwordauth)'")
        run_on(builder, pkey, "echo baked-by-node_image > /etc/slurm-burst-test-image")
        # the bake's last step: what must differ per instance goes (no SSH after this)
        last = play(work, inv, playbook)
        root = cloud.ex_export_root(builder, work / "node-image")
    finally:
        cloud.destroy_node(builder)
    register_image(lab.paths.state / "ec2", NODE_AMI, root)
    try:
        yield Baked((bake, again, last), slurmd, sshd, root)
    finally:
        register_image(lab.paths.state / "ec2", NODE_AMI, None)


@pytest.fixture(scope="module")
def image_job(node_image: Baked, deployed: Deployed, controller: Node,
              pkey: paramiko.Ed25519Key) -> Ran:  # fmt: skip
    """A job on the one node of the baked image, reading the file only the image has."""
    return run_job(controller, pkey, "-A physics -p burst-img -N1 -t 5 -o /dev/null "
                   "--wrap 'grep -qx baked-by-node_image /etc/slurm-burst-test-image'")  # fmt: skip


def test_an_image_the_node_image_role_baked_joins_and_runs_a_job(
    node_image: Baked, image_job: Ran, controller: Node, pkey: paramiko.Ed25519Key
) -> None:
    """The image joins the deployed cluster and runs a job, with nothing but what the
    role installed (no host file system)."""
    (rc, out), (rc2, out2), (rc3, out3) = node_image.plays
    assert rc == 0, out[-4000:]
    assert rc2 == 0 and recap(out2, "img-1")["changed"] == 0, changed_tasks(out2)
    assert rc3 == 0, out3[-4000:]
    ctld = run_on(controller, pkey, "slurmctld -V").strip()
    assert node_image.slurmd == ctld, node_image.slurmd
    assert sorted(node_image.sshd.split("\n")[:2]) == [
        "passwordauthentication no", "permitrootlogin without-password"
    ], node_image.sshd  # fmt: skip
    root = node_image.root
    assert not list((root / "etc" / "ssh").glob("ssh_host_*"))
    assert not (root / "etc" / "munge" / "munge.key").exists()
    assert (root / "etc" / "machine-id").read_text() == ""
    wants = root / "etc" / "systemd" / "system" / "multi-user.target.wants"
    assert not {"munge.service", "slurmd.service"} & {w.name for w in wants.iterdir()}
    assert image_job.out.strip().endswith("rc=0"), image_job.out + run_on(
        controller, pkey, "journalctl -u slurm-burst -n 60 --no-pager"
    )
    assert "JobState=COMPLETED" in image_job.show, image_job.show
    assert "NodeList=burst-img-1" in image_job.show, image_job.show


def test_released_nodes_leave_no_instance_and_the_job_is_charged(
    ec2_job: tuple[Ran, dict[str, int]], image_job: Ran, controller: Node,
    pkey: paramiko.Ed25519Key,
) -> None:  # fmt: skip
    """After the EC2 job and the image's job, powered down: no instance is left, and
    the ledger charges each job to its account and partition."""
    sb = "/opt/slurm-burst/bin/slurm-burst"
    ran = {ec2_job[0].job, image_job.job}
    run_on(controller, pkey, f"scontrol update nodename={shlex.quote(ALL_NODES)} state=power_down")

    def gone() -> bool:
        nodes = json.loads(run_on(controller, pkey, f"{sb} nodes --json"))
        return all(n["state"] == "terminated" for n in nodes["nodes"])

    wait(gone, 120, "the deployed daemon terminated its instances", every=2)

    rows: list[dict[str, Any]] = []

    def charged() -> list[dict[str, Any]]:
        run_on(controller, pkey, f"{sb} ledger sync")
        rows[:] = json.loads(run_on(controller, pkey, f"{sb} ledger report --by job --json"))[
            "rows"
        ]
        # a job requeued once (a node that failed its first run) has a row per run
        jobs = [r for r in rows if r["job"] in ran and r["total_micros"] > 0]
        return jobs if {r["job"] for r in jobs} == ran else []

    try:
        jobs = wait(charged, 240, "both burst jobs' cost in the deployed daemon's ledger", every=3)
    finally:
        print("\nledger report --by job:", json.dumps(rows))
    assert {(j["account"], j["partition"]) for j in jobs} == {
        ("physics", "burst-ec2"), ("physics", "burst-img")
    }, jobs  # fmt: skip


@pytest.mark.full  # 1.5 min: make test-full only (docs/testing.md says why)
def test_the_upgrade_play_installs_a_newer_release_with_a_job_in_flight(
    work: Path, inventory: Path, wheelhouse: Path, lab_config: Config, deployed: Deployed,
    controller: Node, pkey: paramiko.Ed25519Key,
) -> None:  # fmt: skip
    """playbooks/upgrade.yml installs a newer slurm-burst (this checkout as 0.1.1) and
    restarts the daemon, started while a node launches for a job: the daemon's stop
    waits for the node's step in flight, the new one carries on from the state
    database, and the job runs on the one instance launched for it."""
    src = work / "next-src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.egg-info", "__pycache__", ".mypy_cache", ".ruff_cache"
    ))  # fmt: skip
    init = src / "slurm_burst" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "0.1.0"', '__version__ = "0.1.1"'))
    house = work / "wheelhouse-next"
    shutil.copytree(wheelhouse, house, ignore=shutil.ignore_patterns("slurm_burst-*"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(house),
         str(src)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    wheel = next(house.glob("slurm_burst-0.1.1-*.whl"))
    run = on(controller, pkey)
    sb = "/opt/slurm-burst/bin/slurm-burst"
    before = emulator_calls(lab_config).get("RunInstances", 0)
    pid = daemon_pid(controller, pkey)
    job = run("cd /tmp && sbatch --parsable -A physics -p burst-ec2 -N1 -t 5 -o /dev/null "
              "--wrap true").strip()  # fmt: skip

    def launching() -> bool:
        nodes = json.loads(run(f"{sb} nodes --json"))["nodes"]
        return any(n["state"] in ("launching", "booting", "bootstrapping") for n in nodes)

    wait(launching, 120, "a node launching for the job", every=0.5)
    extra = json.dumps({"slurm_burst_wheel": str(wheel), "slurm_burst_wheelhouse": str(house)})
    rc, out = play(work, inventory, COLLECTION / "playbooks" / "upgrade.yml", "-e", extra)
    assert rc == 0, out[-4000:]
    assert run(f"{sb} --version").strip() == "slurm-burst, version 0.1.1"
    assert daemon_pid(controller, pkey) != pid  # restarted, by the play's handler

    def done() -> str:
        show = run(f"scontrol show job {job}")
        return show if "JobState=COMPLETED" in show or "JobState=FAILED" in show else ""

    show = wait(done, 240, f"job {job} after the upgrade", every=2)
    assert "JobState=COMPLETED" in show and "ExitCode=0:0" in show, show
    # one launch for the one node: the new daemon adopted the old one's, made no other
    assert emulator_calls(lab_config).get("RunInstances", 0) - before == 1
    run(f"scontrol update nodename={shlex.quote(ALL_NODES)} state=power_down")
