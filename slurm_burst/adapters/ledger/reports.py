"""Chargeback reports from the ledger: by account, user, partition, month or job.

Account, user, partition and month reports read ``charge_rollups`` (one row per
allocation pass and day, account, user and partition), so a month of millions
of charge lines is a few thousand rows to sum. Job reports read ``charges``
through its day index. Money stays integer micro-dollars until it is printed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import date
from typing import Any

from sqlalchemy import Engine, case, func, select

from slurm_burst.adapters.ledger.engine import translated
from slurm_burst.adapters.ledger.models import (
    OVERHEAD_KINDS,
    ChargeKind,
    ChargeRollup,
    ChargeRow,
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
    rows = [_row(dict(zip(by, key, strict=True)), *v) for key, v in acc.items()]
    return sorted(rows, key=lambda x: (-x["total_micros"], [x[k] for k in by]))


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
        for i in range(0, len(keys), 5000):
            chunk = keys[i : i + 5000]
            for row in conn.execute(select(JobRow).where(JobRow.job_key.in_(chunk))):
                jobs[row.job_key] = row
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
        rows.append(_row(head, *(int(v or 0) for v in sums)))
    return sorted(rows, key=lambda x: (-x["total_micros"], x["job_key"], x["account"]))


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
