"""Storage: each store namespace's GB-months, booked by ``stage gc`` (a push no longer
pays a first month: storage is charged for the time it is held).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from slurm_burst.adapters.ledger.models import UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_COST = "transfers.cost_micros"
_WAS = "Bytes sent at per_gb, plus the first month of bytes newly stored."
_NOW = "Bytes sent at per_gb (storage is booked in storage, by stage gc)."


def upgrade() -> None:
    op.create_table(
        "storage",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True, comment="Surrogate key."),
        sa.Column(
            "storage_key",
            sa.String(200),
            nullable=False,
            unique=True,
            comment="The store, namespace and period's start; idempotency.",
        ),
        sa.Column("cluster", sa.String(64), nullable=False, comment="Slurm ClusterName."),
        sa.Column("store", sa.String(64), nullable=False, comment="slurm-burst store name."),
        sa.Column("provider", sa.String(64), nullable=False, comment="Provider profile."),
        sa.Column(
            "account",
            sa.String(64),
            nullable=False,
            index=True,
            comment="Slurm account ('' for a namespace of none).",
        ),
        sa.Column("namespace", sa.String(80), nullable=False, comment="The store namespace."),
        sa.Column(
            "period_start",
            UTCDateTime(),
            nullable=True,
            comment="Start (UTC); NULL: each key from its write.",
        ),
        sa.Column(
            "at",
            UTCDateTime(),
            nullable=False,
            index=True,
            comment="End of the period: the gc run (UTC).",
        ),
        sa.Column(
            "key_count",
            sa.Integer,
            nullable=False,
            comment="Keys held at the end, before the run removed any.",
        ),
        sa.Column("stored_bytes", sa.BigInteger, nullable=False, comment="Their bytes."),
        sa.Column(
            "gb_months",
            sa.Numeric(20, 6),
            nullable=False,
            comment="GB (2^30 bytes) stored x months (730 hours) in the period.",
        ),
        sa.Column(
            "per_gb_month",
            sa.Numeric(12, 6),
            nullable=False,
            comment="Dollars per GB-month, at the time.",
        ),
        sa.Column(
            "cost_micros", sa.BigInteger, nullable=False, comment="gb_months at per_gb_month."
        ),
        sa.CheckConstraint(
            "key_count >= 0 AND stored_bytes >= 0 AND gb_months >= 0", name="ck_storage_counts"
        ),
        sa.CheckConstraint("cost_micros >= 0", name="ck_storage_cost"),
        comment="A store namespace's GB-months, as each stage gc booked them (append-only).",
    )
    _comment(_NOW, _WAS)


def downgrade() -> None:
    _comment(_WAS, _NOW)
    op.drop_table("storage")


def _comment(now: str, was: str) -> None:
    if op.get_bind().dialect.name == "sqlite":  # SQLite keeps no column comments
        return
    table, column = _COST.split(".")
    op.alter_column(
        table, column, existing_type=sa.BigInteger, existing_nullable=False, comment=now,
        existing_comment=was,
    )  # fmt: skip
