"""The Ledger port over SQLAlchemy: SQLite by default, PostgreSQL in production, MariaDB too.

Every write is idempotent, keyed by what the row is about (instance and event,
job key, allocated instance, charge line), so that a write replayed from the
spool, or repeated after a crash, adds nothing. Rows are only ever inserted.
Database errors leave as :class:`LedgerUnavailable` (connection problems: the
caller spools) or :class:`LedgerError`; nothing above this module sees SQLAlchemy.
"""

from __future__ import annotations

import getpass
import heapq
import logging
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from slurm_burst.adapters.ledger import migrate, reports, storage, transfers
from slurm_burst.adapters.ledger.engine import bulk_insert, insert_ignore, make_engine, translated
from slurm_burst.adapters.ledger.models import (
    OVERHEAD_KINDS,
    AllocationRow,
    BudgetRow,
    ChargeRollup,
    ChargeRow,
    GpuUsageRow,
    IngestRun,
    InstanceEventKind,
    InstanceEventRow,
    InstanceRow,
    JobRow,
)
from slurm_burst.core.allocation import OVERHEAD, Allocation, Charge
from slurm_burst.core.gpu import GpuUsage
from slurm_burst.core.pricing import cost_micros, dollars, epoch_ms, to_micros
from slurm_burst.core.usage import (
    ClosedInstance,
    InstanceEvent,
    JobUsage,
    LedgerConflict,
    StorageCharge,
    Transfer,
)

log = logging.getLogger(__name__)

CHARGE_COLUMNS = (
    "allocation_id", "instance_id", "day", "kind", "account", "user", "partition", "job_key",
    "amount_micros", "node_ms", "gpu_ms",
)  # fmt: skip


class SqlLedger:
    def __init__(
        self,
        url: str,
        cluster: str,
        region_of: dict[str, str] | None = None,
        *,
        engine: Engine | None = None,
        check_schema: bool = True,
    ) -> None:
        self.engine = engine or make_engine(url)
        self.cluster = cluster
        self.region_of = region_of or {}
        if check_schema:
            migrate.require_current(self.engine)

    def upgrade(self, target: str = "head") -> tuple[str | None, str | None]:
        """Create or upgrade the schema (under the migration lock); (before, after)."""
        return migrate.upgrade(self.engine, target)

    def revision(self) -> tuple[str | None, str]:
        """(the database's schema revision, the one this code needs)."""
        return migrate.current(self.engine), migrate.head()

    def report(self, by: Sequence[str], start: date, end: date) -> list[dict[str, Any]]:
        """Chargeback rows by ``by`` keys for days in [start, end) (see ``reports``)."""
        return reports.report(self.engine, by, start, end)

    def charge_lines(self, start: date, end: date) -> Iterator[tuple[Any, ...]]:
        """Every charge line on days in [start, end), streamed by day
        (``usage.EXPORT_COLUMNS``): instances' charges, then the day's transfers and storage."""
        return heapq.merge(
            reports.charge_lines(self.engine, start, end),
            transfers.export_lines(self.engine, start, end),
            storage.export_lines(self.engine, start, end),
            key=lambda line: str(line[0]),
        )

    # -- transfers --------------------------------------------------------------
    def transfer(self, t: Transfer) -> None:
        """Record a dataset moved (once: a replay of the same key adds nothing)."""
        transfers.record(self.engine, self.cluster, t)
        log.info("ledger.transfer.%s job=%s account=%s bytes_sent=%d cost_micros=%d",
                 t.direction, t.job_id, t.account, t.bytes_sent, t.cost_micros)  # fmt: skip

    def transfers(
        self, start: date, end: date, account: str = "", job: int = 0
    ) -> list[dict[str, Any]]:
        """Transfers that ended on days in [start, end), newest first."""
        return transfers.listing(self.engine, start, end, account, job)

    # -- storage ----------------------------------------------------------------
    def storage(self, s: StorageCharge) -> None:
        """Book a namespace's storage for a period (once per store, namespace and start)."""
        storage.record(self.engine, self.cluster, s)
        log.info("ledger.storage store=%s namespace=%s gb_months=%.6f cost_micros=%d",
                 s.store, s.namespace, s.gb_months, s.cost_micros)  # fmt: skip

    def storage_booked(self, store: str) -> dict[str, float]:
        """``{namespace: unix time}`` each of ``store``'s namespaces was booked to."""
        return storage.booked_until(self.engine, self.cluster, store)

    def storage_rows(self, start: date, end: date, account: str = "") -> list[dict[str, Any]]:
        """Storage booked on days in [start, end), newest first."""
        return storage.listing(self.engine, start, end, account)

    # -- instances --------------------------------------------------------------
    def instance_event(self, ev: InstanceEvent) -> None:
        """Record ``ev`` once; a replay of the same event of the same instance adds nothing.

        The instance's row (node, size, price...) is written by its first event.
        """
        self.instance_events([ev])

    def instance_events(self, evs: Sequence[InstanceEvent]) -> None:
        """Record each of ``evs`` once, in one transaction (a launch of 500 is one write,
        not 500): all of them, or none if the database fails."""
        if not evs:
            return
        kinds = [InstanceEventKind(ev.event) for ev in evs]
        what = f"ledger instance {evs[0].event}" + (f" (+{len(evs) - 1})" if len(evs) > 1 else "")
        with translated(what), self.engine.begin() as conn:
            conn.execute(
                insert_ignore(self.engine, InstanceRow.__table__),  # type: ignore[arg-type]
                [
                    {
                        "instance_id": ev.instance_id,
                        "cluster": self.cluster,
                        "node": ev.node,
                        "node_group": ev.group,
                        "provider": ev.provider,
                        "region": self.region_of.get(ev.provider, ""),
                        "size": ev.size,
                        "price_per_hour": ev.price_per_hour,
                        "recorded_at": datetime.now(UTC),
                        "partition": ev.partition,
                        "cpus": ev.cpus,
                        "gpus": ev.gpus,
                        "price_source": ev.price_source,
                        "price_version": ev.price_version,
                    }
                    for ev in evs
                ],
            )
            conn.execute(
                insert_ignore(self.engine, InstanceEventRow.__table__),  # type: ignore[arg-type]
                [
                    {
                        "instance_id": ev.instance_id,
                        "event": kind.value,
                        "at": datetime.fromtimestamp(ev.at, UTC),
                        "detail": ev.detail[:512],
                    }
                    for ev, kind in zip(evs, kinds, strict=True)
                ],
            )
        for ev in evs:
            log.info("ledger.instance.%s node=%s instance=%s", ev.event, ev.node, ev.instance_id)

    def gpu_usage(self, rows: Sequence[GpuUsage]) -> int:
        """Record GPU usage periods; one already recorded (same job, node and start) is
        not added again. Returns how many were new."""
        if not rows:
            return 0
        values = [
            {
                "job_key": r.job_key,
                "job_id": r.job_id,
                "node": r.node,
                "period_start": datetime.fromtimestamp(r.start, UTC),
                "period_end": datetime.fromtimestamp(r.end, UTC),
                "gpus": r.gpus,
                "samples": r.samples,
                "gpu_seconds": r.gpu_seconds,
                "busy_gpu_seconds": min(r.busy_gpu_seconds, r.gpu_seconds),
                "memory_used_max_bytes": r.memory_used_max_bytes,
            }
            for r in rows
        ]
        # rowcount of a multi-row INSERT ... ON CONFLICT is not reliable across drivers
        # (psycopg's executemany reports 0), so the new rows are counted before and after
        keys = sorted({r.job_key for r in rows})
        counted = select(func.count()).select_from(GpuUsageRow).where(GpuUsageRow.job_key.in_(keys))
        with translated("ledger gpu usage"), self.engine.begin() as conn:
            before = int(conn.scalar(counted) or 0)
            conn.execute(
                insert_ignore(self.engine, GpuUsageRow.__table__),  # type: ignore[arg-type]
                values,
            )
            added = int(conn.scalar(counted) or 0) - before
        log.info("ledger.gpu_usage rows=%d new=%d", len(rows), added)
        return added

    def instances(self) -> list[dict[str, Any]]:
        """One dict per instance with its event times and derived hours and cost."""
        with translated("ledger instances"), Session(self.engine) as s:
            rows = list(s.scalars(select(InstanceRow).order_by(InstanceRow.id)))
            events = list(s.scalars(select(InstanceEventRow)))
        by_inst: dict[str, dict[str, InstanceEventRow]] = {}
        for e in events:
            by_inst.setdefault(e.instance_id, {})[e.event.value] = e
        out = []
        for r in rows:
            ev = by_inst.get(r.instance_id, {})
            start = ev.get("requested") or ev.get("running")
            end = ev.get("terminated")
            ms = epoch_ms(end.at) - epoch_ms(start.at) if start and end else None
            micros = None if ms is None else cost_micros(to_micros(r.price_per_hour), ms)
            out.append(
                {
                    "node": r.node,
                    "instance_id": r.instance_id,
                    "provider": r.provider,
                    "region": r.region,
                    "partition": r.partition,
                    "size": r.size,
                    "price_per_hour": float(r.price_per_hour),
                    "price_source": r.price_source,
                    "price_version": r.price_version,
                    **{
                        k: (ev[k].at.isoformat() if k in ev else None)
                        for k in ("requested", "running", "joined", "terminated", "failed")
                    },
                    # a failure's detail is "Code: what happened" (or the code alone)
                    "failure_code": ev["failed"].detail.split(": ", 1)[0]
                    if "failed" in ev
                    else None,
                    "failure": ev["failed"].detail if "failed" in ev else None,
                    "hours": None if ms is None else round(ms / 3_600_000, 6),
                    "cost": None if micros is None else float(dollars(micros)),
                    "cost_micros": micros,
                }
            )
        return out

    def open_instances(self) -> dict[str, str]:
        """Instances of this cluster with no ``terminated`` event: instance id -> node."""
        ev = InstanceEventRow
        ended = select(ev.instance_id).where(ev.event == InstanceEventKind.TERMINATED)
        q = select(InstanceRow.instance_id, InstanceRow.node).where(
            InstanceRow.cluster == self.cluster, ~InstanceRow.instance_id.in_(ended)
        )
        with translated("ledger open instances"), self.engine.connect() as conn:
            return {r.instance_id: r.node for r in conn.execute(q)}

    def closed_unallocated(self, before: datetime) -> list[ClosedInstance]:
        """Terminated instances (terminated before ``before``) not yet allocated."""
        ev = InstanceEventRow
        term = (
            select(ev.instance_id, ev.at.label("end"))
            .where(ev.event == InstanceEventKind.TERMINATED, ev.at <= before)
            .subquery()
        )
        start = (
            select(ev.instance_id, func.min(ev.at).label("start"))
            .where(ev.event.in_([InstanceEventKind.REQUESTED, InstanceEventKind.RUNNING]))
            .group_by(ev.instance_id)
            .subquery()
        )
        q = (
            select(InstanceRow, term.c.end, start.c.start)
            .join(term, term.c.instance_id == InstanceRow.instance_id)
            .join(start, start.c.instance_id == InstanceRow.instance_id, isouter=True)
            .where(~InstanceRow.instance_id.in_(select(AllocationRow.instance_id)))
            .order_by(term.c.end)
        )
        with translated("ledger closed instances"), Session(self.engine) as s:
            rows = s.execute(q).all()
        return [
            ClosedInstance(
                r.instance_id,
                r.node,
                r.partition,
                r.size,
                to_micros(r.price_per_hour),
                r.cpus,
                r.gpus,
                _utc(st) if st is not None else _utc(end),
                _utc(end),
            )
            for r, end, st in rows
        ]

    # -- jobs -------------------------------------------------------------------
    def record_jobs(self, jobs: Sequence[JobUsage], window: tuple[datetime, datetime]) -> int:
        """Insert finished jobs (skipping known keys) and the ingest run; return rows added."""
        now = datetime.now(UTC)
        rows = [
            {
                "job_key": j.key,
                "cluster": j.cluster,
                "job_id": j.job_id,
                "account": j.account,
                "user": j.user,
                "partition": j.partition,
                "nodes": j.nodes,
                "node_count": j.node_count,
                "cpus": j.cpus,
                "gpus": j.gpus,
                "mem_mb": j.mem_mb,
                "submit_at": j.submit,
                "start_at": j.start,
                "end_at": j.end,
                "state": j.state,
                "recorded_at": now,
            }
            for j in jobs
        ]
        added = 0
        with translated("ledger jobs"), self.engine.begin() as conn:
            for i in range(0, len(rows), 5000):  # IN lists stay short on every database
                chunk = rows[i : i + 5000]
                keys = [r["job_key"] for r in chunk]
                known = set(conn.scalars(select(JobRow.job_key).where(JobRow.job_key.in_(keys))))
                fresh = [r for r in chunk if r["job_key"] not in known]
                if fresh:
                    conn.execute(insert_ignore(self.engine, JobRow.__table__), fresh)  # type: ignore[arg-type]
                added += len(fresh)
            conn.execute(
                IngestRun.__table__.insert(),  # type: ignore[attr-defined]
                [
                    {
                        "source": "sacct",
                        "window_start": window[0],
                        "window_end": window[1],
                        "rows_seen": len(rows),
                        "rows_added": added,
                        "at": now,
                    }
                ],
            )
        return added

    def ingest_cursor(self) -> datetime | None:
        with translated("ledger ingest cursor"), self.engine.connect() as conn:
            v = conn.scalar(select(func.max(IngestRun.window_end)))
        return None if v is None else _utc(v)

    def jobs_between(self, start: datetime, end: datetime) -> list[JobUsage]:
        """Jobs that ran at some time in [start, end)."""
        q = select(JobRow).where(JobRow.start_at < end, JobRow.end_at > start)
        with translated("ledger jobs"), Session(self.engine) as s:
            rows = list(s.scalars(q))
        return [
            JobUsage(
                r.cluster,
                r.job_id,
                r.account,
                r.user,
                r.partition,
                r.nodes,
                r.node_count,
                r.cpus,
                r.gpus,
                r.mem_mb,
                _utc(r.submit_at),
                _utc(r.start_at),
                _utc(r.end_at),
                r.state,
            )
            for r in rows
        ]

    # -- allocation -------------------------------------------------------------
    def write_allocations(self, allocations: Sequence[Allocation]) -> int:
        """Store splits, their lines and their rollups in one transaction; return how many.

        An instance already split (by another daemon, or before a crash) makes the
        batch fail on its unique key; the batch is then retried one instance at a
        time so that the others still land. Nothing is written twice.
        """
        if not allocations:
            return 0
        try:
            self._write_batch(allocations)
            return len(allocations)
        except LedgerConflict:
            done = 0
            for a in allocations:
                try:
                    self._write_batch([a])
                    done += 1
                except LedgerConflict:
                    log.info("ledger.allocation.exists instance=%s", a.instance_id)
            return done

    def _write_batch(self, allocations: Sequence[Allocation]) -> None:
        batch = str(uuid.uuid4())
        now = datetime.now(UTC)
        with translated("ledger allocation"), self.engine.begin() as conn:
            ids = {}
            for a in allocations:
                res = conn.execute(
                    AllocationRow.__table__.insert(),  # type: ignore[attr-defined]
                    {
                        "instance_id": a.instance_id,
                        "batch": batch,
                        "total_micros": a.total_micros,
                        "rule": a.rule,
                        "at": now,
                    },
                )
                pk = res.inserted_primary_key
                ids[a.instance_id] = pk[0] if pk else None
            lines = [c for a in allocations for c in a.charges]
            self._insert_charges(conn, lines, batch, ids)

    def _insert_charges(
        self, conn: Any, lines: Sequence[Charge], batch: str, ids: dict[str, int | None]
    ) -> None:
        rows = [
            (
                ids.get(c.instance_id),
                c.instance_id,
                date.fromisoformat(c.day),
                c.kind,
                c.account,
                c.user,
                c.partition,
                c.job_key,
                c.amount_micros,
                c.node_ms,
                c.gpu_ms,
            )
            for c in lines
        ]
        bulk_insert(conn, ChargeRow.__table__, CHARGE_COLUMNS, rows)  # type: ignore[arg-type]
        conn.execute(ChargeRollup.__table__.insert(), rollup(lines, batch))  # type: ignore[attr-defined]

    def add_charges(self, lines: Sequence[Charge]) -> None:
        """Charge lines without an allocation (adjustments; the benchmark's synthetic lines)."""
        with translated("ledger charges"), self.engine.begin() as conn:
            self._insert_charges(conn, lines, str(uuid.uuid4()), {})

    # -- budgets ----------------------------------------------------------------
    def set_budget(self, account: str, amount_micros: int, period: str = "month") -> None:
        with translated("ledger budget"), self.engine.begin() as conn:
            conn.execute(
                BudgetRow.__table__.insert(),  # type: ignore[attr-defined]
                {
                    "account": account,
                    "amount_micros": amount_micros,
                    "period": period,
                    "set_at": datetime.now(UTC),
                    "set_by": _login(),
                },
            )

    def budgets(self) -> dict[str, tuple[int, str, datetime]]:
        """``{account: (amount_micros, period, set_at)}``: the latest setting per account."""
        latest = (
            select(BudgetRow.account, func.max(BudgetRow.id).label("id"))
            .group_by(BudgetRow.account)
            .subquery()
        )
        q = select(BudgetRow).join(latest, latest.c.id == BudgetRow.id)
        with translated("ledger budgets"), Session(self.engine) as s:
            return {b.account: (b.amount_micros, b.period, _utc(b.set_at)) for b in s.scalars(q)}

    def spend_since(self, after: int) -> tuple[int, dict[tuple[str, str], int]]:
        """The rollups written after row ``after``, summed per (account, partition) in
        micro-dollars, and the last row's id: a running all-time total, read a pass's
        rows at a time (rollups are append-only)."""
        r = ChargeRollup
        q = (
            select(r.account, r.partition, func.sum(r.usage_micros + r.overhead_micros),
                   func.max(r.id))
            .where(r.id > after)
            .group_by(r.account, r.partition)
        )  # fmt: skip
        last = after
        out: dict[tuple[str, str], int] = {}
        with translated("ledger spend"), self.engine.connect() as conn:
            for account, partition, micros, top in conn.execute(q):
                out[(account, partition)] = int(micros or 0)
                last = max(last, int(top))
        return last, out

    def spent(self, start: date, end: date) -> dict[str, int]:
        """``{account: micro-dollars}`` charged on days in [start, end): instances'
        charges, data transfers and storage (what budgets and the spend cap count)."""
        r = ChargeRollup
        q = (
            select(r.account, func.sum(r.usage_micros + r.overhead_micros))
            .where(r.day >= start, r.day < end)
            .group_by(r.account)
        )
        with translated("ledger spend"), self.engine.connect() as conn:
            out = {a: int(v or 0) for a, v in conn.execute(q)}
        for (account,), (micros, _) in reports.staging_costs(self.engine, ("account",), start,
                                                             end).items():  # fmt: skip
            out[account] = out.get(account, 0) + micros
        return out


def rollup(lines: Iterable[Charge], batch: str) -> list[dict[str, Any]]:
    """Charge lines summed per (day, account, user, partition): the rows reports read."""
    acc: dict[tuple[str, str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    for c in lines:
        a = acc[(c.day, c.account, c.user, c.partition)]
        if c.kind in OVERHEAD_KINDS:
            a[1] += c.amount_micros
            if c.kind == OVERHEAD:
                a[3] += c.node_ms
        else:
            a[0] += c.amount_micros
        a[2] += c.node_ms
        a[4] += c.gpu_ms
        a[5] += 1
    return [
        {
            "batch": batch,
            "day": date.fromisoformat(day),
            "account": account,
            "user": user,
            "partition": partition,
            "usage_micros": v[0],
            "overhead_micros": v[1],
            "node_ms": v[2],
            "idle_node_ms": v[3],
            "gpu_ms": v[4],
            "lines": v[5],
        }
        for (day, account, user, partition), v in acc.items()
    ]


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _login() -> str:
    try:
        return getpass.getuser()[:64]
    except (OSError, KeyError):  # no login name, no passwd entry (3.13: OSError)
        return "unknown"
