"""The GPU check's rules (node/gpucheck.py), the telemetry core (core/gpu.py), the job
GPU index parser, and the GPU settings of the config; pure, table-driven."""

from __future__ import annotations

import ast
import math
import sys
from dataclasses import replace

import pytest

from slurm_burst.config import GpuConfig
from slurm_burst.config.load import parse_config
from slurm_burst.core.gpu import GpuSample, SampleError, UsageBook, by_group, parse_sample
from slurm_burst.core.slurm import parse_job_gpus
from slurm_burst.node import gpucheck
from slurm_burst.node.gpucheck import Expect, Gpu, Snapshot, kernel_xids, problems
from tests.conftest import ROOT
from tests.unit.test_config import GOOD

HEALTHY = Snapshot(
    driver="550.54.15",
    cuda=12040,
    gpus=[
        Gpu(index=i, name="NVIDIA A100-SXM4-80GB", minor=i, ecc_uncorrected=0,
            remap_pending=False, remap_failure=False, temp=35, slowdown_temp=90,
            clocks_event=0x1)
        for i in range(2)
    ],
)  # fmt: skip
EXPECT = Expect(
    count=2,
    files=["/dev/nvidia0", "/dev/nvidia1"],
    model="NVIDIA A100-SXM4-80GB",
    driver="550.54.15",
    cuda="12.4",
)
FILES = {"/dev/nvidia0": 0, "/dev/nvidia1": 1}


def _gpu(i: int, **changes: object) -> Snapshot:
    gpus = list(HEALTHY.gpus)
    gpus[i] = replace(gpus[i], **changes)  # type: ignore[arg-type]
    return replace(HEALTHY, gpus=gpus)


CASES = [
    ("healthy", HEALTHY, [], FILES, False, []),
    ("one GPU missing", replace(HEALTHY, gpus=HEALTHY.gpus[:1]), [], FILES, False,
     ["1 GPU seen, 2 expected", "/dev/nvidia1 is no GPU NVML sees"]),
    ("wrong driver", replace(HEALTHY, driver="535.104.05"), [], FILES, False,
     ["driver 535.104.05, the group pins 550.54.15"]),
    ("CUDA too old", replace(HEALTHY, cuda=12020), [], FILES, False,
     ["driver supports CUDA 12.2, the group pins 12.4"]),
    ("CUDA newer is fine", replace(HEALTHY, cuda=12060), [], FILES, False, []),
    ("uncorrectable ECC", _gpu(0, ecc_uncorrected=3), [], FILES, False,
     ["gpu 0: 3 uncorrectable ECC errors"]),
    ("row remap pending", _gpu(1, remap_pending=True), [], FILES, False,
     ["gpu 1: row remap pending (needs a GPU reset)"]),
    ("row remap failed", _gpu(1, remap_failure=True), [], FILES, False,
     ["gpu 1: row remapping failed"]),
    ("pages pending (pre-Ampere)", _gpu(0, remap_pending=None, retired_pending=True), [],
     FILES, False, ["gpu 0: page retirement pending (needs a GPU reset)"]),
    ("NOT_SUPPORTED everywhere is healthy",
     _gpu(0, ecc_uncorrected=None, remap_pending=None, remap_failure=None, temp=None,
          slowdown_temp=None, clocks_event=None), [], FILES, False, []),
    ("XID 79 event", replace(HEALTHY, xid_events=[(1, 79)]), [], FILES, False,
     ["gpu 1: XID 79 event"]),
    ("XID 13 (the application's) is not the GPU's", replace(HEALTHY, xid_events=[(1, 13)]),
     [], FILES, False, []),
    ("XID in the kernel log", HEALTHY, [("PCI:0000:3b:00", 48), ("PCI:0000:3b:00", 48)],
     FILES, False, ["XID 48 on PCI:0000:3b:00 in the kernel log"]),
    ("thermal slowdown", _gpu(0, clocks_event=0x40), [], FILES, False,
     ["gpu 0: clocks throttled: hardware thermal slowdown"]),
    ("power cap while idle", _gpu(0, clocks_event=0x4), [], FILES, False,
     ["gpu 0: clocks throttled: power cap while idle"]),
    ("power cap under jobs (quick)", _gpu(0, clocks_event=0x4), [], FILES, True, []),
    ("at the slowdown temperature", _gpu(1, temp=90), [], FILES, False,
     ["gpu 1: at 90 C, slowdown at 90 C"]),
    ("wrong model", _gpu(0, name="NVIDIA A10G"), [], FILES, False,
     ["gpu 0: model 'NVIDIA A10G', the group has 'NVIDIA A100-SXM4-80GB'"]),
    ("lost GPU", _gpu(1, lost="GPU is lost"), [], FILES, False,
     ["gpu 1: unreadable (GPU is lost)"]),
    ("device file missing", HEALTHY, [], {"/dev/nvidia0": 0, "/dev/nvidia1": None}, False,
     ["/dev/nvidia1 missing"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("snap", "xids", "files", "quick", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_gpu_check_rules(
    snap: Snapshot,
    xids: list[tuple[str, int]],
    files: dict[str, int | None],
    quick: bool,
    expected: list[str],
) -> None:
    assert problems(snap, EXPECT, xids, files, quick) == expected


def test_kernel_log_xids() -> None:
    log = (
        "[  12.1] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15\n"
        "[ 301.9] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
        "[ 302.0] NVRM: Xid (PCI:0000:86:00): 13, Graphics SM Warp Exception\n"
        "[ 302.1] something else: Xid (PCI:0000:86:00) no number\n"
    )
    assert kernel_xids(log) == [("PCI:0000:3b:00", 79), ("PCI:0000:86:00", 13)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "JSON object"),
        ({"count": -1}, "whole number"),
        ({"count": True}, "whole number"),
        ({"count": 1, "cuda": "twelve"}, "cuda must look like"),
        ({"count": 1, "files": "/dev/nvidia0"}, "list of paths"),
        ({"count": 1, "surprise": 1}, "unknown keys"),
        ({"count": 1, "model": 7}, "model must be a string"),
    ],
)
def test_expectation_file_is_checked(data: object, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        Expect.from_json(data)


def test_the_node_check_needs_only_the_standard_library_and_pynvml() -> None:
    tree = ast.parse((ROOT / "slurm_burst" / "node" / "gpucheck.py").read_text())
    for node in ast.walk(tree):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        for name in names:
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or top in ("pynvml", "__future__"), name


def test_the_check_and_the_config_agree_on_critical_xids() -> None:
    assert GpuConfig().critical_xids == gpucheck.CRITICAL_XIDS


# -- telemetry core -----------------------------------------------------------------
def _sample(*utils: float | None) -> dict[str, object]:
    return {
        "gpus": [
            {"index": i, "utilization": u, "memory_used_bytes": 1 << 30, "power_watts": 100.0}
            for i, u in enumerate(utils)
        ]
    }


@pytest.mark.parametrize(
    "data",
    [
        None,
        {"gpus": "x"},
        {"gpus": [{"index": 1}]},
        _sample(101),
        _sample(math.nan),
        {"gpus": [{"index": 0, "utilization": "50"}]},
        {"gpus": [{"index": 0, "power_watts": 1e300}]},
        {"gpus": [{"index": i} for i in range(65)]},
    ],
    ids=["null", "not-a-list", "index", "over-100", "nan", "string", "huge", "too-many"],
)
def test_a_bad_sample_is_refused(data: object) -> None:
    with pytest.raises(SampleError):
        parse_sample(data)


def test_group_aggregates() -> None:
    samples = {"g-1": parse_sample(_sample(50, 100)), "g-2": parse_sample(_sample(None, 0)),
               "x-1": parse_sample(_sample(10))}  # fmt: skip
    agg = by_group(samples, lambda n: "gpu" if n.startswith("g-") else None)
    assert set(agg) == {"gpu"}
    assert agg["gpu"].gpus == 4
    assert agg["gpu"].utilization == pytest.approx(0.5)  # (50 + 100 + 0) / 3: None left out
    assert agg["gpu"].memory_used_bytes == 4 << 30
    assert agg["gpu"].power_watts == pytest.approx(400.0)


def test_usage_book_counts_the_gpus_each_job_held() -> None:
    book = UsageBook(flush_after=600)
    s = {"g-1": [GpuSample(0, 80.0, 1 << 30, 200.0), GpuSample(1, 0.0, 0, 60.0)]}
    jobs = {("c:7:100", 7): {"g-1": (0,)}, ("c:8:100", 8): {"g-1": (1,)}}
    assert book.observe(1000, 10, jobs, s) == []
    assert book.observe(1010, 10, jobs, s) == []
    done = book.observe(1020, 10, {("c:7:100", 7): {"g-1": (0,)}}, s)  # job 8 ended
    assert [(u.job_id, u.gpu_seconds, u.busy_gpu_seconds, u.samples) for u in done] == [
        (8, 20.0, 0.0, 2)
    ]
    (seven,) = book.close_all()
    assert seven.job_key == "c:7:100" and seven.gpus == 1 and seven.samples == 3
    assert seven.gpu_seconds == 30.0 and seven.busy_gpu_seconds == pytest.approx(24.0)
    assert (seven.start, seven.end) == (990, 1020)
    assert seven.memory_used_max_bytes == 1 << 30


def test_usage_book_flushes_long_jobs_and_skips_unsampled_nodes() -> None:
    book = UsageBook(flush_after=60)
    s = {"g-1": [GpuSample(0, 50.0, 0, 1.0)]}
    jobs = {("k", 1): {"g-1": (0,), "g-2": (0,)}}  # g-2 did not answer: not counted
    rows = [r for t in range(0, 100, 10) for r in book.observe(1000 + t, 10, jobs, s)]
    assert len(rows) == 1 and rows[0].node == "g-1" and rows[0].end - rows[0].start >= 60


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("JobId=5 Nodes=gpu-[1-2] CPU_IDs=0-1 Mem=0 GRES=gpu:a100:2(IDX:0-1) MinCPUsNode=1",
         {"gpu-1": (0, 1), "gpu-2": (0, 1)}),
        ("JobId=6 Nodes=n1 CPU_IDs=0 Mem=0 GRES= Nodes=n2 CPU_IDs=0 Mem=0 GRES=gpu(IDX:1,3)",
         {"n1": (), "n2": (1, 3)}),
        ("JobId=7 JobName=x NodeList=n1 TRES=cpu=1", {}),
    ],
    ids=["typed", "untyped-two-nodes", "no-detail"],
)  # fmt: skip
def test_job_gpu_indices(text: str, expected: dict[str, tuple[int, ...]]) -> None:
    assert parse_job_gpus(text) == expected


def test_job_gpu_indices_refuse_garbage() -> None:
    with pytest.raises(ValueError):
        parse_job_gpus("Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu(IDX:0-99999999)")


# -- config ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("[gpu]\ntelemetry_interval = nan\n", "gpu.telemetry_interval"),
        ('[gpu]\nnode_python = "python3"\n', "gpu.node_python"),
        ('[gpu]\nhealth_check_program = "/a b"\n', "gpu.health_check_program"),
        ("[gpu]\ncritical_xids = [0]\n", "gpu.critical_xids"),
        ("[gpu]\nhealth_check_interval = -1\n", "gpu.health_check_interval"),
    ],
)
def test_bad_gpu_settings_are_named(extra: str, key: str) -> None:
    _cfg, found = parse_config(GOOD + extra)
    assert key in [p.path for p in found if p.severity == "error"], found


def test_critical_xids_can_be_set() -> None:
    cfg, found = parse_config(GOOD + "[gpu]\ncritical_xids = [79, 48]\n")
    assert cfg is not None and cfg.gpu.critical_xids == (79, 48)
    _, found = parse_config(GOOD + "[gpu]\ncritical_xids = [0]\n")
    assert [(p.path, p.message) for p in found if p.severity == "error"] == [
        ("gpu.critical_xids", "must be XID numbers (1-9999)")
    ]
    _, found = parse_config(GOOD + '[gpu]\ncritical_xids = ["79"]\n')
    assert [p.path for p in found if p.severity == "error"] == ["gpu.critical_xids[0]"]


def test_gpu_pins_are_checked() -> None:
    cpu = GOOD.replace('gpus = 1\ngpu_type = "a10g"', 'gpus = 0\ngpu_driver = "550.54.15"')
    found = [(p.path, p.message) for p in parse_config(cpu)[1] if p.severity == "error"]
    assert ("node_groups.gpu.gpu_driver", "set, but gpus is 0") in found
    bad = GOOD.replace('gpu_type = "a10g"', 'gpu_type = "a10g"\ngpu_cuda = "12"\ngpu_driver = "x"')
    found = [(p.path, p.message) for p in parse_config(bad)[1] if p.severity == "error"]
    assert [k for k, _ in found] == ["node_groups.gpu.gpu_driver", "node_groups.gpu.gpu_cuda"]
