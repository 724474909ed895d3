"""slurm-burst's GPU check: run on a node, through NVML (nvidia-ml-py), before slurmd
starts and as Slurm's HealthCheckProgram.

The daemon copies this file to each GPU node with the bootstrap script and runs it
with the node's Python (``gpu.node_python``: an interpreter with nvidia-ml-py). It
needs nothing else of slurm-burst: the standard library and ``pynvml``.

``check`` compares what NVML sees with what the node group promises (the expectation
file the daemon writes, the same that gres.conf was generated from):

- GPU count and model; every gres.conf device file exists and is a GPU NVML sees
  (its minor number); the driver version; the highest CUDA the driver supports
  (NVML's CUDA version is that, not the installed runtime) at least the pinned one;
- no uncorrectable ECC error since the driver loaded (volatile counter);
- no pending or failed row remap (Ampere and later) or pending page retirement
  (before Ampere);
- no critical XID since boot: the kernel log's ``NVRM: Xid`` lines (NVML keeps no
  history), plus the XID events NVML delivers while the check runs;
- not throttled for thermal or power reasons, nor at the slowdown temperature.

An NVML answer of NOT_SUPPORTED (or a call an older driver lacks) means "not
applicable on this GPU" and is never a failure. ``--quick`` (the HealthCheckProgram
on a joined node, where jobs run) skips the event wait and the power-cap check, which
a busy GPU trips in normal work. ``sample`` prints utilization, memory and power per
GPU for the daemon's telemetry.

Output: one JSON object on stdout; exit 0 healthy, 1 unhealthy (``problems`` says
why), 2 bad usage or expectation file, 3 NVML unavailable (no library or driver).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

EXIT_OK, EXIT_UNHEALTHY, EXIT_USAGE, EXIT_NO_NVML = 0, 1, 2, 3

# XIDs after which a GPU must not take jobs until it is reset or replaced (NVIDIA's
# XID catalogue: 48 double-bit ECC, 61/62 internal micro-controller, 64 row remap
# or page retirement failure, 74 NVLink, 79 fell off the bus, 92 high single-bit ECC
# rate, 95 uncontained ECC, 119/120 GSP, 140 unrecovered ECC). Application faults
# (13, 31, 43, 45, 94) are the job's, not the GPU's.
CRITICAL_XIDS = (48, 61, 62, 64, 74, 79, 92, 95, 119, 120, 140)
XID_LINE = re.compile(r"NVRM: Xid \(([^)]*)\): (\d+)")

# clocks event reasons (nvmlClocksEventReason*): a GPU slowed for heat or power
THERMAL_POWER = {
    0x08: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}
SW_POWER_CAP = 0x04
EVENT_WAIT_MS = 100  # how long the check listens for XID events
CHAIN_TIMEOUT = 120  # seconds the site's own health check (NHC) may take
CONFIGLESS_CONF = "/run/slurm/conf/slurm.conf"  # slurmd's cache, linked there by slurmd


@dataclass
class Expect:
    """What the node group promises: the daemon writes it from the configuration."""

    count: int
    files: list[str] = field(default_factory=list)  # gres.conf File= entries, expanded
    model: str = ""  # NVML's name, e.g. "NVIDIA A100-SXM4-80GB"; "" = any
    driver: str = ""  # exact driver version; "" = any
    cuda: str = ""  # lowest CUDA the driver must support ("12.4"); "" = any
    critical_xids: list[int] = field(default_factory=lambda: list(CRITICAL_XIDS))
    chain: str = ""  # the site's HealthCheckProgram (NHC), run first by ``health``
    kernel_log: str = "/dev/kmsg"  # where NVRM Xid lines are read (--kernel-log wins)

    @classmethod
    def from_json(cls, data: Any) -> Expect:
        if not isinstance(data, dict):
            raise ValueError("the expectation file must hold a JSON object")
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown keys in the expectation file: {sorted(unknown)}")
        exp = cls(**data)
        if not isinstance(exp.count, int) or isinstance(exp.count, bool) or exp.count < 0:
            raise ValueError(f"count must be a whole number >= 0, not {exp.count!r}")
        for name in ("model", "driver", "cuda", "chain", "kernel_log"):
            if not isinstance(getattr(exp, name), str):
                raise ValueError(f"{name} must be a string")
        if not isinstance(exp.files, list) or not all(isinstance(f, str) for f in exp.files):
            raise ValueError("files must be a list of paths")
        if exp.cuda and cuda_number(exp.cuda) is None:
            raise ValueError(f"cuda must look like 12.4, not {exp.cuda!r}")
        return exp


@dataclass
class Gpu:
    """What NVML said about one GPU; None: NOT_SUPPORTED (not applicable here)."""

    index: int
    lost: str = ""  # the NVML error that made the GPU unreadable
    name: str = ""
    minor: int | None = None
    ecc_uncorrected: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_pending: bool | None = None
    temp: int | None = None
    slowdown_temp: int | None = None
    clocks_event: int | None = None


@dataclass
class Snapshot:
    driver: str = ""
    cuda: int | None = None  # 12040 for 12.4
    gpus: list[Gpu] = field(default_factory=list)
    xid_events: list[tuple[int, int]] = field(default_factory=list)  # (gpu index, xid)


# -- pure rules ---------------------------------------------------------------------
def cuda_number(text: str) -> int | None:
    """``"12.4"`` -> 12040 (NVML's encoding: 1000 * major + 10 * minor)."""
    m = re.fullmatch(r"(\d{1,3})\.(\d{1,2})", text.strip())
    return int(m.group(1)) * 1000 + int(m.group(2)) * 10 if m else None


def cuda_text(number: int) -> str:
    return f"{number // 1000}.{number % 1000 // 10}"


def kernel_xids(log: str) -> list[tuple[str, int]]:
    """``(pci address, xid)`` of each ``NVRM: Xid`` line in a kernel log."""
    return [(m.group(1), int(m.group(2))) for m in XID_LINE.finditer(log)]


def device_minor(path: str, st: os.stat_result) -> int | None:
    """A GPU device file's minor: the device's own (character device), else the number
    its name ends with (the lab's stand-in files)."""
    if stat.S_ISCHR(st.st_mode):
        return os.minor(st.st_rdev)
    m = re.search(r"(\d+)$", path)
    return int(m.group(1)) if m else None


def problems(
    snap: Snapshot,
    expect: Expect,
    xids: list[tuple[str, int]],
    files: dict[str, int | None],
    quick: bool = False,
) -> list[str]:
    """Everything wrong with the node's GPUs, worded for a Slurm reason; [] if healthy.

    ``files`` maps each promised device file to its minor number (None: missing).
    """
    out: list[str] = []
    if len(snap.gpus) != expect.count:
        seen = f"{len(snap.gpus)} GPU{'' if len(snap.gpus) == 1 else 's'} seen"
        out.append(f"{seen}, {expect.count} expected")
    if expect.driver and snap.driver != expect.driver:
        out.append(f"driver {snap.driver or 'unknown'}, the group pins {expect.driver}")
    wanted = cuda_number(expect.cuda) if expect.cuda else None
    if wanted is not None and snap.cuda is not None and snap.cuda < wanted:
        out.append(f"driver supports CUDA {cuda_text(snap.cuda)}, the group pins {expect.cuda}")
    minors = {g.minor for g in snap.gpus if g.minor is not None}
    for path, minor in files.items():
        if minor is None:
            out.append(f"{path} missing")
        elif minors and minor not in minors:
            out.append(f"{path} is no GPU NVML sees")
    critical = set(expect.critical_xids)
    for gpu in snap.gpus:
        out.extend(f"gpu {gpu.index}: {p}" for p in gpu_problems(gpu, expect, quick))
    for index, xid in snap.xid_events:
        if xid in critical:
            out.append(f"gpu {index}: XID {xid} event")
    for pci, xid in xids:
        if xid in critical:
            out.append(f"XID {xid} on {pci} in the kernel log")
    return list(dict.fromkeys(out))  # one XID logged twice is said once


def gpu_problems(gpu: Gpu, expect: Expect, quick: bool) -> list[str]:
    if gpu.lost:
        return [f"unreadable ({gpu.lost})"]
    out = []
    if expect.model and gpu.name.strip().lower() != expect.model.strip().lower():
        out.append(f"model {gpu.name!r}, the group has {expect.model!r}")
    if gpu.ecc_uncorrected:
        out.append(f"{gpu.ecc_uncorrected} uncorrectable ECC errors")
    if gpu.remap_failure:
        out.append("row remapping failed")
    if gpu.remap_pending:
        out.append("row remap pending (needs a GPU reset)")
    if gpu.retired_pending:
        out.append("page retirement pending (needs a GPU reset)")
    if gpu.clocks_event is not None:
        for bit, what in THERMAL_POWER.items():
            if gpu.clocks_event & bit:
                out.append(f"clocks throttled: {what}")
        if not quick and gpu.clocks_event & SW_POWER_CAP:
            out.append("clocks throttled: power cap while idle")
    if gpu.temp is not None and gpu.slowdown_temp and gpu.temp >= gpu.slowdown_temp:
        out.append(f"at {gpu.temp} C, slowdown at {gpu.slowdown_temp} C")
    return out


# -- NVML (the adapter) -------------------------------------------------------------
class Nvml:
    """The calls the check makes, through nvidia-ml-py; NOT_SUPPORTED -> None."""

    def __init__(self, pynvml: Any) -> None:
        self.n = pynvml

    def optional(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self.n.NVMLError as exc:
            if exc.value in (self.n.NVML_ERROR_NOT_SUPPORTED, self.n.NVML_ERROR_FUNCTION_NOT_FOUND):
                return None
            raise

    def snapshot(self, quick: bool) -> Snapshot:
        n = self.n
        snap = Snapshot(driver=_text(n.nvmlSystemGetDriverVersion()))
        snap.cuda = self.optional(n.nvmlSystemGetCudaDriverVersion_v2)
        events = None if quick else self.optional(n.nvmlEventSetCreate)
        handles = {}
        try:
            for i in range(n.nvmlDeviceGetCount()):
                gpu = Gpu(index=i)
                snap.gpus.append(gpu)
                try:
                    h = n.nvmlDeviceGetHandleByIndex(i)
                    self.read(h, gpu)
                    handles[i] = h
                except n.NVMLError as exc:
                    gpu.lost = str(exc)
                    continue
                if events is not None:
                    self.optional(
                        n.nvmlDeviceRegisterEvents, h, n.nvmlEventTypeXidCriticalError, events
                    )
            if events is not None:
                snap.xid_events = self.xid_events(events, handles)
        finally:
            if events is not None:
                n.nvmlEventSetFree(events)
        return snap

    def read(self, h: Any, gpu: Gpu) -> None:
        n = self.n
        gpu.name = _text(n.nvmlDeviceGetName(h))
        gpu.minor = self.optional(n.nvmlDeviceGetMinorNumber, h)
        gpu.ecc_uncorrected = self.optional(
            n.nvmlDeviceGetTotalEccErrors,
            h,
            n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            n.NVML_VOLATILE_ECC,
        )
        rows = self.optional(n.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            gpu.remap_pending, gpu.remap_failure = bool(rows[2]), bool(rows[3])
        else:  # before Ampere: page retirement
            pending = self.optional(n.nvmlDeviceGetRetiredPagesPendingStatus, h)
            gpu.retired_pending = None if pending is None else bool(pending)
        gpu.temp = self.optional(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
        gpu.slowdown_temp = self.optional(
            n.nvmlDeviceGetTemperatureThreshold, h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        )
        gpu.clocks_event = self.optional(n.nvmlDeviceGetCurrentClocksEventReasons, h)
        if gpu.clocks_event is None:  # drivers before 535 know only the older name
            gpu.clocks_event = self.optional(n.nvmlDeviceGetCurrentClocksThrottleReasons, h)

    def xid_events(self, events: Any, handles: dict[int, Any]) -> list[tuple[int, int]]:
        """XID events delivered within EVENT_WAIT_MS (NVML delivers what it has first)."""
        n = self.n
        index_of = {ctypes_address(h): i for i, h in handles.items()}
        out = []
        deadline = time.monotonic() + EVENT_WAIT_MS / 1000
        while True:  # asks at least once: a check descheduled past the deadline still reads
            left = max(0, int((deadline - time.monotonic()) * 1000))  # what NVML holds
            try:
                data = n.nvmlEventSetWait(events, left)
            except n.NVMLError as exc:
                if exc.value == n.NVML_ERROR_TIMEOUT:
                    break
                raise
            if data.eventType == n.nvmlEventTypeXidCriticalError:
                out.append((index_of.get(ctypes_address(data.device), -1), int(data.eventData)))
        return out

    def sample(self) -> list[dict[str, Any]]:
        """Utilization (%), memory used and total (bytes), power (W) per GPU."""
        n = self.n
        out = []
        for i in range(n.nvmlDeviceGetCount()):
            try:
                h = n.nvmlDeviceGetHandleByIndex(i)
                util = self.optional(n.nvmlDeviceGetUtilizationRates, h)
                mem = self.optional(n.nvmlDeviceGetMemoryInfo, h)
                power = self.optional(n.nvmlDeviceGetPowerUsage, h)
            except n.NVMLError as exc:
                out.append({"index": i, "lost": str(exc)})
                continue
            out.append(
                {
                    "index": i,
                    "utilization": None if util is None else int(util.gpu),
                    "memory_used_bytes": None if mem is None else int(mem.used),
                    "memory_total_bytes": None if mem is None else int(mem.total),
                    "power_watts": None if power is None else power / 1000.0,
                }
            )
        return out


def ctypes_address(handle: Any) -> int:
    """A device handle's identity (ctypes pointers to one device compare unequal)."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# -- the node's side ------------------------------------------------------------------
def read_kernel_log(path: str) -> tuple[str, str]:
    """The kernel log since boot (``/dev/kmsg`` record by record, or a text file);
    ``(text, note)`` where note says why it could not be read."""
    try:
        if path != "/dev/kmsg":  # a file holding this boot's kernel log: its last 8 MiB
            with open(path, "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - (8 << 20)))
                return fh.read(8 << 20).decode(errors="replace"), ""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return "", f"kernel log unreadable: {exc.strerror}"
    chunks = []
    try:
        while True:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                break  # the end of the ring buffer
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: a record was overwritten while reading
                    continue
                raise
            if not rec:
                break
            chunks.append(rec.decode(errors="replace").split(";", 1)[-1])
    finally:
        os.close(fd)
    return "".join(chunks), ""


def promised_files(expect: Expect) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for path in expect.files:
        try:
            out[path] = device_minor(path, os.stat(path))
        except OSError:
            out[path] = None
    return out


def load_expect(path: str) -> Expect:
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size > 65536:
        raise ValueError(f"{path}: not a regular file of at most 64 KiB")
    with open(path) as fh:
        try:
            data = json.load(fh)
        except RecursionError:
            raise ValueError(f"{path}: nested too deeply") from None
    return Expect.from_json(data)


def run_check(args: argparse.Namespace, pynvml: Any) -> tuple[int, dict[str, Any]]:
    expect = load_expect(args.expect)
    log, note = read_kernel_log(args.kernel_log or expect.kernel_log)
    started = time.monotonic()
    pynvml.nvmlInit()
    try:
        snap = Nvml(pynvml).snapshot(args.quick)
    finally:
        pynvml.nvmlShutdown()
    found = problems(snap, expect, kernel_xids(log), promised_files(expect), args.quick)
    report = {
        "ok": not found,
        "problems": found,
        "notes": [note] if note else [],
        "driver": snap.driver,
        "cuda": cuda_text(snap.cuda) if snap.cuda else None,
        "gpus": [asdict(g) for g in snap.gpus],
        "seconds": round(time.monotonic() - started, 3),
    }
    return (EXIT_UNHEALTHY if found else EXIT_OK), report


def drain(node: str, found: list[str]) -> str:
    """Drain ``node`` with the problems as its reason (argv, never a shell)."""
    reason = "slurm-burst: " + "; ".join(found)
    reason = " ".join(reason.split())[:200] + " (Code:GpuUnhealthy)"
    env = dict(os.environ)
    if "SLURM_CONF" not in env and os.path.exists(CONFIGLESS_CONF):
        env["SLURM_CONF"] = CONFIGLESS_CONF  # what a configless slurmd fetched
    r = subprocess.run(
        ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    return "" if r.returncode == 0 else (r.stderr or r.stdout).strip()[:300]


def run_chain(chain: str) -> int:
    """The site's own HealthCheckProgram (NHC): it drains by itself when it fails."""
    try:
        return subprocess.run([chain], timeout=CHAIN_TIMEOUT, stdin=subprocess.DEVNULL).returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"slurm-burst health: {chain}: {exc}", file=sys.stderr)
        return EXIT_UNHEALTHY


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpucheck", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    for mode in ("check", "health"):
        c = sub.add_parser(mode)
        c.add_argument("--expect", default="/etc/slurm-burst/gpu-check.json")
        c.add_argument("--kernel-log", help="default: the expectation file's, or /dev/kmsg")
        c.add_argument("--quick", action="store_true", help="skip the event wait and power cap")
        c.add_argument("--node", default=os.environ.get("SLURMD_NODENAME", ""))
    sub.add_parser("sample")
    args = p.parse_args(argv)
    try:
        import pynvml  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        print(json.dumps({"ok": False, "problems": ["nvidia-ml-py is not installed"]}))
        return EXIT_NO_NVML
    rc = EXIT_OK
    try:
        if args.mode == "sample":
            pynvml.nvmlInit()
            try:
                print(json.dumps({"gpus": Nvml(pynvml).sample(), "at": time.time()}))
            finally:
                pynvml.nvmlShutdown()
            return EXIT_OK
        if args.mode == "health":
            expect = load_expect(args.expect)
            rc = run_chain(expect.chain) if expect.chain else EXIT_OK
            args.quick = True
        code, report = run_check(args, pynvml)
    except (OSError, ValueError) as exc:
        print(json.dumps({"ok": False, "problems": [f"bad expectation file: {exc}"]}))
        return EXIT_USAGE
    except pynvml.NVMLError as exc:
        print(json.dumps({"ok": False, "problems": [f"NVML: {exc}"]}))
        if args.mode == "health" and args.node:
            drain(args.node, [f"NVML: {exc}"])
        return EXIT_NO_NVML
    if args.mode == "health" and report["problems"] and args.node:
        failed = drain(args.node, report["problems"])
        if failed:
            report["notes"].append(f"drain failed: {failed}")
    print(json.dumps(report))
    return max(rc, code)


if __name__ == "__main__":
    sys.exit(main())
