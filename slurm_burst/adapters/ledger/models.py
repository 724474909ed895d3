"""Ledger tables (SQLAlchemy 2.0). Append-only: a correction is a new row, never an update.

``instances`` holds what is fixed at launch (node, provider, size, price);
``instance_events`` one row per life event of an instance (requested, running,
joined, terminated, failed), unique per (instance, event) so that replaying an
event adds nothing. Durations and costs are derived from the events.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Annotated

from sqlalchemy import (
    CheckConstraint,
    DateTime,
    Enum,
    ForeignKey,
    Integer,
    Numeric,
    String,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class UTCDateTime(TypeDecorator[datetime]):
    """Timestamps stored in UTC and read back timezone-aware (SQLite keeps no zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the ledger; use UTC-aware times")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


intpk = Annotated[int, mapped_column(Integer, primary_key=True, autoincrement=True)]
utc = Annotated[datetime, mapped_column(UTCDateTime())]


class Base(DeclarativeBase):
    pass


class InstanceEventKind(enum.StrEnum):
    REQUESTED = "requested"
    RUNNING = "running"
    JOINED = "joined"
    TERMINATED = "terminated"
    FAILED = "failed"


class InstanceRow(Base):
    __tablename__ = "instances"
    __table_args__ = (
        CheckConstraint("price_per_hour >= 0", name="ck_instances_price_nonnegative"),
        {"comment": "One row per cloud instance slurm-burst launched (append-only)."},
    )

    id: Mapped[intpk] = mapped_column(comment="Surrogate key.")
    instance_id: Mapped[str] = mapped_column(
        String(128), unique=True, comment="Provider's instance id."
    )
    cluster: Mapped[str] = mapped_column(String(64), comment="Slurm ClusterName.")
    node: Mapped[str] = mapped_column(String(128), index=True, comment="Slurm node name.")
    node_group: Mapped[str] = mapped_column(String(64), comment="slurm-burst node group.")
    provider: Mapped[str] = mapped_column(String(64), comment="Provider profile name.")
    region: Mapped[str] = mapped_column(String(64), comment="Provider region or zone.")
    size: Mapped[str] = mapped_column(String(64), comment="Instance size (type).")
    price_per_hour: Mapped[float] = mapped_column(
        Numeric(12, 6), comment="Price per instance-hour when launched (config)."
    )
    recorded_at: Mapped[utc] = mapped_column(comment="When this row was written (UTC).")


class InstanceEventRow(Base):
    __tablename__ = "instance_events"
    __table_args__ = (
        UniqueConstraint("instance_id", "event", name="uq_instance_events_once"),
        {"comment": "Life events of instances (append-only, one per kind)."},
    )

    id: Mapped[intpk] = mapped_column(comment="Surrogate key.")
    instance_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("instances.instance_id"), index=True, comment="The instance."
    )
    event: Mapped[InstanceEventKind] = mapped_column(
        Enum(
            InstanceEventKind,
            values_callable=lambda e: [m.value for m in e],
            name="instance_event_kind",
            native_enum=False,
            length=16,
        ),
        comment="requested, running, joined, terminated or failed.",
    )
    at: Mapped[utc] = mapped_column(comment="When it happened (UTC).")
    detail: Mapped[str] = mapped_column(
        String(512), default="", comment="Error code or note (never a secret)."
    )
