"""Job traces for the what-if simulator, parsed from text: pure (lines in, jobs out).

Three sources, one shape (:class:`TraceJob`: submit time, run time, time limit, CPUs,
GPUs, account):

- **SWF**, the Parallel Workloads Archive's Standard Workload Format: ``;`` header
  lines (``MaxProcs``, ``MaxNodes``, ``UnixStartTime``...), then 18 whitespace-separated
  fields per job, ``-1`` meaning unknown. Processors are the requested ones (else the
  allocated); the limit is the requested time (else run time x ``limit_factor``); the
  account is the group id. Jobs that never ran (run time unknown or 0: cancelled while
  queued) are left out and counted.
- **Alibaba's GPU trace** (cluster-trace-gpu-v2023, "openb" pod list, CSV with a
  header): submit = ``creation_time``, run = ``deletion_time - scheduled_time``;
  CPUs from ``cpu_milli`` (rounded up), GPUs from ``num_gpu`` (a GPU-sharing task holds
  one whole GPU here: Slurm's GRES are whole devices); the account is the QoS class.
  Tasks never scheduled (``Pending``) are left out and counted.
- **sacct** (``sacct -P -X -o JobIDRaw,Submit,Start,End,Elapsed...``): see
  :func:`parse_sacct`, the site's own history.

A job whose run time exceeds its limit gets the run time as limit (Slurm would have
ended it at the limit; the trace says it ran). Bad input raises :class:`TraceError`
naming the line and the field.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from slurm_burst.core.errors import BadInput
from slurm_burst.core.numbers import is_digits, whole

SWF_FIELDS = 18
MAX_LINE = 4096  # a trace line is < 200 bytes; a longer one is not a trace
# Bounds on what a trace may say (docs/operations.md, "Input bounds"): beyond them a value
# is a corrupt field, not a job. A job runs at most 40 years (the longest of the Parallel
# Workloads Archive ran 53 days, but a what-if trace may hold a job of 10**9 s: the
# simulator's work does not grow with it); a trace spans at most 100 years. Sums of such
# times stay exact in floating point.
MAX_RUN = 40 * 366 * 86400.0
MAX_SPAN = 100 * 366 * 86400.0
MAX_PROCS = 10_000_000
MAX_GPUS = 4096
_NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?", re.ASCII)


class TraceError(BadInput, ValueError):
    """A trace that cannot be read; the message names the line and what is wrong."""

    code = "BadTrace"


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    submit: float  # seconds from the trace's origin
    run: float  # seconds it ran
    limit: float  # requested wall time, seconds (>= run)
    cpus: int
    gpus: int = 0
    account: str = ""
    user: str = ""
    queue: str = ""


@dataclass(frozen=True)
class Trace:
    jobs: list[TraceJob]
    source: str = ""
    max_procs: int | None = None  # SWF header: the machine the trace ran on
    max_nodes: int | None = None
    start_epoch: float | None = None  # unix time of submit 0, where known
    utc_offset: float | None = None  # seconds east of UTC of the trace's site (SWF TimeZone)
    skipped: dict[str, int] = field(default_factory=dict)  # why -> how many

    @property
    def gpus(self) -> bool:
        return any(j.gpus for j in self.jobs)

    @property
    def week_origin(self) -> int:
        """The minute of the week (Monday 00:00 = 0), local time, of trace time 0; a trace
        with no start time is taken to start on a Monday at midnight."""
        if self.start_epoch is None:
            return 0
        local = self.start_epoch + (self.utc_offset or 0.0)
        return int((local // 60 + 3 * 1440) % (7 * 1440))  # 1970-01-01 was a Thursday


def _lines(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(lines, start=1):
        if len(line) > MAX_LINE:
            raise TraceError(f"line {number}: {len(line):,} characters: not a trace line")
        yield number, line.rstrip("\n")


def _number(text: str, number: int, what: str) -> float:
    """A number written in ASCII (float() also takes other scripts' digits, '1_0',
    'nan' and 'inf'), at most 10**15 in size."""
    text = text.strip()
    if _NUMBER.fullmatch(text) is None or len(text) > 40:
        raise TraceError(f"line {number}: {what} is not a number: {text[:40]!r}")
    value = float(text)
    if not abs(value) <= 1e15:
        raise TraceError(f"line {number}: {what} {text[:40]!r} is out of bounds")
    return value


def _job_times(number: int, submit: float, run: float) -> None:
    if submit < 0 or submit > MAX_SPAN:
        raise TraceError(f"line {number}: submit time {submit:g} s is not within 100 years")
    if run > MAX_RUN:
        raise TraceError(f"line {number}: run time {run:g} s is over 40 years: not a job's")


def _limit(run: float, requested: float, factor: float) -> float:
    return max(run, requested if requested > 0 else run * factor)


def parse_swf(lines: Iterable[str], source: str = "", limit_factor: float = 2.0) -> Trace:
    header: dict[str, tuple[str, int]] = {}
    jobs: list[TraceJob] = []
    skipped: dict[str, int] = {}
    for number, line in _lines(lines):
        text = line.strip()
        if not text:
            continue
        if text.startswith(";"):
            key, sep, value = text[1:].partition(":")
            if sep:
                header.setdefault(key.strip(), (value.strip(), number))
            continue
        fields = text.split()
        if len(fields) != SWF_FIELDS:
            raise TraceError(f"line {number}: {len(fields)} fields, SWF has {SWF_FIELDS}")
        v = [_number(f, number, f"field {i + 1}") for i, f in enumerate(fields)]
        submit, run, allocated, requested_procs, requested_time = v[1], v[3], v[4], v[7], v[8]
        if submit == -1:  # SWF's "unknown" (LLNL-Thunder has such lines)
            skipped["no submit time"] = skipped.get("no submit time", 0) + 1
            continue
        _job_times(number, submit, run)
        if run <= 0:
            skipped["never ran"] = skipped.get("never ran", 0) + 1
            continue
        procs = int(requested_procs if requested_procs > 0 else allocated)
        if procs > MAX_PROCS:
            raise TraceError(f"line {number}: {procs:,} processors is over {MAX_PROCS:,}")
        if procs < 1:
            skipped["no processor count"] = skipped.get("no processor count", 0) + 1
            continue
        jobs.append(
            TraceJob(
                id=fields[0],
                submit=submit,
                run=run,
                limit=min(_limit(run, requested_time, limit_factor), MAX_RUN),
                cpus=procs,
                account=fields[12] if v[12] >= 0 else "",
                user=fields[11] if v[11] >= 0 else "",
                queue=fields[14] if v[14] >= 0 else "",
            )
        )
    jobs.sort(key=lambda j: j.submit)
    return Trace(
        jobs,
        source,
        max_procs=_header_int(header, "MaxProcs", 1, MAX_PROCS),
        max_nodes=_header_int(header, "MaxNodes", 1, MAX_PROCS),
        start_epoch=_header_float(header, "UnixStartTime", 0, 2**33),
        utc_offset=_header_float(header, "TimeZone", -86400, 86400),
        skipped=skipped,
    )


# SWF header values: a whole number within bounds, or text (some traces write words
# there: left out); a number beyond them is a corrupt header, said with its line.
_HEADER_INT = re.compile(r"-?[0-9]+", re.ASCII)


def _header_int(header: dict[str, tuple[str, int]], key: str, low: int, high: int) -> int | None:
    value, number = header.get(key, ("", 0))
    if _HEADER_INT.fullmatch(value) is None:
        return None
    try:
        return whole(value, low, high, key, signed=True)
    except ValueError as exc:
        raise TraceError(f"line {number}: {exc}") from None


def _header_float(
    header: dict[str, tuple[str, int]], key: str, low: int, high: int
) -> float | None:
    value = _header_int(header, key, low, high)
    return None if value is None else float(value)


ALIBABA_COLUMNS = ("name", "cpu_milli", "num_gpu", "qos", "creation_time", "scheduled_time",
                   "deletion_time")  # fmt: skip


def parse_alibaba(lines: Iterable[str], source: str = "", limit_factor: float = 2.0) -> Trace:
    rows = _csv_rows(lines)
    try:
        head = next(rows)
    except StopIteration:
        raise TraceError("line 1: empty file, expected the CSV header") from None
    missing = [c for c in ALIBABA_COLUMNS if c not in head]
    if missing:
        raise TraceError(f"line 1: the header lacks {', '.join(missing)}")
    col = {name: head.index(name) for name in ALIBABA_COLUMNS}
    jobs: list[TraceJob] = []
    skipped: dict[str, int] = {}
    for number, row in enumerate(rows, start=2):
        if not row:
            continue
        if len(row) != len(head):
            raise TraceError(f"line {number}: {len(row)} columns, the header has {len(head)}")
        if not row[col["scheduled_time"]].strip():
            skipped["never scheduled"] = skipped.get("never scheduled", 0) + 1
            continue
        submit = _number(row[col["creation_time"]], number, "creation_time")
        start = _number(row[col["scheduled_time"]], number, "scheduled_time")
        end = _number(row[col["deletion_time"]], number, "deletion_time")
        run = end - start
        if submit < 0 or start < submit:
            raise TraceError(f"line {number}: scheduled_time before creation_time")
        _job_times(number, submit, run)
        if run <= 0:
            skipped["never ran"] = skipped.get("never ran", 0) + 1
            continue
        cpu_milli = _number(row[col["cpu_milli"]], number, "cpu_milli")
        gpus = _number(row[col["num_gpu"]], number, "num_gpu")
        if cpu_milli <= 0 or gpus < 0 or gpus != int(gpus) or gpus > 64:
            raise TraceError(f"line {number}: cpu_milli {cpu_milli:g} / num_gpu {gpus:g}")
        jobs.append(
            TraceJob(
                id=row[col["name"]],
                submit=submit,
                run=run,
                limit=run * limit_factor,
                cpus=math.ceil(cpu_milli / 1000),
                gpus=int(gpus),
                account=row[col["qos"]],
            )
        )
    jobs.sort(key=lambda j: j.submit)
    return Trace(jobs, source, skipped=skipped)


def _csv_rows(lines: Iterable[str]) -> Iterator[list[str]]:
    """CSV rows, with csv's own errors (a quoted field over its size limit, a NUL) as
    TraceError naming the line."""
    reader = csv.reader(line for _, line in _lines(lines))
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise TraceError(f"line {reader.line_num:,}: not CSV: {exc}") from None
        yield row


def parse_sacct(lines: Iterable[str], source: str = "sacct", limit_factor: float = 2.0) -> Trace:
    """``sacct -a -X -P -n -o JobIDRaw,Account,User,Submit,Start,End,TimelimitRaw,
    NCPUS,AllocTRES`` (ISO times; TimelimitRaw in minutes): the site's own history. Jobs
    that never started are left out; times count from the first submit."""
    raw: list[tuple[str, str, str, float, float, float, float, int, int]] = []
    skipped: dict[str, int] = {}
    for number, line in _lines(lines):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 9:
            raise TraceError(f"line {number}: {len(parts)} fields, expected 9 (see --help)")
        job, account, user, submit, start, end, limit, ncpus, tres = parts
        if start in ("", "Unknown", "None") or end in ("", "Unknown", "None"):
            skipped["never ran"] = skipped.get("never ran", 0) + 1
            continue
        t_sub, t_start, t_end = (_iso(x, number) for x in (submit, start, end))
        if t_end <= t_start:
            skipped["never ran"] = skipped.get("never ran", 0) + 1
            continue
        minutes = _whole(limit, number, "TimelimitRaw", MAX_RUN // 60) if is_digits(limit) else 0
        cpus = _whole(ncpus, number, "NCPUS", MAX_PROCS)
        gpus = _tres_gpus(tres, number)
        _job_times(number, 0.0, t_end - t_start)
        raw.append((job, account, user, t_sub, t_start, t_end, minutes * 60, max(cpus, 1), gpus))
    origin = min((r[3] for r in raw), default=0.0)
    jobs = [
        TraceJob(
            id=job,
            submit=sub - origin,
            run=end - start,
            limit=_limit(end - start, limit_s, limit_factor),
            cpus=cpus,
            gpus=gpus,
            account=account,
            user=user,
        )
        for job, account, user, sub, start, end, limit_s, cpus, gpus in raw
    ]
    jobs.sort(key=lambda j: j.submit)
    return Trace(jobs, source, start_epoch=origin if raw else None, skipped=skipped)


def _iso(text: str, number: int) -> float:
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise TraceError(f"line {number}: not a time: {text[:40]!r}") from None


def _whole(text: str, number: int, what: str, high: float) -> int:
    try:
        return whole(text, 0, int(high), what)
    except ValueError as exc:
        raise TraceError(f"line {number}: {exc}") from None


def _tres_gpus(tres: str, number: int) -> int:
    """GPUs of AllocTRES (``gres/gpu=N``): a whole number, 0 to 4,096 (never negative:
    a negative count would be reported as negative utilization)."""
    for item in filter(None, tres.split(",")):
        key, _, value = item.partition("=")
        if key == "gres/gpu":
            return _whole(value, number, "gres/gpu", MAX_GPUS)
    return 0
