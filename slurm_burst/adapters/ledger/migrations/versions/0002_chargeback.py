"""Chargeback: job usage, cost allocation, rollups, budgets; rate provenance on instances.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from slurm_burst.adapters.ledger.models import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

KINDS = ("usage", "overhead", "rate_adjustment", "adjustment")


def _pk() -> sa.Column[int]:
    return sa.Column(
        "id", sa.Integer, primary_key=True, autoincrement=True, comment="Surrogate key."
    )


def _big(name: str, comment: str) -> sa.Column[int]:
    return sa.Column(name, sa.BigInteger, nullable=False, comment=comment)


def upgrade() -> None:
    with op.batch_alter_table("instances") as t:
        t.add_column(
            sa.Column(
                "partition",
                sa.String(64),
                nullable=False,
                server_default="",
                comment="Burst partition of the node.",
            )
        )
        t.add_column(
            sa.Column(
                "cpus",
                sa.Integer,
                nullable=False,
                server_default="0",
                comment="CPUs Slurm schedules on it.",
            )
        )
        t.add_column(
            sa.Column(
                "gpus", sa.Integer, nullable=False, server_default="0", comment="GPUs of the node."
            )
        )
        t.add_column(
            sa.Column(
                "price_source",
                sa.String(128),
                nullable=False,
                server_default="",
                comment="Name of the rate the price came from.",
            )
        )
        t.add_column(
            sa.Column(
                "price_version",
                sa.String(32),
                nullable=False,
                server_default="",
                comment="valid_from of that rate (its version).",
            )
        )
    op.create_table(
        "ingest_runs",
        _pk(),
        sa.Column(
            "source", sa.String(32), nullable=False, comment="Where the rows came from (sacct)."
        ),
        sa.Column(
            "window_start", UTCDateTime(), nullable=False, comment="Start of the window read (UTC)."
        ),
        sa.Column(
            "window_end",
            UTCDateTime(),
            nullable=False,
            comment="End of the window read (UTC); the cursor.",
        ),
        sa.Column("rows_seen", sa.Integer, nullable=False, comment="Finished jobs in the window."),
        sa.Column(
            "rows_added", sa.Integer, nullable=False, comment="Of those, jobs new to the ledger."
        ),
        sa.Column("at", UTCDateTime(), nullable=False, comment="When the run was recorded (UTC)."),
        sa.CheckConstraint("window_end >= window_start", name="ck_ingest_runs_window"),
        comment="One row per Slurm accounting window read (append-only).",
    )
    op.create_table(
        "jobs",
        _pk(),
        sa.Column(
            "job_key",
            sa.String(96),
            nullable=False,
            unique=True,
            comment="cluster:jobid:start-epoch; the idempotency key.",
        ),
        sa.Column("cluster", sa.String(64), nullable=False, comment="Slurm ClusterName."),
        sa.Column("job_id", sa.BigInteger, nullable=False, comment="Slurm job id."),
        sa.Column("account", sa.String(64), nullable=False, index=True, comment="Slurm account."),
        sa.Column("user", sa.String(64), nullable=False, comment="User name."),
        sa.Column("partition", sa.String(64), nullable=False, comment="Partition the job ran in."),
        sa.Column("nodes", sa.Text, nullable=False, comment="Node list (hostlist expression)."),
        sa.Column("node_count", sa.Integer, nullable=False, comment="Nodes allocated."),
        sa.Column("cpus", sa.Integer, nullable=False, comment="CPUs allocated (all nodes)."),
        sa.Column("gpus", sa.Integer, nullable=False, comment="GPUs allocated (all nodes)."),
        _big("mem_mb", "Memory allocated, MB (all nodes)."),
        sa.Column("submit_at", UTCDateTime(), nullable=False, comment="Submit time (UTC)."),
        sa.Column(
            "start_at", UTCDateTime(), nullable=False, index=True, comment="Start time (UTC)."
        ),
        sa.Column("end_at", UTCDateTime(), nullable=False, index=True, comment="End time (UTC)."),
        sa.Column(
            "state", sa.String(32), nullable=False, comment="Final state (COMPLETED, FAILED...)."
        ),
        sa.Column(
            "recorded_at", UTCDateTime(), nullable=False, comment="When this row was written (UTC)."
        ),
        sa.CheckConstraint("end_at >= start_at", name="ck_jobs_times"),
        sa.CheckConstraint("cpus >= 0 AND gpus >= 0 AND node_count >= 0", name="ck_jobs_tres"),
        comment="Finished jobs that ran on burst nodes, from Slurm accounting (append-only).",
    )
    op.create_table(
        "allocations",
        _pk(),
        sa.Column(
            "instance_id",
            sa.String(128),
            sa.ForeignKey("instances.instance_id"),
            nullable=False,
            unique=True,
            comment="The instance; unique, so an instance is split exactly once.",
        ),
        sa.Column(
            "batch", sa.String(36), nullable=False, index=True, comment="Allocation pass id."
        ),
        _big("total_micros", "Provider cost, micro-dollars."),
        sa.Column(
            "rule", sa.String(16), nullable=False, comment="Overhead rule used (usage, site)."
        ),
        sa.Column("at", UTCDateTime(), nullable=False, comment="When it was split (UTC)."),
        comment="One row per instance whose cost has been split (append-only).",
    )
    op.create_table(
        "charges",
        _pk(),
        sa.Column(
            "allocation_id",
            sa.Integer,
            sa.ForeignKey("allocations.id"),
            nullable=True,
            index=True,
            comment="The split it belongs to.",
        ),
        sa.Column("instance_id", sa.String(128), nullable=False, comment="The instance charged."),
        sa.Column("day", sa.Date, nullable=False, index=True, comment="UTC day the cost fell on."),
        sa.Column(
            "kind",
            sa.Enum(
                *KINDS, name="charge_kind", native_enum=False, create_constraint=True, length=16
            ),
            nullable=False,
            comment="usage, overhead, rate_adjustment or adjustment.",
        ),
        sa.Column("account", sa.String(64), nullable=False, comment="Account charged."),
        sa.Column("user", sa.String(64), nullable=False, comment="User charged ('' for none)."),
        sa.Column("partition", sa.String(64), nullable=False, comment="Partition of the instance."),
        sa.Column("job_key", sa.String(96), nullable=False, comment="Job charged ('' for none)."),
        _big("amount_micros", "Amount, micro-dollars."),
        _big("node_ms", "Node time this line stands for, ms."),
        _big("gpu_ms", "GPU time this line stands for, ms."),
        sa.UniqueConstraint(
            "instance_id", "day", "kind", "job_key", "account", name="uq_charges_once"
        ),
        sa.CheckConstraint("node_ms >= 0 AND gpu_ms >= 0", name="ck_charges_times"),
        comment="Lines of the cost allocation (append-only; corrections are new lines).",
    )
    op.create_table(
        "charge_rollups",
        _pk(),
        sa.Column("batch", sa.String(36), nullable=False, comment="Allocation pass id."),
        sa.Column("day", sa.Date, nullable=False, index=True, comment="UTC day."),
        sa.Column("account", sa.String(64), nullable=False, comment="Account."),
        sa.Column("user", sa.String(64), nullable=False, comment="User ('' for none)."),
        sa.Column("partition", sa.String(64), nullable=False, comment="Partition."),
        _big("usage_micros", "Usage amount, micro-dollars."),
        _big("overhead_micros", "Overhead and adjustments, micro-dollars."),
        _big("node_ms", "Node time, ms."),
        _big("idle_node_ms", "Of which overhead (idle) node time."),
        _big("gpu_ms", "GPU time, ms."),
        sa.Column("lines", sa.Integer, nullable=False, comment="Charge lines summed."),
        comment="Charges summed per pass, day, account, user and partition (append-only).",
    )
    op.create_table(
        "budgets",
        _pk(),
        sa.Column("account", sa.String(64), nullable=False, index=True, comment="Slurm account."),
        _big("amount_micros", "Budget per period, micro-dollars."),
        sa.Column("period", sa.String(16), nullable=False, comment="Budget period (month)."),
        sa.Column("set_at", UTCDateTime(), nullable=False, comment="When it was set (UTC)."),
        sa.Column("set_by", sa.String(64), nullable=False, comment="Who set it (login name)."),
        sa.CheckConstraint("amount_micros >= 0", name="ck_budgets_nonnegative"),
        comment="Budget settings; the latest row per account is in force (append-only).",
    )


def downgrade() -> None:
    for table in ("budgets", "charge_rollups", "charges", "allocations", "jobs", "ingest_runs"):
        op.drop_table(table)
    with op.batch_alter_table("instances") as t:
        for col in ("price_version", "price_source", "gpus", "cpus", "partition"):
            t.drop_column(col)
