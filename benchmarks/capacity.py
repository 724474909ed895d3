"""Spot fallback and placement per job against the EC2 emulator (issue 32's figures), the
GCE emulator (issue 50's: ``--provider gce``) and the Azure emulator (issue 52's:
``--provider azure``).

- **Provider calls a placement adds per job**: a 4-node job of a group with placement
  (EC2 ``cluster``: RunInstances into a new cluster placement group; GCE ``compact``: a
  bulk insert naming a new compact placement policy) launched, released, and the
  reconcile pass run: CreatePlacementGroup + DeletePlacementGroup (+ any describe), or
  resourcePolicies insert + delete (+ any wait for the insert), per job (goal <= 2).
  Azure ``proximity``: every ARM call of the placed job, launch to reconcile pass, less
  those of the same job unplaced (a proximity placement group's PUT and DELETE, and
  the job's own set read, listed and deleted; no goal in the issue: the figure).
- **Spot refusal -> on-demand launch**: the emulator refuses spot capacity; the time
  from the spot launch call (RunInstances; bulkInsert) reaching the emulator to the
  fallback's on-demand call reaching it (the emulator's call timeline), and the whole
  launch, quiet and with two CPU burners beside it.

The daemon's real launcher, provisioner and reconciler on the SQLite state, libcloud's
EC2 or GCE driver over HTTP to the emulator in this process (EC2: scale mode without
throttling, EC2's answer form; GCE: no quota, every call on its timeline); the hub and
Slurm are fakes, as in tests/integration/test_ec2.py and test_gce_market.py.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from launch import burners  # noqa: E402
from sizes import size  # noqa: E402
from slurm_burst_lab.azureemu import AzureEmulator  # noqa: E402
from slurm_burst_lab.ec2emu import Ec2Emulator, Scale  # noqa: E402
from slurm_burst_lab.gceemu import GceEmulator, Quotas  # noqa: E402

from slurm_burst.config import Config, load_config  # noqa: E402
from slurm_burst.core.nodestate import Want  # noqa: E402
from tests.integration.azuretools import azure_config  # noqa: E402
from tests.integration.ec2config import CONFIG  # noqa: E402
from tests.integration.gcetools import gce_config  # noqa: E402
from tests.integration.test_ec2 import daemon, launch_batch, requested  # noqa: E402
from tests.integration.test_ec2_capacity import SPOT  # noqa: E402

RUNS = size(10, 2)
NODES = [f"spot-{i}" for i in range(1, 5)]
JOB = [{"job_id": 7, "nodes": "spot-[1-4]"}]
PLACEMENT_CALLS = ("CreatePlacementGroup", "DeletePlacementGroup", "DescribePlacementGroups")
GCE_PLACEMENT_CALLS = ("resourcePolicies.insert", "resourcePolicies.delete",
                       "resourcePolicies.get")  # fmt: skip


def config(tmp: Path, port: int, run: int) -> Config:
    text = CONFIG.format(cluster=f"cap{run}-{time.time_ns() % 10**9}", tmp=tmp, port=port,
                         spot="false")  # fmt: skip
    text = text.replace("[slurm]\n", "[slurm]\nresume_timeout = 900\n")
    path = tmp / "slurm-burst.toml"
    path.write_text(text + SPOT.format(wait=30))
    path.chmod(0o640)
    return load_config(path)


def one_job(emu: Ec2Emulator | GceEmulator, run: int, refuse: bool) -> tuple[int, float, float]:
    """(placement calls, spot -> on-demand seconds or 0, launch seconds) of one job: EC2's
    placement calls, or GCE's (and any wait for a policy's insert)."""
    gce = isinstance(emu, GceEmulator)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "slurm").mkdir()
        if isinstance(emu, GceEmulator):
            cfg = gce_config(tmp, emu.port, cluster=f"cap{run}-{time.time_ns() % 10**9}")
            set_spot = emu.set_spot
        else:
            cfg = config(tmp, emu.port, run)
            set_spot = emu.market.set_spot
        dm = daemon(cfg, tmp)
        prov = dm.prov
        requested(prov, *NODES, jobs=JOB)
        set_spot("refuse" if refuse else "")
        emu.calls.clear()
        emu.timeline.clear()
        started = time.perf_counter()
        launch_batch(prov, NODES)
        took = time.perf_counter() - started
        launch = "bulkInsert" if gce else "RunInstances"
        runs = [t for t, action, _ in emu.timeline if action == launch]
        fallback = runs[1] - runs[0] if refuse and len(runs) == 2 else 0.0
        waits = emu.calls.get("operations.wait", 0) - len(runs) if gce else 0  # a policy's
        for n in NODES:
            prov.store.update(n, want=Want.DOWN)
            prov.drive(n)
        dm.reconciler.pass_once()
        names = GCE_PLACEMENT_CALLS if gce else PLACEMENT_CALLS
        calls = sum(emu.calls.get(a, 0) for a in names) + waits
        set_spot("")
        return calls, fallback, took


def azure_job(emu: AzureEmulator, run: int, refuse: bool, placed: bool = True
              ) -> tuple[int, float, float]:  # fmt: skip
    """One 4-node job on Azure: (every ARM call, launch to reconcile pass; spot PUT ->
    on-demand PUT seconds or 0; launch seconds). ``placed``: the Spot group's job (a
    proximity placement group); else the same job on the on-demand group, unplaced."""
    nodes = NODES if placed else [f"az-{i}" for i in range(1, 5)]
    jobs = JOB if placed else [{"job_id": 7, "nodes": "az-[1-4]"}]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        dm = daemon(azure_config(tmp, emu.port, cluster=f"cap{run}-{time.time_ns() % 10**9}"),
                    tmp)  # fmt: skip
        prov = dm.prov
        requested(prov, *nodes, jobs=jobs)
        emu.clear()
        emu.arm.set_spot("refuse" if refuse else "")
        started = time.perf_counter()
        launch_batch(prov, nodes)
        took = time.perf_counter() - started
        puts = [t for t, name in emu.called if name == "vmss.put"]
        fallback = puts[1] - puts[0] if refuse and len(puts) == 2 else 0.0
        for n in nodes:
            prov.store.update(n, want=Want.DOWN)
            prov.drive(n)
        time.sleep(0.05)
        dm.reconciler.pass_once()
        calls = sum(emu.calls.values())
        emu.arm.set_spot("")
        return calls, fallback, took


def refusals(provider: str, call: str, job: Callable[[int, bool], tuple[int, float, float]]
             ) -> None:  # fmt: skip
    """Spot refused -> the on-demand ``call``, RUNS jobs quiet and RUNS with two CPU
    burners beside: the medians and maxima printed."""
    for label, load in (("quiet", 0), ("2 CPU burners", 2)):
        with burners(load):
            got = [job(100 * (load + 1) + i, True) for i in range(RUNS)]
        fall = [g[1] * 1000 for g in got]
        launch = [g[2] * 1000 for g in got]
        print(f"{provider} spot refused -> on-demand {call} ({label}): median "
              f"{statistics.median(fall):6.1f} ms  max {max(fall):6.1f} ms; whole launch "
              f"median {statistics.median(launch):6.1f} ms")  # fmt: skip


def main_azure() -> None:
    emu = AzureEmulator(limits=None)
    emu.start()
    try:
        added = [azure_job(emu, i, False)[0] - azure_job(emu, 50 + i, False, placed=False)[0]
                 for i in range(RUNS)]  # fmt: skip
        print(f"azure placement: ARM calls a proximity placement adds per 4-node job  "
              f"median {statistics.median(added):g}  max {max(added)}")  # fmt: skip
        refusals("azure", "scale-out PUT", lambda run, refuse: azure_job(emu, run, refuse))
    finally:
        emu.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--provider", choices=("ec2", "gce", "azure"), default="ec2")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the fallbacks' warnings are what is measured
    if args.provider == "azure":
        main_azure()
        return
    os.environ.setdefault("SB_TEST_AWS_KEY", "AKIDEMULATOR000000000")
    os.environ.setdefault("SB_TEST_AWS_SECRET", "emulator-secret")
    gce = GceEmulator(quotas=Quotas(limits={})) if args.provider == "gce" else None
    ec2 = None if gce else Ec2Emulator(scale=Scale(throttle=0.0, boot=0.0, console=0.0))
    call = "bulkInsert" if gce else "RunInstances"

    emu = gce or ec2
    assert emu is not None

    def job(run: int, refuse: bool) -> tuple[int, float, float]:
        assert emu is not None
        return one_job(emu, run, refuse)

    emu.start()
    try:
        placed = [job(i, refuse=False)[0] for i in range(RUNS)]
        verdict = "  OK" if max(placed) <= 2 else "  OVER GOAL"
        print(f"{args.provider} placement: provider calls added per 4-node job  max "
              f"{max(placed)}  (goal <= 2){verdict}")  # fmt: skip
        refusals(args.provider, call, job)
    finally:
        emu.stop()


if __name__ == "__main__":
    main()
