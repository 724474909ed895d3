"""The ledger's transfers: every dataset moved for a job, recorded once, and read back
for chargeback reports and ``slurm-burst ledger transfers``.

A transfer is keyed by what it was (``Transfer.key``): the daemon's write, replayed from
the spool or repeated after a crash, adds nothing. Money stays integer micro-dollars.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, time
from typing import Any

from sqlalchemy import Engine, select

from slurm_burst.adapters.ledger.engine import insert_ignore, translated
from slurm_burst.adapters.ledger.models import TransferRow
from slurm_burst.core.pricing import dollars
from slurm_burst.core.usage import Transfer, TransferDirection

MAX_ROWS = 100_000  # what one listing returns at most


def record(engine: Engine, cluster: str, t: Transfer) -> None:
    """Record ``t`` once (a replay of the same key adds nothing)."""
    row = {
        "transfer_key": t.key[:200],
        "cluster": cluster,
        "job_id": t.job_id,
        "account": t.account[:64],
        "user": t.user[:64],
        "direction": TransferDirection(t.direction).value,
        "store": t.store[:64],
        "provider": t.provider[:64],
        "node": t.node[:128],
        "dataset": t.dataset[:4096],
        "manifest": t.manifest[:64],
        "logical_bytes": max(0, t.logical_bytes),
        "bytes_sent": max(0, t.bytes_sent),
        "objects": max(0, t.objects),
        "objects_sent": max(0, t.objects_sent),
        "seconds": max(0.0, t.seconds),
        "at": datetime.fromtimestamp(t.at, UTC),
        "per_gb": t.per_gb,
        "storage_per_gb_month": t.storage_per_gb_month,
        "cost_micros": max(0, t.cost_micros),
    }
    with translated(f"ledger transfer {t.direction}"), engine.begin() as conn:
        conn.execute(insert_ignore(engine, TransferRow.__table__), [row])  # type: ignore[arg-type]


def listing(
    engine: Engine, start: date, end: date, account: str = "", job: int = 0
) -> list[dict[str, Any]]:
    """Transfers that ended on days in [start, end), newest first (at most MAX_ROWS)."""
    t = TransferRow
    q = select(t).where(t.at >= day_start(start), t.at < day_start(end))
    if account:
        q = q.where(t.account == account)
    if job:
        q = q.where(t.job_id == job)
    q = q.order_by(t.at.desc(), t.id.desc()).limit(MAX_ROWS)
    with translated("ledger transfers"), engine.connect() as conn:
        rows = conn.execute(q).all()
    return [
        {
            "at": r.at.isoformat(),
            "job": r.job_id,
            "account": r.account,
            "user": r.user,
            "direction": getattr(r.direction, "value", r.direction),
            "store": r.store,
            "provider": r.provider,
            "node": r.node,
            "dataset": r.dataset,
            "manifest": r.manifest,
            "logical_bytes": int(r.logical_bytes),
            "bytes_sent": int(r.bytes_sent),
            "objects": r.objects,
            "objects_sent": r.objects_sent,
            "seconds": float(r.seconds),
            "per_gb": float(r.per_gb),
            "storage_per_gb_month": float(r.storage_per_gb_month),
            "cost": float(dollars(int(r.cost_micros))),
            "cost_micros": int(r.cost_micros),
        }
        for r in rows
    ]


def costs(
    engine: Engine, by: Sequence[str], start: date, end: date
) -> dict[tuple[str, ...], tuple[int, int]]:
    """Transfer cost and bytes sent by ``by`` keys (account, user, month, day, job;
    partition is '' : a transfer belongs to no partition) for days in [start, end)."""
    t = TransferRow
    q = (
        select(t.at, t.account, t.user, t.job_id, t.cost_micros, t.bytes_sent)
        .where(t.at >= day_start(start), t.at < day_start(end))
    )  # fmt: skip
    out: dict[tuple[str, ...], list[int]] = defaultdict(lambda: [0, 0])
    with translated("ledger report"), engine.connect() as conn:
        for at, account, user, job_id, cost, sent in conn.execute(q):
            sums = out[report_key(by, at, account, user, str(job_id))]
            sums[0] += int(cost)
            sums[1] += int(sent)
    return {k: (v[0], v[1]) for k, v in out.items()}


def export_lines(engine: Engine, start: date, end: date) -> Iterator[tuple[Any, ...]]:
    """Each transfer that ended on days in [start, end) as a charge line
    (``usage.EXPORT_COLUMNS``), streamed in (day, id) order: kind ``staging-in`` (a push),
    ``staging-pull`` (a node's pull) or ``staging-out`` (outputs brought home), job_key
    ``cluster:jobid`` (a transfer is the job's, not one run's; '' for an admin's
    pre-stage), no partition, no instance."""
    t = TransferRow
    q = (
        select(t.at, t.cluster, t.account, t.user, t.job_id, t.direction, t.cost_micros)
        .where(t.at >= day_start(start), t.at < day_start(end))
        .order_by(t.at, t.id)
    )  # fmt: skip
    with translated("ledger export"), engine.connect() as conn:
        result = conn.execution_options(yield_per=10_000).execute(q)
        for at, cluster, account, user, job, direction, cost in result:
            kind = f"staging-{getattr(direction, 'value', direction)}"
            yield charge_line(at, account, user, f"{cluster}:{job}" if job else "", kind, cost)


# -- what staging's rows (transfers and storage) share ---------------------------------


def report_key(
    by: Sequence[str], at: datetime, account: str, user: str, job: str
) -> tuple[str, ...]:
    """A staging row's key in a report by ``by``: it has no partition ('')."""
    d = at.date()  # UTCDateTime: read back UTC-aware
    named = {"account": account, "user": user, "partition": "", "job": job,
             "month": d.strftime("%Y-%m"), "day": d.isoformat()}  # fmt: skip
    return tuple(named[k] for k in by)


def charge_line(
    at: datetime, account: str, user: str, job_key: str, kind: str, cost: int
) -> tuple[Any, ...]:
    """A staging row as a charge line (``usage.EXPORT_COLUMNS``): no partition, no
    instance, no hours."""
    return (
        at.date().isoformat(), account, user, "", job_key, "", kind,
        str(dollars(int(cost))), int(cost), f"{0:.6f}", f"{0:.6f}",
    )  # fmt: skip


def day_start(d: date) -> datetime:
    return datetime.combine(d, time(0), UTC)
