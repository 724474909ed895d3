"""The GPU check's cost (issue 17): wall time of ``gpucheck.py check`` and ``sample`` for
8 GPUs on the simulated NVML (a real GPU: tests/integration/test_nvml_real.py), the
NVML calls per GPU, and the telemetry's per-pass CPU for 1,000 GPU nodes' samples.

The check's wall time is mostly Python's start-up and the 0.1 s the check listens for
XID events; NVML itself answers in microseconds here (on a real driver, each call is a
few ioctls). Printed with two CPU burners beside it too: the figures must hold on a
loaded controller.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sizes import size  # noqa: E402
from slurm_burst_lab import simnvml  # noqa: E402

from slurm_burst.core.gpu import GpuSample, UsageBook, by_group  # noqa: E402

CHECK = ROOT / "slurm_burst" / "node" / "gpucheck.py"


def _burn(stop: float) -> None:
    while time.time() < stop:
        pass


def _runs(argv: list[str], env: dict[str, str], n: int) -> tuple[float, float, dict[str, object]]:
    walls, last = [], {}
    for _ in range(n):
        t = time.perf_counter()
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        walls.append(time.perf_counter() - t)
        last = json.loads(r.stdout)
    return min(walls), statistics.median(walls), last


def bench_check(gpus: int = 8) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        simnvml.build(d)
        (d / "state").write_text(simnvml.render(gpus, {}))
        files = []
        for i in range(gpus):
            (d / f"nvidia{i}").touch()
            files.append(str(d / f"nvidia{i}"))
        (d / "expect.json").write_text(json.dumps({"count": gpus, "files": files}))
        (d / "kern").write_text("")
        env = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(d),
               "SIMNVML_STATE": str(d / "state"), "SIMNVML_CALLS": str(d / "calls")}  # fmt: skip
        check = [sys.executable, str(CHECK), "check", "--expect", str(d / "expect.json"),
                 "--kernel-log", str(d / "kern")]  # fmt: skip
        for load in ("idle", "2 CPU burners"):
            burners = []
            if load != "idle":
                stop = time.time() + 60
                burners = [multiprocessing.Process(target=_burn, args=(stop,)) for _ in range(2)]
                for p in burners:
                    p.start()
            try:
                best, median, report = _runs(check, env, 7)
                calls = sum(int(ln.split()[1]) for ln in (d / "calls").read_text().splitlines())
                print(f"GPU check, {gpus} GPUs (simulated NVML), {load:<14} best {best:6.3f} s "
                      f"median {median:6.3f} s (goal <= 1 s); in NVML {report['seconds']} s; "
                      f"{calls} NVML calls")  # fmt: skip
                best, median, _ = _runs([sys.executable, str(CHECK), "sample"], env, 7)
                print(f"GPU sample, {gpus} GPUs, {load:<14} best {best:6.3f} s "
                      f"median {median:6.3f} s")  # fmt: skip
            finally:
                for p in burners:
                    p.terminate()


def bench_telemetry_pass(nodes: int = 1000, gpus: int = 8) -> None:
    """The daemon's side of one telemetry pass: aggregates and the usage book."""
    samples = {
        f"gpu-{n}": [GpuSample(i, float((n + i) % 100), 1 << 30, 250.0) for i in range(gpus)]
        for n in range(nodes)
    }
    jobs = {(f"c:{n}:0", n): {f"gpu-{n}": tuple(range(gpus))} for n in range(nodes)}
    book = UsageBook()
    t = time.process_time()
    for k in range(10):
        by_group(samples, lambda name: "gpu")
        book.observe(1000.0 + 30 * k, 30.0, jobs, samples)
    cpu = (time.process_time() - t) / 10
    print(f"GPU telemetry pass, {nodes} nodes x {gpus} GPUs: {cpu * 1000:.1f} ms CPU "
          "(aggregates + usage book; SSH sampling is I/O, 8 nodes at once)")  # fmt: skip


if __name__ == "__main__":
    bench_check()
    bench_telemetry_pass(nodes=size(1000, 20))
