"""The training job's programs (examples/training) under a real MPI (Debian's OpenMPI and
mpi4py, as on the lab's nodes), here on one machine: the loss curve is bit for bit the
same on 1, 2 and 4 ranks; a run signalled mid-way checkpoints and waits, and resumed on
another number of ranks it ends where an uninterrupted run ends; the allreduce benchmark
checks its sums; a batch that does not split is refused with the reason."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("mpirun") is None, reason="no OpenMPI here: make setup installs openmpi-bin"
    ),
]

TRAIN = ROOT / "examples" / "training" / "train.py"
ALLREDUCE = ROOT / "examples" / "training" / "allreduce.py"
PYTHON = "/usr/bin/python3"  # Debian's, with its mpi4py and numpy (the nodes' too)


def mpirun(ranks: int, *argv: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl": "self,vader,tcp", "OMPI_MCA_btl_tcp_if_include": "lo",
           "OMPI_MCA_oob_tcp_if_include": "lo"}  # fmt: skip
    return subprocess.Popen(
        ["mpirun", "--oversubscribe", "-np", str(ranks), PYTHON, *argv],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def run(ranks: int, *argv: str, cwd: Path) -> str:
    proc = mpirun(ranks, *argv, cwd=cwd)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    return out


def final(out: str) -> str:
    (line,) = [x for x in out.splitlines() if x.startswith("final loss ")]
    return line.split()[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("training") / "data.npz"
    run(1, str(TRAIN), "--data", str(where), "--make-data", "4096,32,7", "--steps", "1",
        cwd=where.parent)  # fmt: skip
    return where


def test_the_loss_curve_is_the_same_on_1_2_and_4_ranks(data: Path, tmp_path: Path) -> None:
    curves = []
    for ranks in (1, 2, 4):
        out = run(ranks, str(TRAIN), "--data", str(data), "--steps", "40", cwd=tmp_path)
        curves.append([x.split()[3] for x in out.splitlines() if x.startswith("step ")])
    assert len(curves[0]) == 40 and curves[0] == curves[1] == curves[2]
    first, last = float.fromhex(curves[0][0]), float.fromhex(curves[0][-1])
    assert last < 0.8 * first, (first, last)  # it learns


def test_a_signalled_run_checkpoints_and_resumed_elsewhere_ends_the_same(
    data: Path, tmp_path: Path
) -> None:
    """USR1 (a reclaim's notice, as Slurm's --signal sends it to a step's tasks): the run
    checkpoints at the end of its step and waits; killed (the requeue) and started again
    on 2 ranks, it resumes there and ends with the uninterrupted run's loss."""
    whole = final(run(4, str(TRAIN), "--data", str(data), "--steps", "60", cwd=tmp_path))
    ckpt = tmp_path / "ckpt"
    proc = mpirun(4, str(TRAIN), "--data", str(data), "--steps", "60", "--checkpoint",
                  str(ckpt), "--step-time", "0.1", "--every", "1000", cwd=tmp_path)  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step 5 "):
            os.killpg(proc.pid, signal.SIGUSR1)  # every rank, as Slurm signals a step
        if line.startswith("signalled:"):
            break
    assert any("checkpoint at step" in x for x in lines), lines
    time.sleep(0.5)
    assert proc.poll() is None  # it waits for the requeue, checkpoint written
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert (ckpt / "checkpoint.npz").exists() and not list(ckpt.glob(".checkpoint.tmp*"))
    out = run(2, str(TRAIN), "--data", str(data), "--steps", "60", "--checkpoint", str(ckpt),
              cwd=tmp_path)  # fmt: skip
    assert "resumed at step" in out and final(out) == whole, out[-2000:]


def test_the_allreduce_benchmark_checks_its_sums(tmp_path: Path) -> None:
    import json

    out = run(2, str(ALLREDUCE), "--json", "--max-bytes", str(1 << 20), "--iters", "3",
              cwd=tmp_path)  # fmt: skip
    rows = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert [r["bytes"] for r in rows] == [8, 64, 512, 4096, 32768, 262144, 1 << 20]
    assert all(r["ranks"] == 2 and r["seconds"] > 0 and r["busbw_MBps"] > 0 for r in rows)


def test_a_batch_that_does_not_split_over_the_ranks_is_refused(data: Path, tmp_path: Path) -> None:
    proc = mpirun(3, str(TRAIN), "--data", str(data), "--batch", "256", cwd=tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "multiple of the ranks (3)" in out, out[-2000:]
