"""Chargeback reports from the ledger: by account, user, partition, month or job.

Account, user, partition and month reports read ``charge_rollups`` (one row per
allocation pass and day, account, user and partition), so a month of millions
of charge lines is a few thousand rows to sum. Job reports read ``charges``
through its day index. Money stays integer micro-dollars until it is printed.

GPU use comes from ``gpu_usage`` (NVML samples per job and node): a job's
``gpu_util`` is the mean utilization of the GPUs it held, and its ``idle_gpu`` cost
is its allocated cost times the idle share; reports by other keys add those up.

Staging (``transfers``: pushes, node pulls) adds a ``staging`` column to every report
and to its total; a transfer belongs to no partition (``''`` in a report by partition),
and in a report by job it goes to the job's first run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import date
from typing import Any

from sqlalchemy import Engine, case, func, select

from slurm_burst.adapters.ledger import storage, transfers
from slurm_burst.adapters.ledger.engine import translated
from slurm_burst.adapters.ledger.models import (
    OVERHEAD_KINDS,
    ChargeKind,
    ChargeRollup,
    ChargeRow,
    GpuUsageRow,
    JobRow,
)
from slurm_burst.core.pricing import dollars

KEYS = ("account", "user", "partition", "month", "day", "job")
MS_PER_HOUR = 3_600_000


def report(engine: Engine, by: Sequence[str], start: date, end: date) -> list[dict[str, Any]]:
    """Rows grouped by ``by`` for charges on days in [start, end), largest total first."""
    if "job" in by:
        return _by_job(engine, start, end)
    r = ChargeRollup
    cols = [getattr(r, k) for k in by if k in ("account", "user", "partition")]
    day_needed = "month" in by or "day" in by
    group = [*([r.day] if day_needed else []), *cols]
    q = (
        select(
            *group,
            func.sum(r.usage_micros),
            func.sum(r.overhead_micros),
            func.sum(r.node_ms),
            func.sum(r.idle_node_ms),
            func.sum(r.gpu_ms),
        )
        .where(r.day >= start, r.day < end)
        .group_by(*group)
    )
    with translated("ledger report"), engine.connect() as conn:
        raw = conn.execute(q).all()
    acc: dict[tuple[str, ...], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for row in raw:
        vals = list(row)
        day = _as_date(vals.pop(0)) if day_needed else None
        named = dict(zip([c.key for c in cols], vals[: len(cols)], strict=True))
        key = []
        for k in by:
            if k == "month":
                key.append(day.strftime("%Y-%m") if day else "")
            elif k == "day":
                key.append(day.isoformat() if day else "")
            else:
                key.append(named[k] or "")
        sums = acc[tuple(key)]
        for i, v in enumerate(vals[len(cols) :]):
            sums[i] += int(v or 0)
    moved = staging_costs(engine, by, start, end)
    for extra in moved.keys() - acc.keys():
        acc[extra] = [0, 0, 0, 0, 0]  # staging alone: a job whose nodes are not billed yet
    rows = [_row(dict(zip(by, key, strict=True)), *v) for key, v in acc.items()]
    for line in rows:
        _staging(line, *moved.get(tuple(line[k] for k in by), (0, 0)))
    idle = _idle_gpu(engine, by, start, end)
    for line in rows:
        line["idle_gpu_micros"] = idle.get(tuple(line[k] for k in by), 0)
        line["idle_gpu"] = float(dollars(line["idle_gpu_micros"]))
    return sorted(rows, key=lambda x: (-x["total_micros"], [x[k] for k in by]))


def _gpu_use(gs: Any, busy: Any) -> float | None:
    return round(min(float(busy) / float(gs), 1.0), 4) if gs else None


def _usage_by_job() -> Any:
    u = GpuUsageRow
    return (
        select(
            u.job_key,
            func.sum(u.gpu_seconds).label("gs"),
            func.sum(u.busy_gpu_seconds).label("busy"),
        )
        .group_by(u.job_key)
        .subquery()
    )


def _idle_gpu(
    engine: Engine, by: Sequence[str], start: date, end: date
) -> dict[tuple[str, ...], int]:
    """Idle GPU cost by ``by`` keys: each sampled GPU job's allocated cost times the
    share of its GPU time its GPUs were idle (``gpu_usage``), in micro-dollars."""
    c, u = ChargeRow, _usage_by_job()
    q = (
        select(c.day, c.account, c.user, c.partition, c.amount_micros, u.c.gs, u.c.busy)
        .join(u, u.c.job_key == c.job_key)
        .where(c.day >= start, c.day < end, c.kind == ChargeKind.USAGE, u.c.gs > 0)
    )
    out: dict[tuple[str, ...], int] = defaultdict(int)
    with translated("ledger report"), engine.connect() as conn:
        for day, account, user, partition, amount, gs, busy in conn.execute(q):
            use = _gpu_use(gs, busy) or 0.0
            named = {"account": account, "user": user, "partition": partition}
            d = _as_date(day)
            named |= {"month": d.strftime("%Y-%m"), "day": d.isoformat()}
            out[tuple(named[k] or "" for k in by)] += round(int(amount) * (1 - use))
    return out


def _by_job(engine: Engine, start: date, end: date) -> list[dict[str, Any]]:
    c = ChargeRow
    is_overhead = c.kind.in_(sorted(OVERHEAD_KINDS))
    q = (
        select(
            c.job_key,
            c.account,
            c.user,
            c.partition,
            func.sum(case((is_overhead, 0), else_=c.amount_micros)),
            func.sum(case((is_overhead, c.amount_micros), else_=0)),
            func.sum(c.node_ms),
            func.sum(case((c.kind == ChargeKind.OVERHEAD, c.node_ms), else_=0)),
            func.sum(c.gpu_ms),
        )
        .where(c.day >= start, c.day < end)
        .group_by(c.job_key, c.account, c.user, c.partition)
    )
    with translated("ledger report"), engine.connect() as conn:
        raw = conn.execute(q).all()
        keys = sorted({r[0] for r in raw if r[0]})
        jobs: dict[str, Any] = {}
        use: dict[str, float | None] = {}
        u = _usage_by_job()
        for i in range(0, len(keys), 5000):
            chunk = keys[i : i + 5000]
            for row in conn.execute(select(JobRow).where(JobRow.job_key.in_(chunk))):
                jobs[row.job_key] = row
            for key, gs, busy in conn.execute(select(u).where(u.c.job_key.in_(chunk))):
                use[key] = _gpu_use(gs, busy)
    rows = []
    for key, account, user, partition, *sums in raw:
        j = jobs.get(key)
        head = {
            "job": str(j.job_id) if j else (key or "(overhead)"),
            "job_key": key,
            "account": account,
            "user": user,
            "partition": partition,
            "state": j.state if j else "",
            "start": j.start_at.isoformat() if j else None,
            "end": j.end_at.isoformat() if j else None,
        }
        line = _row(head, *(int(v or 0) for v in sums))
        util = line["gpu_util"] = use.get(key)  # the job's GPUs' mean use; None: unsampled
        idle = 0 if util is None else round(line["allocated_micros"] * (1 - util))
        line["idle_gpu_micros"] = idle
        line["idle_gpu"] = float(dollars(idle))
        rows.append(line)
    moved = staging_costs(engine, ("job", "account", "user"), start, end)
    seen: set[str] = set()
    for line in sorted(rows, key=lambda x: x["start"] or ""):
        key = (line["job"], line["account"], line["user"])
        if line["job_key"] and key in moved and line["job"] not in seen:
            seen.add(line["job"])  # a requeued job's transfers go to its first run
            _staging(line, *moved.pop(key))
        else:
            _staging(line, 0, 0)
    for (job, account, user), (micros, sent) in moved.items():
        head = {"job": _STAGING_ONLY.get(job, job), "job_key": "", "account": account,
                "user": user, "partition": "", "state": "", "start": None, "end": None}  # fmt: skip
        line = _row(head, 0, 0, 0, 0, 0)
        line |= {"gpu_util": None, "idle_gpu_micros": 0, "idle_gpu": 0.0}
        rows.append(_staging(line, micros, sent))
    return sorted(rows, key=lambda x: (-x["total_micros"], x["job_key"], x["account"]))


_STAGING_ONLY = {"0": "(pre-stage)", "": "(storage)"}  # the job column of staging not a job's


def staging_costs(
    engine: Engine, by: Sequence[str], start: date, end: date
) -> dict[tuple[str, ...], tuple[int, int]]:
    """Transfers' and storage's cost and bytes sent by ``by`` keys (the STAGING column)."""
    out = dict(transfers.costs(engine, by, start, end))
    for key, (micros, sent) in storage.costs(engine, by, start, end).items():
        was = out.get(key, (0, 0))
        out[key] = (was[0] + micros, was[1] + sent)
    return out


def _row(
    head: dict[str, Any], usage: int, overhead: int, node_ms: int, idle_ms: int, gpu_ms: int
) -> dict[str, Any]:
    total = usage + overhead
    return {
        **head,
        "instance_hours": round(node_ms / MS_PER_HOUR, 6),
        "gpu_hours": round(gpu_ms / MS_PER_HOUR, 6),
        "allocated": float(dollars(usage)),
        "overhead": float(dollars(overhead)),
        "total": float(dollars(total)),
        "idle_share": round(idle_ms / node_ms, 4) if node_ms else 0.0,
        "allocated_micros": usage,
        "overhead_micros": overhead,
        "total_micros": total,
    }


def _staging(line: dict[str, Any], micros: int, sent: int) -> dict[str, Any]:
    """Add a line's staging cost (transfers) to it and to its total."""
    line["staging_micros"] = micros
    line["staging"] = float(dollars(micros))
    line["staged_bytes"] = sent
    line["total_micros"] += micros
    line["total"] = float(dollars(line["total_micros"]))
    return line


def _as_date(v: Any) -> date:
    return v if isinstance(v, date) else date.fromisoformat(str(v)[:10])


def charge_lines(engine: Engine, start: date, end: date) -> Iterator[tuple[Any, ...]]:
    """Every charge line on days in [start, end), streamed in (day, id) order."""
    c = ChargeRow
    q = (
        select(c.day, c.account, c.user, c.partition, c.job_key, c.instance_id, c.kind,
               c.amount_micros, c.node_ms, c.gpu_ms)
        .where(c.day >= start, c.day < end)
        .order_by(c.day, c.id)
    )  # fmt: skip
    with translated("ledger export"), engine.connect() as conn:
        result = conn.execution_options(yield_per=10_000).execute(q)
        for day, account, user, part, job, inst, kind, amount, node_ms, gpu_ms in result:
            yield (
                _as_date(day).isoformat(), account, user, part, job, inst,
                getattr(kind, "value", kind), str(dollars(int(amount))), int(amount),
                f"{node_ms / MS_PER_HOUR:.6f}", f"{gpu_ms / MS_PER_HOUR:.6f}",
            )  # fmt: skip
