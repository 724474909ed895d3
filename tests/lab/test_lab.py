"""The lab as `make demo` shows it, and its status."""

from __future__ import annotations

import json

from slurm_burst_lab import slurmfeatures as dynamic
from slurm_burst_lab.service import Lab

from slurm_burst.adapters.proc import run
from slurm_burst.config import Config
from tests.conftest import LAB_CONFIG, invoke, wait
from tests.lab.conftest import RELEASE, make
from tests.lab.readback import check_read_back


def test_sinfo_shows_onprem_idle_and_burst_idle_powered_down(lab: Lab) -> None:
    """Every burst node powered down and free, but the capped group's past its room
    (max_nodes = 2 of 4): those drained by the daemon's first pass (test_x_cap). On
    23.11+ the dynamic group's two nodes too, made by the daemon (test_x_dynamic)."""
    capped = {"burst-cap-1": "idle~", "burst-cap-2": "idle~", "burst-cap-3": "drain~",
              "burst-cap-4": "drain~"}  # fmt: skip

    def states() -> dict[str, str]:
        out = run(["sinfo", "-h", "-N", "-o", "%N %t"], env=lab.env()).stdout
        now = dict(line.split() for line in out.splitlines())
        return now if {n: now.get(n) for n in capped} == capped else {}

    now = wait(states, 60, "the capped group's drain past its room")
    assert now.pop("onprem-1") == "idle"
    for name in capped:
        del now[name]
    assert now and set(now.values()) == {"idle~"}
    assert set(now) == {f"burst-cpu-{i}" for i in range(1, 33)} | {
        f"burst-gpu-{i}" for i in range(1, 9)} | {"burst-ec2-1", "burst-ec2-2"} | {
        f"burst-ec2x-{i}" for i in range(1, 33)} | {
        f"burst-spot-{i}" for i in range(1, 5)} | {f"burst-dir-{i}" for i in range(1, 5)} | {
        "burst-gce-1", "burst-gce-2"} | {f"burst-gcex-{i}" for i in range(1, 17)} | {
        f"burst-gspot-{i}" for i in range(1, 5)} | {"burst-az-1", "burst-az-2"} | {
        f"burst-azx-{i}" for i in range(1, 17)} | {
        f"burst-azspot-{i}" for i in range(1, 5)} | {
        f"burst-train-{i}" for i in range(1, 5)} | (
        {"burst-dyn-1", "burst-dyn-2"} if dynamic.wanted(RELEASE) else set())  # fmt: skip


def test_the_labs_slurmctld_reads_back_what_the_config_meant(lab: Lab, lab_config: Config) -> None:
    """The fragment conf render wrote for the lab's release, as its slurmctld loaded it."""
    check_read_back(lab_config, lambda argv: run(argv, env=lab.env()).stdout)


def test_job_runs_on_onprem_node(lab: Lab) -> None:
    out = run(
        ["srun", "-p", "onprem", "-N1", "-t", "1", "hostname"],
        env=lab.env(),
        timeout=60,
    ).stdout
    assert out.strip() == "onprem-1"


def test_status_json(lab: Lab) -> None:
    doc = json.loads(invoke(["--config", str(LAB_CONFIG), "lab", "status", "--json"]).stdout)
    assert doc["up"] is True
    assert {"munged", "slurmctld", "daemon"} <= {
        k for k, v in doc["processes"].items() if v["alive"]
    }
    assert doc["onprem"]["onprem-1"]["vm"] == "running"
    assert {n["name"]: n["state"] for n in doc["slurm_nodes"]}["burst-cpu-1"] == "idle~"


def test_up_again_is_a_no_op(lab: Lab) -> None:
    """`make lab-up` (docs/lab.md's first step) on a lab that is up leaves it as it is."""
    before = lab.status()["processes"]["slurmctld"]["pid"]
    done = make("lab-up", f"LAB_SLURM={RELEASE}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"lab is already up (Slurm {RELEASE})" in done.stdout + done.stderr
    assert lab.status()["processes"]["slurmctld"]["pid"] == before


def test_conf_render_is_what_slurmctld_runs(lab: Lab) -> None:
    out = invoke(["--config", str(LAB_CONFIG), "conf", "render"]).stdout
    deployed = (lab.slurm_conf.parent / "slurm-burst.conf").read_text()
    assert deployed in out
