"""A dynamic node group in the lab (Slurm 23.11+: the 24.11 and 26.05 shares): group
``dyn`` has no line in slurm.conf; the daemon creates burst-dyn-[1-2] in slurmctld
(``max_nodes = 2`` of four names). A two-node job bursts onto them and keeps running
through a slurmctld restart, which keeps the nodes; a lowered limit deletes them only
once they are released, and nothing of the group is left in ``scontrol show node``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_burst_lab import slurmfeatures as dynamic
from slurm_burst_lab.service import Lab

from slurm_burst.adapters.state.store import Store
from slurm_burst.config import load_config
from slurm_burst.config.load import dropin_dir
from slurm_burst.core.nodestate import NodeState
from tests.conftest import LAB_CONFIG, wait
from tests.lab.conftest import RELEASE, job_fields, sh

pytestmark = pytest.mark.skipif(
    not dynamic.wanted(RELEASE),
    reason=f"Slurm {RELEASE} has dynamic nodes only with TreeWidth=65533 cluster-wide "
    "(the lab's dyn group is on 24.11 and 26.05: SLURM_BURST_LAB_SLURM)",
)
MADE = ["burst-dyn-1", "burst-dyn-2"]
ALL = [f"burst-dyn-{i}" for i in range(1, dynamic.COUNT + 1)]
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
SHRINK = "55-test-dynamic.toml"


def shown(env: dict[str, str]) -> dict[str, dict[str, str]]:
    """``scontrol show node -o``'s fields of each node of the group slurmctld holds."""
    out = sh(env, "scontrol", "-o", "show", "node")
    nodes = [dict(t.split("=", 1) for t in ln.split() if "=" in t) for ln in out.splitlines()]
    return {n["NodeName"]: n for n in nodes if n.get("NodeName", "") in ALL}


def submit(lab: Lab, env: dict[str, str], script: str) -> int:
    """A two-node job on the group's partition; its id."""
    out = sh(env, "sbatch", "--parsable", "-p", dynamic.PARTITION, "-N2", "-t", "5",
             "-o", "/dev/null", "-D", lab.lab.shared_dir, "--wrap", script)  # fmt: skip
    return int(out.strip().split(";")[0])


def ended(env: dict[str, str], job: int) -> dict[str, str] | None:
    fields = job_fields(env, job)
    return fields if fields.get("JobState") in ENDED else None


@pytest.fixture
def made(lab: Lab, env: dict[str, str]) -> dict[str, dict[str, str]]:
    """The group's two nodes made by the daemon (its first pass after lab up), at rest
    (a node an earlier test used is released SuspendTime after its job)."""

    def both() -> dict[str, dict[str, str]] | None:
        now = shown(env)
        rest = all(f["State"].split("+")[-1] == "POWERED_DOWN" for f in now.values())
        return now if set(now) == set(MADE) and rest else None

    return wait(both, 120, "burst-dyn-[1-2] made by the daemon, powered down")


def test_a_job_bursts_onto_dynamic_nodes_through_a_slurmctld_restart(
    lab: Lab, env: dict[str, str], store: Store, made: dict[str, dict[str, str]]
) -> None:
    cfg = load_config(LAB_CONFIG)
    assert cfg.node_groups["dyn"].dynamic
    conf = Path(cfg.slurm.conf_dir) / "slurm-burst.conf"
    assert "burst-dyn" not in "".join(
        ln for ln in conf.read_text().splitlines() if ln.startswith("NodeName=")
    )
    for n in made.values():
        assert {"CLOUD", "DYNAMIC_NORM", "POWERED_DOWN"} <= set(n["State"].split("+")), n
        assert n["Partitions"] == dynamic.PARTITION and "sbdyn_dyn" in n["AvailableFeatures"]
    job = submit(lab, env, "srun hostname; sleep 15")
    wait(lambda: job_fields(env, job).get("JobState") == "RUNNING", 120, f"job {job} running")
    assert job_fields(env, job)["NodeList"] == "burst-dyn-[1-2]"

    lab.restart("slurmctld")  # the dynamic nodes are in its state: they come back with it
    after = shown(env)
    assert set(after) == set(MADE), after
    assert job_fields(env, job)["JobState"] == "RUNNING"
    # checked while the job holds them: once it ends, Slurm may release either node
    # SuspendTime (15 s) after, before the other is done completing
    for name in MADE:
        rec = store.node(name)
        assert rec is not None and rec.group == "dyn" and rec.state == NodeState.JOINED, rec
        # instance accounting holds for them as for declared nodes
        assert after[name].get("InstanceId") == rec.instance_id, after[name]
    done = wait(lambda: ended(env, job), 120, f"job {job} ending")
    assert done["JobState"] == "COMPLETED", done


@contextlib.contextmanager
def shrunk(lab: Lab) -> Iterator[None]:
    """The daemon restarted on the group's max_nodes lowered to 0; restored after (the
    daemon makes the two nodes again)."""
    where = dropin_dir(LAB_CONFIG)
    (where / SHRINK).write_text("[node_groups.dyn]\nmax_nodes = 0\n")
    (where / SHRINK).chmod(0o644)
    lab.restart("daemon")
    try:
        yield
    finally:
        (where / SHRINK).unlink(missing_ok=True)
        lab.restart("daemon")


def test_a_lowered_limit_deletes_the_nodes_once_released(
    lab: Lab, env: dict[str, str], store: Store, made: dict[str, dict[str, str]]
) -> None:
    up = [n for n, f in made.items() if "POWERED_DOWN" not in f["State"]]
    job = submit(lab, env, "sleep 8")
    wait(lambda: job_fields(env, job).get("JobState") == "RUNNING", 120, f"job {job} running")
    with shrunk(lab):
        # a job holds them: kept, however many passes go by
        wait(lambda: ended(env, job), 60, f"job {job} ending")
        assert set(shown(env)) == set(MADE), up
        # released by Slurm (SuspendTime 15 s), torn down, then deleted
        wait(lambda: not shown(env), 150, "the group's nodes deleted after their release")
        for name in MADE:
            rec = store.node(name)
            assert rec is not None and rec.state == NodeState.TERMINATED, rec
        details = [e["detail"] for e in store.events() if e["event"] == "dynamic.delete_nodes"]
        assert any("burst-dyn" in d for d in details), details
    # the limit back: the daemon makes them again, the lab as it was
    wait(lambda: set(shown(env)) == set(MADE), 60, "burst-dyn-[1-2] made again")
