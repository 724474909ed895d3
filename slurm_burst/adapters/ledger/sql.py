"""The Ledger port over SQLAlchemy (SQLite by default, PostgreSQL in production).

This issue's ledger is the minimal instance record; schema migrations (Alembic),
job usage and chargeback build on these tables.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, create_engine, event, select
from sqlalchemy.orm import Session

from slurm_burst.adapters.ledger.models import (
    Base,
    InstanceEventKind,
    InstanceEventRow,
    InstanceRow,
)

log = logging.getLogger(__name__)


def make_engine(url: str) -> Engine:
    engine = create_engine(url, future=True, pool_pre_ping=True)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=10000")
            cur.close()

    return engine


class SqlLedger:
    def __init__(self, url: str, cluster: str, region_of: dict[str, str] | None = None) -> None:
        if url.startswith("sqlite:///"):
            from pathlib import Path

            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        self.engine = make_engine(url)
        self.cluster = cluster
        self.region_of = region_of or {}
        Base.metadata.create_all(self.engine)

    def instance_event(
        self,
        *,
        node: str,
        instance_id: str,
        provider: str,
        size: str,
        price_per_hour: float,
        event: str,
        at: float,
        detail: str = "",
        group: str = "",
    ) -> None:
        """Record ``event`` of ``instance_id`` once; a replay of the same event adds nothing."""
        when = datetime.fromtimestamp(at, UTC)
        kind = InstanceEventKind(event)
        with Session(self.engine) as s, s.begin():
            if (
                s.scalar(select(InstanceRow.id).where(InstanceRow.instance_id == instance_id))
                is None
            ):
                s.add(
                    InstanceRow(
                        instance_id=instance_id,
                        cluster=self.cluster,
                        node=node,
                        node_group=group,
                        provider=provider,
                        region=self.region_of.get(provider, ""),
                        size=size,
                        price_per_hour=price_per_hour,
                        recorded_at=datetime.now(UTC),
                    )
                )
                s.flush()
            exists = s.scalar(
                select(InstanceEventRow.id).where(
                    InstanceEventRow.instance_id == instance_id, InstanceEventRow.event == kind
                )
            )
            if exists is None:
                s.add(
                    InstanceEventRow(
                        instance_id=instance_id, event=kind, at=when, detail=detail[:512]
                    )
                )
        log.info("ledger.instance.%s node=%s instance=%s", event, node, instance_id)

    def instances(self) -> list[dict[str, Any]]:
        """One dict per instance with its event times and derived hours and cost."""
        with Session(self.engine) as s:
            rows = list(s.scalars(select(InstanceRow).order_by(InstanceRow.id)))
            events = list(s.scalars(select(InstanceEventRow)))
        by_inst: dict[str, dict[str, datetime]] = {}
        for e in events:
            by_inst.setdefault(e.instance_id, {})[e.event.value] = e.at
        out = []
        for r in rows:
            ev = by_inst.get(r.instance_id, {})
            start = ev.get("requested") or ev.get("running")
            end = ev.get("terminated")
            hours = (end - start).total_seconds() / 3600 if start and end else None
            out.append(
                {
                    "node": r.node,
                    "instance_id": r.instance_id,
                    "provider": r.provider,
                    "region": r.region,
                    "size": r.size,
                    "price_per_hour": float(r.price_per_hour),
                    **{
                        k: (ev[k].isoformat() if k in ev else None)
                        for k in ("requested", "running", "joined", "terminated", "failed")
                    },
                    "hours": None if hours is None else round(hours, 6),
                    "cost": None if hours is None else round(hours * float(r.price_per_hour), 6),
                }
            )
        return out
