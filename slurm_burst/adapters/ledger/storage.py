"""The ledger's storage: each store namespace's GB-months, booked by ``stage gc``.

A run books, per namespace, the period since that namespace's last booking (its
``at``) up to the run: the key of a row is its store, namespace and start, so two runs
that read the same last booking book the period once. Read back for chargeback reports,
budgets, ``ledger export`` (kind ``staging-stored``) and ``slurm-burst ledger storage``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, func, select

from slurm_burst.adapters.ledger.engine import insert_ignore, translated
from slurm_burst.adapters.ledger.models import StorageRow
from slurm_burst.adapters.ledger.transfers import charge_line, day_start, report_key
from slurm_burst.core.pricing import dollars
from slurm_burst.core.usage import StorageCharge

MAX_ROWS = 100_000  # what one listing returns at most


def record(engine: Engine, cluster: str, s: StorageCharge) -> None:
    """Record ``s`` once (a second booking of the same start adds nothing)."""
    row = {
        "storage_key": s.key[:200],
        "cluster": cluster,
        "store": s.store[:64],
        "provider": s.provider[:64],
        "account": s.account[:64],
        "namespace": s.namespace[:80],
        "period_start": None if s.start is None else datetime.fromtimestamp(s.start, UTC),
        "at": datetime.fromtimestamp(s.at, UTC),
        "key_count": max(0, s.key_count),
        "stored_bytes": max(0, s.stored_bytes),
        "gb_months": Decimal(f"{s.gb_months:.6f}"),
        "per_gb_month": s.per_gb_month,
        "cost_micros": max(0, s.cost_micros),
    }
    with translated("ledger storage"), engine.begin() as conn:
        conn.execute(insert_ignore(engine, StorageRow.__table__), [row])  # type: ignore[arg-type]


def booked_until(engine: Engine, cluster: str, store: str) -> dict[str, float]:
    """``{namespace: unix time}`` each namespace of ``store`` was last booked to."""
    s = StorageRow
    q = (
        select(s.namespace, func.max(s.at))
        .where(s.cluster == cluster, s.store == store)
        .group_by(s.namespace)
    )  # fmt: skip
    with translated("ledger storage"), engine.connect() as conn:
        return {ns: _aware(at).timestamp() for ns, at in conn.execute(q)}


def listing(engine: Engine, start: date, end: date, account: str = "") -> list[dict[str, Any]]:
    """Bookings made on days in [start, end), newest first (at most MAX_ROWS)."""
    s = StorageRow
    q = select(s).where(s.at >= day_start(start), s.at < day_start(end))
    if account:
        q = q.where(s.account == account)
    q = q.order_by(s.at.desc(), s.id.desc()).limit(MAX_ROWS)
    with translated("ledger storage"), engine.connect() as conn:
        rows = conn.execute(q).all()
    return [
        {
            "at": r.at.isoformat(),
            "start": None if r.period_start is None else r.period_start.isoformat(),
            "store": r.store,
            "provider": r.provider,
            "account": r.account,
            "namespace": r.namespace,
            "keys": int(r.key_count),
            "bytes": int(r.stored_bytes),
            "gb_months": float(r.gb_months),
            "per_gb_month": float(r.per_gb_month),
            "cost": float(dollars(int(r.cost_micros))),
            "cost_micros": int(r.cost_micros),
        }
        for r in rows
    ]


def costs(
    engine: Engine, by: Sequence[str], start: date, end: date
) -> dict[tuple[str, ...], tuple[int, int]]:
    """Storage cost by ``by`` keys for bookings on days in [start, end), with 0 bytes
    sent (storage moves nothing): user, partition and job are '' (an account's)."""
    s = StorageRow
    q = select(s.at, s.account, s.cost_micros).where(
        s.at >= day_start(start), s.at < day_start(end)
    )
    out: dict[tuple[str, ...], int] = defaultdict(int)
    with translated("ledger report"), engine.connect() as conn:
        for at, account, cost in conn.execute(q):
            out[report_key(by, at, account, "", "")] += int(cost)
    return {k: (v, 0) for k, v in out.items()}


def export_lines(engine: Engine, start: date, end: date) -> Iterator[tuple[Any, ...]]:
    """Each booking on days in [start, end) as a charge line (``usage.EXPORT_COLUMNS``),
    in (day, id) order: kind ``staging-stored``, no user, job, partition or instance."""
    s = StorageRow
    q = (
        select(s.at, s.account, s.cost_micros)
        .where(s.at >= day_start(start), s.at < day_start(end))
        .order_by(s.at, s.id)
    )  # fmt: skip
    with translated("ledger export"), engine.connect() as conn:
        result = conn.execution_options(yield_per=10_000).execute(q)
        for at, account, cost in result:
            yield charge_line(at, account, "", "", "staging-stored", cost)


def _aware(at: datetime) -> datetime:
    """``max()`` of a column reads back as the column's type on every dialect; this is
    a guard for a driver that hands back a naive value anyway."""
    return at if at.tzinfo else at.replace(tzinfo=UTC)
