"""The same container image on both sides, in the lab: the lab's image (built at ``lab
up``, pinned by digest in a drop-in of the config, loaded on the on-prem node as from a
registry) reaches a burst node of group direct through the staging store before its
slurmd starts; a job runs it by digest on the on-prem node and on the burst node with
podman, and both print the same fingerprint; a digest the node does not hold never
runs. The ledger counts the image's pull. Only on the host's release: the other
releases' images have no podman."""

from __future__ import annotations

import json
import subprocess

import pytest
from slurm_burst_lab import images, ociimage
from slurm_burst_lab.service import Lab

from slurm_burst.adapters.state.store import Store
from slurm_burst.config import load_config
from tests.conftest import LAB_CONFIG, invoke, wait
from tests.lab.conftest import RELEASE
from tests.lab.release import release

pytestmark = pytest.mark.skipif(
    RELEASE != images.HOST_RELEASE,
    reason=f"the lab's image of Slurm {RELEASE} has no podman (the host's release has)",
)
NODE = "burst-dir-3"


def srun(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["srun", "-t", "5", *args], env=env, capture_output=True, text=True,
                          timeout=240, check=False)  # fmt: skip


def test_a_job_runs_the_same_image_by_digest_on_prem_and_on_a_burst_node(
    lab: Lab, env: dict[str, str], store: Store
) -> None:
    cfg = load_config(LAB_CONFIG)  # with the drop-in lab up wrote
    image = cfg.images[ociimage.KEY]
    assert cfg.node_groups[ociimage.GROUP].images == (ociimage.KEY,)
    run = ["podman", "run", "--rm", "--pull=never", "--network=none"]
    pinned = f"{image.ref}@{image.digest}"
    on_prem = srun(env, "-p", lab.lab.onprem_partition, *run, pinned)
    assert on_prem.returncode == 0 and on_prem.stdout.startswith("fingerprint "), on_prem.stderr
    burst = srun(env, "-p", "burst-direct", "-w", NODE, *run, pinned)
    assert burst.returncode == 0, burst.stderr[-2000:]
    assert burst.stdout == on_prem.stdout  # the same content runs
    wrong = srun(env, "-p", "burst-direct", "-w", NODE, *run, f"{image.ref}@sha256:{'0' * 64}")
    assert wrong.returncode != 0 and "image not known" in wrong.stderr and not wrong.stdout
    args = ["--config", str(LAB_CONFIG), "ledger", "transfers", "--account", "site-images",
            "--json"]  # fmt: skip

    def pulled() -> list[dict[str, object]]:  # the ledger's writes may be spooled a while
        rows = json.loads(invoke(args).stdout)
        return [r for r in rows if r["node"] == NODE and r["dataset"] == f"image:{ociimage.KEY}"]

    row = wait(pulled, 60, "the image's pull in the ledger")[0]  # newest first
    assert row["direction"] == "pull" and int(str(row["logical_bytes"])) > 1_000_000, row
    release(env, lab, store, [NODE], "cloud", set())
