"""Ledger tables (SQLAlchemy 2.0). Append-only: a correction is a new row, never an update.

- ``instances``: what is fixed at launch (node, partition, provider, size, the price
  and the rate it came from); ``instance_events``: one row per life event
  (requested, running, joined, terminated, failed), unique per (instance, event)
  so that replaying an event adds nothing.
- ``jobs``: job usage on burst nodes from Slurm accounting, unique per job key;
  ``ingest_runs``: one row per sacct window read (the cursor is the latest end).
- ``allocations``: one row per instance whose cost was split (unique: split once);
  ``charges``: its lines (usage, overhead, rate_adjustment, adjustment), in integer
  micro-dollars; ``charge_rollups``: the same lines summed per day, account, user
  and partition for each allocation pass, so month x account reports read
  thousands of rows, not millions.
- ``budgets``: each ``budget set`` is a row; the latest per account is in force.
- ``transfers``: one row per dataset moved (a push to a store, a node's pull, a
  stage-out), unique per transfer key, with the prices that applied and its cost.

The schema is created and changed only by the Alembic migrations in
``migrations/versions``; these models are what the code reads and writes.
"""

from __future__ import annotations

import enum
from datetime import UTC, date, datetime
from typing import Annotated

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Date,
    DateTime,
    Double,
    Enum,
    ForeignKey,
    Integer,
    Numeric,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from slurm_burst.core.usage import TransferDirection


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
bigint = Annotated[int, mapped_column(BigInteger)]
utc = Annotated[datetime, mapped_column(UTCDateTime())]


def by_value(cls: type[enum.Enum], name: str) -> Enum:
    """An enum column stored by value, portable (VARCHAR + CHECK, no native type)."""
    return Enum(
        cls,
        values_callable=lambda e: [m.value for m in e],
        name=name,
        native_enum=False,
        create_constraint=True,
        length=16,
    )


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
    partition: Mapped[str] = mapped_column(
        String(64), server_default="", comment="Burst partition of the node."
    )
    cpus: Mapped[int] = mapped_column(server_default="0", comment="CPUs Slurm schedules on it.")
    gpus: Mapped[int] = mapped_column(server_default="0", comment="GPUs of the node.")
    price_source: Mapped[str] = mapped_column(
        String(128), server_default="", comment="Name of the rate the price came from."
    )
    price_version: Mapped[str] = mapped_column(
        String(32), server_default="", comment="valid_from of that rate (its version)."
    )


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
        by_value(InstanceEventKind, "instance_event_kind"),
        comment="requested, running, joined, terminated or failed.",
    )
    at: Mapped[utc] = mapped_column(comment="When it happened (UTC).")
    detail: Mapped[str] = mapped_column(
        String(512), default="", comment="Error code or note (never a secret)."
    )


class IngestRun(Base):
    __tablename__ = "ingest_runs"
    __table_args__ = (
        CheckConstraint("window_end >= window_start", name="ck_ingest_runs_window"),
        {"comment": "One row per Slurm accounting window read (append-only)."},
    )

    id: Mapped[intpk] = mapped_column(comment="Surrogate key.")
    source: Mapped[str] = mapped_column(String(32), comment="Where the rows came from (sacct).")
    window_start: Mapped[utc] = mapped_column(comment="Start of the window read (UTC).")
    window_end: Mapped[utc] = mapped_column(comment="End of the window read (UTC); the cursor.")
    rows_seen: Mapped[int] = mapped_column(comment="Finished jobs in the window.")
    rows_added: Mapped[int] = mapped_column(comment="Of those, jobs new to the ledger.")
    at: Mapped[utc] = mapped_column(comment="When the run was recorded (UTC).")


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint("end_at >= start_at", name="ck_jobs_times"),
        CheckConstraint("cpus >= 0 AND gpus >= 0 AND node_count >= 0", name="ck_jobs_tres"),
        {"comment": "Finished jobs that ran on burst nodes, from Slurm accounting (append-only)."},
    )

    id: Mapped[intpk] = mapped_column(comment="Surrogate key.")
    job_key: Mapped[str] = mapped_column(
        String(96), unique=True, comment="cluster:jobid:start-epoch; the idempotency key."
    )
    cluster: Mapped[str] = mapped_column(String(64), comment="Slurm ClusterName.")
    job_id: Mapped[int] = mapped_column(BigInteger, comment="Slurm job id.")
    account: Mapped[str] = mapped_column(String(64), index=True, comment="Slurm account.")
    user: Mapped[str] = mapped_column(String(64), comment="User name.")
    partition: Mapped[str] = mapped_column(String(64), comment="Partition the job ran in.")
    nodes: Mapped[str] = mapped_column(Text, comment="Node list (hostlist expression).")
    node_count: Mapped[int] = mapped_column(comment="Nodes allocated.")
    cpus: Mapped[int] = mapped_column(comment="CPUs allocated (all nodes).")
    gpus: Mapped[int] = mapped_column(comment="GPUs allocated (all nodes).")
    mem_mb: Mapped[int] = mapped_column(BigInteger, comment="Memory allocated, MB (all nodes).")
    submit_at: Mapped[utc] = mapped_column(comment="Submit time (UTC).")
    start_at: Mapped[utc] = mapped_column(index=True, comment="Start time (UTC).")
    end_at: Mapped[utc] = mapped_column(index=True, comment="End time (UTC).")
    state: Mapped[str] = mapped_column(String(32), comment="Final state (COMPLETED, FAILED...).")
    recorded_at: Mapped[utc] = mapped_column(comment="When this row was written (UTC).")


class ChargeKind(enum.StrEnum):
    USAGE = "usage"
    OVERHEAD = "overhead"
    RATE_ADJUSTMENT = "rate_adjustment"
    ADJUSTMENT = "adjustment"


OVERHEAD_KINDS = frozenset(
    {ChargeKind.OVERHEAD, ChargeKind.RATE_ADJUSTMENT, ChargeKind.ADJUSTMENT}
)  # what reports show as overhead rather than allocated usage


class AllocationRow(Base):
    __tablename__ = "allocations"
    __table_args__ = {"comment": "One row per instance whose cost has been split (append-only)."}

    id: Mapped[intpk] = mapped_column(comment="Surrogate key.")
    instance_id: Mapped[str] = mapped_column(
        String(128),
        ForeignKey("instances.instance_id"),
        unique=True,
        comment="The instance; unique, so an instance is split exactly once.",
    )
    batch: Mapped[str] = mapped_column(String(36), index=True, comment="Allocation pass id.")
    total_micros: Mapped[bigint] = mapped_column(comment="Provider cost, micro-dollars.")
    rule: Mapped[str] = mapped_column(String(16), comment="Overhead rule used (usage, site).")
    at: Mapped[utc] = mapped_column(comment="When it was split (UTC).")


class ChargeRow(Base):
    __tablename__ = "charges"
    __table_args__ = (
        UniqueConstraint(
            "instance_id", "day", "kind", "job_key", "account", name="uq_charges_once"
        ),
        CheckConstraint("node_ms >= 0 AND gpu_ms >= 0", name="ck_charges_times"),
        {"comment": "Lines of the cost allocation (append-only; corrections are new lines)."},
    )

    id: Mapped[intpk] = mapped_column(comment="Surrogate key.")
    allocation_id: Mapped[int | None] = mapped_column(
        ForeignKey("allocations.id"), index=True, comment="The split it belongs to."
    )
    instance_id: Mapped[str] = mapped_column(String(128), comment="The instance charged.")
    day: Mapped[date] = mapped_column(Date, index=True, comment="UTC day the cost fell on.")
    kind: Mapped[ChargeKind] = mapped_column(
        by_value(ChargeKind, "charge_kind"),
        comment="usage, overhead, rate_adjustment or adjustment.",
    )
    account: Mapped[str] = mapped_column(String(64), comment="Account charged.")
    user: Mapped[str] = mapped_column(String(64), comment="User charged ('' for none).")
    partition: Mapped[str] = mapped_column(String(64), comment="Partition of the instance.")
    job_key: Mapped[str] = mapped_column(String(96), comment="Job charged ('' for none).")
    amount_micros: Mapped[bigint] = mapped_column(comment="Amount, micro-dollars.")
    node_ms: Mapped[bigint] = mapped_column(comment="Node time this line stands for, ms.")
    gpu_ms: Mapped[bigint] = mapped_column(comment="GPU time this line stands for, ms.")


class ChargeRollup(Base):
    __tablename__ = "charge_rollups"
    __table_args__ = {
        "comment": "Charges summed per pass, day, account, user and partition (append-only)."
    }

    id: Mapped[intpk] = mapped_column(comment="Surrogate key.")
    batch: Mapped[str] = mapped_column(String(36), comment="Allocation pass id.")
    day: Mapped[date] = mapped_column(Date, index=True, comment="UTC day.")
    account: Mapped[str] = mapped_column(String(64), comment="Account.")
    user: Mapped[str] = mapped_column(String(64), comment="User ('' for none).")
    partition: Mapped[str] = mapped_column(String(64), comment="Partition.")
    usage_micros: Mapped[bigint] = mapped_column(comment="Usage amount, micro-dollars.")
    overhead_micros: Mapped[bigint] = mapped_column(
        comment="Overhead and adjustments, micro-dollars."
    )
    node_ms: Mapped[bigint] = mapped_column(comment="Node time, ms.")
    idle_node_ms: Mapped[bigint] = mapped_column(comment="Of which overhead (idle) node time.")
    gpu_ms: Mapped[bigint] = mapped_column(comment="GPU time, ms.")
    lines: Mapped[int] = mapped_column(comment="Charge lines summed.")


class BudgetRow(Base):
    __tablename__ = "budgets"
    __table_args__ = (
        CheckConstraint("amount_micros >= 0", name="ck_budgets_nonnegative"),
        {"comment": "Budget settings; the latest row per account is in force (append-only)."},
    )

    id: Mapped[intpk] = mapped_column(comment="Surrogate key.")
    account: Mapped[str] = mapped_column(String(64), index=True, comment="Slurm account.")
    amount_micros: Mapped[bigint] = mapped_column(comment="Budget per period, micro-dollars.")
    period: Mapped[str] = mapped_column(String(16), comment="Budget period (month).")
    set_at: Mapped[utc] = mapped_column(comment="When it was set (UTC).")
    set_by: Mapped[str] = mapped_column(String(64), comment="Who set it (login name).")


class GpuUsageRow(Base):
    __tablename__ = "gpu_usage"
    __table_args__ = (
        UniqueConstraint("job_key", "node", "period_start", name="uq_gpu_usage_once"),
        CheckConstraint(
            "gpu_seconds >= 0 AND busy_gpu_seconds >= 0 AND busy_gpu_seconds <= gpu_seconds",
            name="ck_gpu_usage_seconds",
        ),
        {"comment": "GPU use of a job on a node over a period, from NVML samples (append-only)."},
    )

    id: Mapped[intpk] = mapped_column(comment="Surrogate key.")
    job_key: Mapped[str] = mapped_column(
        String(96), index=True, comment="cluster:jobid:start-epoch, as jobs.job_key."
    )
    job_id: Mapped[int] = mapped_column(BigInteger, comment="Slurm job id.")
    node: Mapped[str] = mapped_column(String(128), comment="Burst node.")
    period_start: Mapped[utc] = mapped_column(comment="Start of the period (UTC).")
    period_end: Mapped[utc] = mapped_column(comment="End of the period (UTC).")
    gpus: Mapped[int] = mapped_column(comment="GPUs the job held on the node.")
    samples: Mapped[int] = mapped_column(comment="Samples in the period.")
    gpu_seconds: Mapped[float] = mapped_column(Double, comment="GPUs held x seconds.")
    busy_gpu_seconds: Mapped[float] = mapped_column(
        Double, comment="Utilization x GPUs x seconds (the part of gpu_seconds the GPUs were busy)."
    )
    memory_used_max_bytes: Mapped[bigint] = mapped_column(
        comment="Most GPU memory the job's GPUs held at a sample, bytes."
    )


class TransferRow(Base):
    __tablename__ = "transfers"
    __table_args__ = (
        CheckConstraint(
            "logical_bytes >= 0 AND bytes_sent >= 0 AND objects >= 0 AND objects_sent >= 0",
            name="ck_transfers_counts",
        ),
        CheckConstraint("cost_micros >= 0 AND seconds >= 0", name="ck_transfers_cost"),
        {"comment": "Datasets moved for jobs: pushes, node pulls, stage-outs (append-only)."},
    )

    id: Mapped[intpk] = mapped_column(comment="Surrogate key.")
    transfer_key: Mapped[str] = mapped_column(
        String(200), unique=True, comment="What the transfer was; the idempotency key."
    )
    cluster: Mapped[str] = mapped_column(String(64), comment="Slurm ClusterName.")
    job_id: Mapped[int] = mapped_column(
        BigInteger, index=True, comment="Slurm job id (0: an admin's pre-stage)."
    )
    account: Mapped[str] = mapped_column(String(64), index=True, comment="Slurm account.")
    user: Mapped[str] = mapped_column(String(64), comment="User whose data it is.")
    direction: Mapped[TransferDirection] = mapped_column(
        by_value(TransferDirection, "transfer_direction"),
        comment="in (site to store), pull (store to node) or out (back to the site).",
    )
    store: Mapped[str] = mapped_column(String(64), comment="slurm-burst store name.")
    provider: Mapped[str] = mapped_column(String(64), comment="Provider profile.")
    node: Mapped[str] = mapped_column(String(128), comment="A pull's node ('' for a push).")
    dataset: Mapped[str] = mapped_column(Text, comment="Source path, or the job's name for it.")
    manifest: Mapped[str] = mapped_column(String(64), comment="Dataset version (manifest id).")
    logical_bytes: Mapped[bigint] = mapped_column(comment="The dataset's size, bytes.")
    bytes_sent: Mapped[bigint] = mapped_column(comment="Bytes on the wire (compressed as sent).")
    objects: Mapped[int] = mapped_column(comment="Distinct objects of the dataset.")
    objects_sent: Mapped[int] = mapped_column(comment="Objects sent by this transfer.")
    seconds: Mapped[float] = mapped_column(Double, comment="Wall time of the transfer.")
    at: Mapped[utc] = mapped_column(index=True, comment="When it ended (UTC).")
    per_gb: Mapped[float] = mapped_column(
        Numeric(12, 6), comment="Dollars per GB sent that applied to this direction."
    )
    storage_per_gb_month: Mapped[float] = mapped_column(
        Numeric(12, 6), comment="Dollars per GB-month stored, at the time."
    )
    cost_micros: Mapped[bigint] = mapped_column(
        comment="Bytes sent at per_gb (storage is booked in storage, by stage gc)."
    )


class StorageRow(Base):
    __tablename__ = "storage"
    __table_args__ = (
        CheckConstraint(
            "key_count >= 0 AND stored_bytes >= 0 AND gb_months >= 0", name="ck_storage_counts"
        ),
        CheckConstraint("cost_micros >= 0", name="ck_storage_cost"),
        {"comment": "A store namespace's GB-months, as each stage gc booked them (append-only)."},
    )

    id: Mapped[intpk] = mapped_column(comment="Surrogate key.")
    storage_key: Mapped[str] = mapped_column(
        String(200), unique=True, comment="The store, namespace and period's start; idempotency."
    )
    cluster: Mapped[str] = mapped_column(String(64), comment="Slurm ClusterName.")
    store: Mapped[str] = mapped_column(String(64), comment="slurm-burst store name.")
    provider: Mapped[str] = mapped_column(String(64), comment="Provider profile.")
    account: Mapped[str] = mapped_column(
        String(64), index=True, comment="Slurm account ('' for a namespace of none)."
    )
    namespace: Mapped[str] = mapped_column(String(80), comment="The store namespace.")
    period_start: Mapped[datetime | None] = mapped_column(
        UTCDateTime(), nullable=True, comment="Start (UTC); NULL: each key from its write."
    )
    at: Mapped[utc] = mapped_column(index=True, comment="End of the period: the gc run (UTC).")
    key_count: Mapped[int] = mapped_column(
        comment="Keys held at the end, before the run removed any."
    )
    stored_bytes: Mapped[bigint] = mapped_column(comment="Their bytes.")
    gb_months: Mapped[float] = mapped_column(
        Numeric(20, 6), comment="GB (2^30 bytes) stored x months (730 hours) in the period."
    )
    per_gb_month: Mapped[float] = mapped_column(
        Numeric(12, 6), comment="Dollars per GB-month, at the time."
    )
    cost_micros: Mapped[bigint] = mapped_column(comment="gb_months at per_gb_month.")
