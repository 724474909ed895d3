"""The GPU check and a telemetry sample against a real NVIDIA GPU (the driver's own
``libnvidia-ml.so.1``). Skipped where no such library loads: no machine of this
project's CI has one. The figures it prints (GPUs, driver, wall time) go in the notes."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

CHECK = ROOT / "slurm_burst" / "node" / "gpucheck.py"


def _real_nvml() -> str:
    """Why there is no real NVML here, or '' when there is one."""
    if os.environ.get("SIMNVML_STATE"):
        return "SIMNVML_STATE is set: that is the simulated library"
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return "no NVIDIA driver here (libnvidia-ml.so.1 does not load): no GPU to check"
    return ""


@pytest.mark.skipif(bool(_real_nvml()), reason=_real_nvml() or "real NVML")
def test_check_and_sample_on_a_real_gpu(tmp_path: Path) -> None:
    import pynvml  # type: ignore[import-untyped,unused-ignore]

    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        minors = [
            pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(i))
            for i in range(count)
        ]
    finally:
        pynvml.nvmlShutdown()
    expect = tmp_path / "gpu-check.json"
    expect.write_text(json.dumps({"count": count, "files": [f"/dev/nvidia{m}" for m in minors]}))
    started = time.monotonic()
    r = subprocess.run(
        [sys.executable, str(CHECK), "check", "--expect", str(expect)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    wall = time.monotonic() - started
    report = json.loads(r.stdout)
    print(f"\nreal GPU check: {count} GPU(s), driver {report['driver']}, CUDA {report['cuda']}, "
          f"exit {r.returncode}, {wall:.2f} s wall ({report['seconds']} s in NVML), "
          f"problems {report['problems']}, notes {report['notes']}")  # fmt: skip
    assert r.returncode in (0, 1), r.stderr  # a real GPU may be unhealthy; never a crash
    assert len(report["gpus"]) == count
    r = subprocess.run([sys.executable, str(CHECK), "sample"], capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    sample = json.loads(r.stdout)
    print(f"real GPU sample: {sample['gpus']}")
    assert len(sample["gpus"]) == count
    assert all(g.get("memory_total_bytes", 0) > 0 for g in sample["gpus"])
