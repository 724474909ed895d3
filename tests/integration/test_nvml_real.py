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


@pytest.mark.skipif(bool(_real_nvml()), reason=_real_nvml() or "real NVML")
def test_runtime_capture_reads_the_real_driver_as_nvml_says_it() -> None:
    """``slurm-burst runtime capture``'s driver fields (ctypes, no nvidia-ml-py) against
    what nvidia-ml-py reads from the same driver; with NCCL installed, its version too."""
    import pynvml  # type: ignore[import-untyped,unused-ignore]

    done = subprocess.run(
        [sys.executable, str(ROOT / "slurm_burst" / "node" / "runtime.py"), "capture"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    doc = json.loads(done.stdout)
    pynvml.nvmlInit()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
    finally:
        pynvml.nvmlShutdown()
    driver = driver.decode() if isinstance(driver, bytes) else driver
    assert doc["driver"] == driver
    assert doc["cuda_driver"] == f"{cuda // 1000}.{cuda % 1000 // 10}"
    print(f"\nruntime capture on a real GPU: {json.dumps(doc, sort_keys=True)}")
