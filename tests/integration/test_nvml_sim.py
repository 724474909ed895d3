"""The GPU check end to end on the simulated NVML: the real nvidia-ml-py loads the lab's
``libnvidia-ml.so.1`` (built here with gcc) by name, and ``node/gpucheck.py`` runs as
on a node. Each fault the lab injects, the NOT_SUPPORTED answers of an older GPU, the
HealthCheckProgram mode (chain, drain) and the NVML calls the check makes per GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from slurm_burst_lab import simnvml

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

CHECK = ROOT / "slurm_burst" / "node" / "gpucheck.py"


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("simnvml")
    simnvml.build(d)
    return d


class Node:
    """A pretend GPU node: its NVML state, device files, expectation file and log."""

    def __init__(self, root: Path, lib_dir: Path, gpus: int = 2) -> None:
        root.mkdir(exist_ok=True)
        self.root = root
        self.lib_dir = lib_dir
        self.gpus = gpus
        self.state = root / "nvml.state"
        self.calls = root / "calls"
        self.kernel_log = root / "kern.log"
        self.kernel_log.write_text("[ 1.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n")
        files = []
        for i in range(gpus):
            (root / f"nvidia{i}").touch()
            files.append(str(root / f"nvidia{i}"))
        self.expect = root / "gpu-check.json"
        self.expect.write_text(
            json.dumps(
                {
                    "count": gpus,
                    "files": files,
                    "model": "NVIDIA A100-SXM4-80GB",
                    "driver": "550.54.15",
                    "cuda": "12.4",
                }
            )
        )
        self.set({})

    def set(self, changes: dict[str, str | int]) -> None:
        self.state.write_text(simnvml.render(self.gpus, changes))

    def run(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
        r = subprocess.run(
            [sys.executable, str(CHECK), *args],
            env={
                "PATH": os.environ["PATH"],
                "LD_LIBRARY_PATH": str(self.lib_dir),
                "SIMNVML_STATE": str(self.state),
                "SIMNVML_CALLS": str(self.calls),
                **(env or {}),
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.stdout.strip(), r.stderr
        assert "Traceback" not in r.stderr, r.stderr
        return r.returncode, json.loads(r.stdout)

    def check(self, *extra: str) -> tuple[int, dict[str, object]]:
        return self.run(
            "check", "--expect", str(self.expect), "--kernel-log", str(self.kernel_log), *extra
        )

    def nvml_calls(self) -> Counter[str]:
        return Counter(
            {ln.split()[0]: int(ln.split()[1]) for ln in self.calls.read_text().splitlines()}
        )


@pytest.fixture
def node(tmp_path: Path, lib_dir: Path) -> Node:
    return Node(tmp_path, lib_dir)


def test_a_healthy_node_passes(node: Node) -> None:
    rc, report = node.check()
    assert rc == 0 and report["ok"] is True and report["problems"] == []
    assert report["driver"] == "550.54.15" and report["cuda"] == "12.4"
    assert [g["name"] for g in report["gpus"]] == ["NVIDIA A100-SXM4-80GB"] * 2  # type: ignore[attr-defined]


FAULTS = {
    "xid-79": ["gpu 1: XID 79 event"],
    "ecc-uncorrectable": ["gpu 0: 3 uncorrectable ECC errors"],
    "row-remap-pending": ["gpu 1: row remap pending (needs a GPU reset)"],
    "gpu-missing": ["1 GPU seen, 2 expected", "{root}/nvidia1 is no GPU NVML sees"],
    "wrong-driver": [
        "driver 535.104.05, the group pins 550.54.15",
        "driver supports CUDA 12.2, the group pins 12.4",
    ],
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_lab_fault_is_found(node: Node, fault: str) -> None:
    node.set(simnvml.FAULTS[fault])
    rc, report = node.check()
    assert rc == 1 and report["ok"] is False
    assert report["problems"] == [p.format(root=node.root) for p in FAULTS[fault]]


def test_xids_in_the_kernel_log_count_too(node: Node) -> None:
    with node.kernel_log.open("a") as fh:
        fh.write("[ 99.1] NVRM: Xid (PCI:0000:3b:00): 48, pid=77, DBE (double bit error)\n")
    rc, report = node.check()
    assert rc == 1 and report["problems"] == ["XID 48 on PCI:0000:3b:00 in the kernel log"]


def test_an_older_gpu_answers_not_supported_and_passes(node: Node) -> None:
    """Volta: no row remapping (page retirement instead); no ECC counters, no clocks
    reasons, no thresholds on this board: NOT_SUPPORTED is "not applicable"."""
    node.set(
        {
            "arch": "volta",
            "not_supported": "nvmlDeviceGetTotalEccErrors,nvmlDeviceGetCurrentClocksEventReasons,"
            "nvmlDeviceGetTemperatureThreshold",
        }
    )
    rc, report = node.check()
    assert rc == 0, report
    gpu = report["gpus"][0]  # type: ignore[index]
    assert gpu["remap_pending"] is None and gpu["ecc_uncorrected"] is None
    assert gpu["retired_pending"] is False
    node.set({"arch": "volta", "gpu0.retired_pending": 1})
    rc, report = node.check()
    assert rc == 1 and report["problems"] == ["gpu 0: page retirement pending (needs a GPU reset)"]


def test_nvml_calls_per_gpu(lib_dir: Path, tmp_path: Path) -> None:
    """The check's cost: 9 NVML calls per GPU on Ampere (10 before: page retirement is
    asked after row remapping answers NOT_SUPPORTED), 8 per node; a sample 4 per GPU."""
    per_node = {
        "nvmlInitWithFlags", "nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlEventSetCreate", "nvmlDeviceGetCount_v2", "nvmlEventSetWait_v2",
        "nvmlEventSetFree", "nvmlShutdown",
    }  # fmt: skip
    for gpus in (2, 8):
        big = Node(tmp_path / f"n{gpus}", lib_dir, gpus)
        assert big.check()[0] == 0
        calls = big.nvml_calls()
        assert sum(n for f, n in calls.items() if f in per_node) == 8
        assert sum(n for f, n in calls.items() if f not in per_node) == 9 * gpus, calls
        big.set({"arch": "volta"})
        assert big.check()[0] == 0
        assert sum(big.nvml_calls().values()) == 8 + 10 * gpus
        big.set({})
        rc, sample = big.run("sample")
        assert rc == 0 and len(sample["gpus"]) == gpus  # type: ignore[arg-type]
        assert sum(big.nvml_calls().values()) == 3 + 4 * gpus  # init, count, shutdown


def test_quick_mode_skips_the_event_wait(node: Node) -> None:
    rc, _ = node.check("--quick")
    assert rc == 0
    assert "nvmlEventSetWait_v2" not in node.nvml_calls()


def test_sample_reports_what_the_state_says(node: Node) -> None:
    node.set({"gpu0.util": 73, "gpu0.mem_used": 1 << 33, "gpu0.power_mw": 312500})
    rc, sample = node.run("sample")
    assert rc == 0
    first = sample["gpus"][0]  # type: ignore[index]
    assert first == {
        "index": 0,
        "utilization": 73,
        "memory_used_bytes": 1 << 33,
        "memory_total_bytes": 85899345920,
        "power_watts": 312.5,
    }


def test_health_mode_chains_the_site_check_and_drains(node: Node, tmp_path: Path) -> None:
    """As Slurm's HealthCheckProgram: the site's program (NHC) first, then the quick
    GPU check; a failure drains the node through scontrol with the reason (argv)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    said = tmp_path / "scontrol.argv"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {said}\n')
    scontrol.chmod(0o755)
    ran = tmp_path / "nhc.ran"
    nhc = bin_dir / "nhc"
    nhc.write_text(f"#!/bin/sh\ntouch {ran}\nexit 0\n")
    nhc.chmod(0o755)
    data = json.loads(node.expect.read_text())
    node.expect.write_text(json.dumps({**data, "chain": str(nhc)}))
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURMD_NODENAME": "burst-gpu-1"}
    rc, _ = node.run("health", "--expect", str(node.expect),
                     "--kernel-log", str(node.kernel_log), env=env)  # fmt: skip
    assert rc == 0 and ran.exists() and not said.exists()
    node.set({"gpu1.ecc_uncorrected": 1})
    rc, _ = node.run("health", "--expect", str(node.expect),
                          "--kernel-log", str(node.kernel_log), env=env)  # fmt: skip
    assert rc == 1
    assert said.read_text().splitlines() == [
        "update",
        "NodeName=burst-gpu-1",
        "State=DRAIN",
        "Reason=slurm-burst: gpu 1: 1 uncorrectable ECC errors (Code:GpuUnhealthy)",
    ]
    nhc.write_text("#!/bin/sh\nexit 3\n")  # the site's check failed: its code is ours
    node.set({})
    rc, _ = node.run("health", "--expect", str(node.expect),
                     "--kernel-log", str(node.kernel_log), env=env)  # fmt: skip
    assert rc == 3


def test_no_driver_no_library_and_hostile_expectations(node: Node, tmp_path: Path) -> None:
    node.state.unlink()  # the library is there, no driver loaded
    rc, report = node.check()
    assert rc == 3 and report["problems"] == ["NVML: Driver Not Loaded"]
    empty = tmp_path / "empty"
    empty.mkdir()
    r = subprocess.run(
        [sys.executable, str(CHECK), "sample"],
        env={"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(empty)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 3 and "NVML" in json.loads(r.stdout)["problems"][0]
    node.set({})
    for content in (b"\xff\xfe garbage", b"[]", b'{"count": 1e999}', b"[" * 30000, b"{" * 9):
        node.expect.write_bytes(content)
        rc, report = node.check()
        assert rc == 2 and report["problems"][0].startswith("bad expectation file")  # type: ignore[index]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    rc, report = node.run("check", "--expect", str(fifo), "--kernel-log", str(node.kernel_log))
    assert rc == 2 and "not a regular file" in report["problems"][0]  # type: ignore[index]


RUNTIME = ROOT / "slurm_burst" / "node" / "runtime.py"


def test_the_runtime_capture_reads_the_driver_through_nvml_and_a_wrong_one_is_refused(
    node: Node,
) -> None:
    """The runtime manifest's driver fields, as a burst node captures them (ctypes on
    libnvidia-ml.so.1, no nvidia-ml-py), through the simulated library; the lab's
    'wrong-driver' GPU is then older than the reference, beyond 'compatible'."""
    from slurm_burst.core.runtime import compare, from_document, mismatches

    def capture() -> dict[str, object]:
        env = {
            "PATH": os.environ["PATH"],
            "LD_LIBRARY_PATH": str(node.lib_dir),
            "SIMNVML_STATE": str(node.state),
        }
        argv = [sys.executable, str(RUNTIME), "capture"]
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=True)
        doc: dict[str, object] = json.loads(r.stdout)
        return doc

    healthy = capture()
    assert (healthy["driver"], healthy["cuda_driver"]) == ("550.54.15", "12.4")
    node.set(simnvml.FAULTS["wrong-driver"])
    wrong = capture()
    assert (wrong["driver"], wrong["cuda_driver"]) == ("535.104.05", "12.2")
    bad = mismatches(compare(from_document(healthy, "ref"), from_document(wrong, "node"),
                             "compatible"))  # fmt: skip
    assert [(d.field, d.reference, d.found) for d in bad] == [
        ("driver", "550.54.15", "535.104.05"), ("cuda_driver", "12.4", "12.2"),
    ]  # fmt: skip
