"""A small data-parallel training run for burst nodes: logistic regression on a dataset
staged in, its gradients reduced exactly, checkpoints a reclaim can resume from.

Run under MPI (``srun --mpi=pmix python3 train.py ...`` or ``mpirun``), one rank per
node or more. Every step takes the next fixed global batch of the dataset (the same
samples whatever the number of ranks), splits it over the ranks in contiguous blocks,
and each rank computes its samples' gradients in float64. They are summed exactly:
each sample's gradient is rounded to a fixed point (2**-32) and the int64 sums are
reduced with MPI's allreduce, which for integers is exact whatever the order it adds
in. So the loss curve is bit for bit the same on 1, 2 or 4 nodes (the fixed point
costs a rounding of at most 2**-33 per coordinate and sample, the same on every run).

A checkpoint (``--checkpoint DIR``, every ``--every`` steps and at once on SIGUSR1) holds
the weights, the step (the data position: batch ``step`` is samples ``step*B`` to
``(step+1)*B`` modulo the dataset), the RNG's state (the dropout of features below
draws from it) and the loss so far; written to a temporary file, fsynced and renamed,
so a reclaim mid-write leaves the previous one. On start the run resumes from the
checkpoint if there is one. On SIGUSR1 (``#SBATCH --signal=USR1@...`` signals every
task of the job's steps: a reclaim's notice) it checkpoints at the end of the current
step and waits to be requeued.

Prints one line a step on rank 0: ``step N loss L`` (``L`` as ``float.hex``: exact);
at the end ``trained N steps in T s`` (this run's) and ``final loss L after N steps``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

SCALE = float(2**32)  # the fixed point of a summed gradient


def load(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The dataset: ``X`` (n x d float64) and ``y`` (n, 0 or 1) from one .npz file."""
    with np.load(path) as data:
        return np.asarray(data["X"], dtype=np.float64), np.asarray(data["y"], dtype=np.float64)


def make_dataset(path: Path, n: int, d: int, seed: int) -> None:
    """A synthetic, learnable dataset (a hidden linear rule with noise)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    w = rng.standard_normal(d)
    y = (X @ w + 0.5 * rng.standard_normal(n) > 0).astype(np.float64)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, X=X, y=y)
    os.replace(tmp, path)


def exact_sum(comm: MPI.Comm, rows: np.ndarray) -> np.ndarray:
    """The sum over every rank's ``rows`` (float64), exact whatever the ranks: each row
    rounded to the fixed point, summed as int64 here and across ranks."""
    fixed = np.rint(rows * SCALE).astype(np.int64).sum(axis=0)
    total = np.empty_like(fixed)
    comm.Allreduce(fixed, total, op=MPI.SUM)
    return total.astype(np.float64) / SCALE


class Checkpoint:
    def __init__(self, where: Path | None) -> None:
        self.dir = where
        self.path = where / "checkpoint.npz" if where else None

    def save(self, w: np.ndarray, step: int, rng: np.random.Generator, losses: list[str]) -> None:
        if self.path is None:
            return
        assert self.dir is not None
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / ".checkpoint.tmp.npz"
        meta = json.dumps({"step": step, "rng": rng.bit_generator.state, "losses": losses})
        with open(tmp, "wb") as fh:
            np.savez(fh, w=w, meta=np.frombuffer(meta.encode(), dtype=np.uint8))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def load(self) -> tuple[np.ndarray, int, dict, list[str]] | None:
        if self.path is None or not self.path.exists():
            return None
        with np.load(self.path) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            return np.asarray(data["w"]), int(meta["step"]), meta["rng"], list(meta["losses"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--data", type=Path, required=True, help="the dataset (.npz: X, y)")
    ap.add_argument(
        "--make-data",
        metavar="N,D,SEED",
        default="",
        help="write a synthetic dataset of N samples and D features first",
    )
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256, help="the global batch")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--checkpoint", type=Path, default=None)
    ap.add_argument("--every", type=int, default=20, help="steps between checkpoints")
    ap.add_argument(
        "--step-time",
        type=float,
        default=0.0,
        help="seconds each step takes at least (a longer run for a demo)",
    )
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if args.make_data and rank == 0:
        n, d, seed = (int(x) for x in args.make_data.split(","))
        make_dataset(args.data, n, d, seed)
    comm.Barrier()
    X, y = load(args.data)
    n, d = X.shape
    if args.batch % size or args.batch > n:
        if rank == 0:
            print(
                f"train: the batch {args.batch} must be a multiple of the ranks ({size}) "
                f"and at most the dataset's {n} samples",
                file=sys.stderr,
            )
        return 2
    ckpt = Checkpoint(args.checkpoint if rank == 0 else None)
    w, step, rng, losses = np.zeros(d), 0, np.random.default_rng(args.seed), []
    found = ckpt.load() if rank == 0 else None  # the batch host's copy (staged in), to all
    found = comm.bcast(found, root=0)
    if found is not None:
        w, step, state, losses = found
        rng.bit_generator.state = state
        if rank == 0:
            print(f"resumed at step {step} from {args.checkpoint}", flush=True)
    asked = {"now": False}
    signal.signal(signal.SIGUSR1, lambda *_: asked.update(now=True))
    share = args.batch // size
    began_at, first = time.monotonic(), step
    while step < args.steps:
        began = time.monotonic()
        keep = rng.random(d) > 0.1  # feature dropout: the RNG's state matters on resume
        start = (step * args.batch + rank * share) % n
        idx = (np.arange(share) + start) % n
        xb, yb = X[idx] * keep, y[idx]
        p = 1.0 / (1.0 + np.exp(-(xb @ w)))
        eps = 1e-12
        per_loss = -(yb * np.log(p + eps) + (1 - yb) * np.log(1 - p + eps))
        grads = (p - yb)[:, None] * xb
        summed = exact_sum(comm, np.hstack([grads, per_loss[:, None]]))
        w = w - args.lr * summed[:d] / args.batch
        loss = summed[d] / args.batch
        step += 1
        losses.append(float(loss).hex())
        if rank == 0:
            print(f"step {step} loss {float(loss).hex()} ({loss:.6f})", flush=True)
        stop = comm.allreduce(1 if asked["now"] else 0, op=MPI.MAX)  # every rank alike
        if stop or step % args.every == 0 or step == args.steps:
            ckpt.save(w, step, rng, losses)
            if rank == 0 and args.checkpoint is not None:
                print(f"checkpoint at step {step}", flush=True)
        if stop:
            if rank == 0:
                print(
                    f"signalled: checkpointed at step {step}, waiting for the requeue", flush=True
                )
            while True:
                time.sleep(1)
        left = args.step_time - (time.monotonic() - began)
        if left > 0:
            time.sleep(left)
    if rank == 0:
        took = time.monotonic() - began_at
        print(f"trained {step - first} steps in {took:.3f} s", flush=True)
        print(f"final loss {losses[-1]} after {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
