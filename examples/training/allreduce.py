"""An MPI allreduce benchmark in the manner of the OSU and nccl-tests ones: for each size
from 8 B to 64 MiB, the mean time of ``--iters`` allreduces (sum of float64, after
``--warmup`` untimed ones), its algorithm bandwidth (bytes / time) and bus bandwidth
(times 2(n-1)/n, what each rank's link carries in a ring). One JSON line a size on
rank 0 (``--json``) or a table."""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from mpi4py import MPI

KIB, MIB = 1 << 10, 1 << 20
SIZES = [8, 64, 512, 4 * KIB, 32 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-bytes", type=int, default=64 * MIB)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank == 0 and not args.json:
        print(
            f"{'bytes':>10} {'time us':>12} {'algbw MB/s':>12} {'busbw MB/s':>12}  ({size} ranks)"
        )
    for nbytes in [s for s in SIZES if s <= args.max_bytes]:
        send = np.full(nbytes // 8, float(rank + 1))
        recv = np.empty_like(send)
        iters = args.iters if nbytes < 8 * MIB else max(2, args.iters // 4)
        for _ in range(args.warmup):
            comm.Allreduce(send, recv, op=MPI.SUM)
        comm.Barrier()
        began = time.perf_counter()
        for _ in range(iters):
            comm.Allreduce(send, recv, op=MPI.SUM)
        took = comm.allreduce(time.perf_counter() - began, op=MPI.MAX) / iters
        expected = size * (size + 1) / 2
        if not np.all(recv == expected):
            print(f"allreduce: wrong sum at {nbytes} bytes", file=sys.stderr)
            return 1
        algbw = nbytes / took / 1e6
        busbw = algbw * 2 * (size - 1) / size
        if rank == 0:
            if args.json:
                print(
                    json.dumps(
                        {
                            "bytes": nbytes,
                            "ranks": size,
                            "seconds": took,
                            "algbw_MBps": algbw,
                            "busbw_MBps": busbw,
                        }
                    ),
                    flush=True,
                )
            else:
                print(f"{nbytes:>10} {took * 1e6:>12.1f} {algbw:>12.1f} {busbw:>12.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
