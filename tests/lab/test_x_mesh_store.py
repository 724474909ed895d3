"""The mesh store in the lab (a site without object storage): a cloud node that joined over
real WireGuard pulls a dataset from the store served on the hub's mesh address, and sends
its outputs back the same way; the hub's own WireGuard counters show the bytes went
through the tunnel.

The server here is the one the daemon runs for a ``driver = "mesh"`` store
(``MeshStoreServer``), started by the test beside the lab's daemon, whose store is the
lab's S3 server: the daemon's side of serving it is tested on fakes
(tests/unit/test_daemon.py) and the store itself over loopback
(tests/integration/test_mesh_store.py)."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm_burst_lab.service import Lab

from slurm_burst.adapters.clock import SystemClock
from slurm_burst.adapters.proc import run
from slurm_burst.adapters.state.store import Store
from slurm_burst.adapters.storage.home import LocalHome
from slurm_burst.adapters.storage.mesh import MeshStore, MeshStoreServer, load_key
from slurm_burst.adapters.storage.tree import LocalTree
from slurm_burst.config import Config
from slurm_burst.core.staging import output_manifest
from slurm_burst.services.staging import Stager, StagingSettings
from tests.conftest import ROOT, wait
from tests.lab.test_x_burst import in_vm, job, running_vms, sbatch

NODE_DIR = ROOT / "slurm_burst" / "node"


@pytest.fixture()
def served(lab_config: Config, tmp_path: Path) -> Iterator[tuple[MeshStoreServer, Stager]]:
    hub = str(next(ipaddress.ip_network(lab_config.mesh.subnet).hosts()))
    key = load_key(tmp_path / "mesh.key", create=True)
    server = MeshStoreServer(tmp_path / "store", key, (hub, 0))
    server.start()
    client = MeshStore("mesh", host=hub, port=server.address[1], secret=key)
    stager = Stager(settings=StagingSettings(prefix="lab-mesh/", grant_seconds=300),
                    store=client, tree=LocalTree(), clock=SystemClock(),
                    home=LocalHome())  # fmt: skip
    try:
        yield server, stager
    finally:
        server.close()


def tunnel_bytes(lab_config: Config, pubkey: str) -> tuple[int, int]:
    """(received, sent) by the hub from and to the node's peer, as WireGuard counts them."""
    out = run(["wg", "show", lab_config.mesh.interface, "transfer"]).stdout
    for line in out.splitlines():
        peer, rx, tx = line.split()
        if peer == pubkey:
            return int(rx), int(tx)
    raise AssertionError(f"no peer {pubkey} on the hub")


def pull(cloud: Any, vm: Any, shared: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """node/stagein.py run in the VM as the daemon runs it, its plan on stdin (the plan
    holds grants: a 0600 file of root's on the shared directory, removed after)."""
    plan_file = shared / f"mesh-plan-{os.getpid()}.json"
    fd = os.open(plan_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(plan, f)
    try:
        script = f"exec python3 {NODE_DIR / 'stagein.py'} --retries 2 < {plan_file}"
        out = in_vm(cloud, vm, "sh", "-c", script)
    finally:
        plan_file.unlink(missing_ok=True)
    said: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return said


def test_a_node_pulls_and_sends_through_the_mesh_store_inside_its_tunnel(
    lab: Lab, lab_config: Config, store: Store, cloud: Any, tmp_path: Path,
    served: tuple[MeshStoreServer, Stager],
) -> None:  # fmt: skip
    _server, stager = served
    env, shared = lab.env(), Path(lab.lab.shared_dir)
    job_id = sbatch(env, str(shared), "-p", "burst-cpu", "--wrap", "sleep 300")
    try:
        wait(lambda: job(env, job_id).get("JobState") == "RUNNING", 180, f"job {job_id} runs")
        node = job(env, job_id)["NodeList"]
        vm = running_vms(cloud)[node]
        rec = store.node(node)
        assert rec is not None and rec.wg_pubkey

        # in: a dataset pushed on the controller, pulled and verified on the node
        root = tmp_path / "set"
        files = {"weights.bin": os.urandom(3 << 20), "conf/run.toml": b"lr = 0.1\n" * 100}
        for rel, body in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(body)
        stager.push(str(root), "physics")
        manifest = stager.manifest("physics", str(root))
        assert manifest is not None
        plan = stager.node_plan("physics", manifest, "/tmp/mesh-set", 0, 0)
        rx0, tx0 = tunnel_bytes(lab_config, rec.wg_pubkey)
        pulled = pull(cloud, vm, shared, plan)
        assert (pulled["exit"], pulled["files"], pulled["present"]) == (0, 2, False), pulled
        sums = in_vm(cloud, vm, "sha256sum", "/tmp/mesh-set/weights.bin",
                     "/tmp/mesh-set/conf/run.toml").split()[::2]  # fmt: skip
        assert sums == [hashlib.sha256(files[r]).hexdigest()
                        for r in ("weights.bin", "conf/run.toml")]  # fmt: skip
        _rx1, tx1 = tunnel_bytes(lab_config, rec.wg_pubkey)
        assert tx1 - tx0 >= 3 << 20, "the dataset did not go through the node's tunnel"

        # out: the node's outputs scanned and sent, then brought home verified
        in_vm(
            cloud,
            vm,
            "sh",
            "-c",
            "mkdir -p /tmp/mesh-out/ckpt && head -c 2097152 "
            "/dev/urandom > /tmp/mesh-out/ckpt/step-1.pt && echo done > /tmp/mesh-out/log",
        )
        scan = json.loads(
            in_vm(
                cloud,
                vm,
                "python3",
                str(NODE_DIR / "stageout.py"),
                "--exit-zero",
                "scan",
                "--dir",
                "/tmp/mesh-out",
                "--cache",
                "/tmp/mesh-cache.json",
            )
            .strip()
            .splitlines()[-1]
        )
        assert scan["exit"] == 0 and len(scan["files"]) == 2, scan
        home = tmp_path / "results" / str(job_id)
        home.parent.mkdir()
        out_manifest = output_manifest(str(home), scan["files"], "scan")
        out_plan, _ = stager.output_plan("physics", out_manifest, "/tmp/mesh-out")
        plan_file = shared / f"mesh-out-plan-{job_id}.json"
        fd = os.open(plan_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(out_plan, f)
        said = json.loads(in_vm(cloud, vm, "python3", str(NODE_DIR / "stageout.py"),
                                "--exit-zero", "send", "--plan",
                                str(plan_file)).strip().splitlines()[-1])  # fmt: skip
        assert not plan_file.exists()  # its URLs are grants: removed once read
        assert said["exit"] == 0 and said["sent"] == 2, said
        stager.commit("physics", out_manifest)
        rx2, _tx2 = tunnel_bytes(lab_config, rec.wg_pubkey)
        assert rx2 - rx0 >= 2 << 20, "the outputs did not come through the node's tunnel"
        got = stager.promote("physics", out_manifest.id, str(home))
        assert got["files"] == 2 and (home / "log").read_text() == "done\n"
        digest = in_vm(cloud, vm, "sha256sum", "/tmp/mesh-out/ckpt/step-1.pt").split()[0]
        assert hashlib.sha256((home / "ckpt" / "step-1.pt").read_bytes()).hexdigest() == digest
    finally:
        run(["scancel", str(job_id)], env=env, check=False)
