"""Transfers: datasets moved for jobs (pushes, node pulls, stage-outs), with their cost.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from slurm_burst.adapters.ledger.models import UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "transfers",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True, comment="Surrogate key."),
        sa.Column(
            "transfer_key",
            sa.String(200),
            nullable=False,
            unique=True,
            comment="What the transfer was; the idempotency key.",
        ),
        sa.Column("cluster", sa.String(64), nullable=False, comment="Slurm ClusterName."),
        sa.Column(
            "job_id",
            sa.BigInteger,
            nullable=False,
            index=True,
            comment="Slurm job id (0: an admin's pre-stage).",
        ),
        sa.Column("account", sa.String(64), nullable=False, index=True, comment="Slurm account."),
        sa.Column("user", sa.String(64), nullable=False, comment="User whose data it is."),
        sa.Column(
            "direction",
            sa.Enum(
                "in",
                "pull",
                "out",
                name="transfer_direction",
                native_enum=False,
                create_constraint=True,
                length=16,
            ),
            nullable=False,
            comment="in (site to store), pull (store to node) or out (back to the site).",
        ),
        sa.Column("store", sa.String(64), nullable=False, comment="slurm-burst store name."),
        sa.Column("provider", sa.String(64), nullable=False, comment="Provider profile."),
        sa.Column("node", sa.String(128), nullable=False, comment="A pull's node ('' for a push)."),
        sa.Column(
            "dataset", sa.Text, nullable=False, comment="Source path, or the job's name for it."
        ),
        sa.Column(
            "manifest", sa.String(64), nullable=False, comment="Dataset version (manifest id)."
        ),
        sa.Column(
            "logical_bytes", sa.BigInteger, nullable=False, comment="The dataset's size, bytes."
        ),
        sa.Column(
            "bytes_sent",
            sa.BigInteger,
            nullable=False,
            comment="Bytes on the wire (compressed as sent).",
        ),
        sa.Column(
            "objects", sa.Integer, nullable=False, comment="Distinct objects of the dataset."
        ),
        sa.Column(
            "objects_sent", sa.Integer, nullable=False, comment="Objects sent by this transfer."
        ),
        sa.Column("seconds", sa.Double, nullable=False, comment="Wall time of the transfer."),
        sa.Column("at", UTCDateTime(), nullable=False, index=True, comment="When it ended (UTC)."),
        sa.Column(
            "per_gb",
            sa.Numeric(12, 6),
            nullable=False,
            comment="Dollars per GB sent that applied to this direction.",
        ),
        sa.Column(
            "storage_per_gb_month",
            sa.Numeric(12, 6),
            nullable=False,
            comment="Dollars per GB-month stored, at the time.",
        ),
        sa.Column(
            "cost_micros",
            sa.BigInteger,
            nullable=False,
            comment="Bytes sent at per_gb, plus the first month of bytes newly stored.",
        ),
        sa.CheckConstraint(
            "logical_bytes >= 0 AND bytes_sent >= 0 AND objects >= 0 AND objects_sent >= 0",
            name="ck_transfers_counts",
        ),
        sa.CheckConstraint("cost_micros >= 0 AND seconds >= 0", name="ck_transfers_cost"),
        comment="Datasets moved for jobs: pushes, node pulls, stage-outs (append-only).",
    )


def downgrade() -> None:
    op.drop_table("transfers")
