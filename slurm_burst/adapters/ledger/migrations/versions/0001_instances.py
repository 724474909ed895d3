"""Instances and their life events (the minimal ledger of the burst path).

Revision ID: 0001
Revises:
Create Date: 2026-11-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from slurm_burst.adapters.ledger.models import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

EVENTS = ("requested", "running", "joined", "terminated", "failed")


def upgrade() -> None:
    op.create_table(
        "instances",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True, comment="Surrogate key."),
        sa.Column(
            "instance_id",
            sa.String(128),
            nullable=False,
            unique=True,
            comment="Provider's instance id.",
        ),
        sa.Column("cluster", sa.String(64), nullable=False, comment="Slurm ClusterName."),
        sa.Column("node", sa.String(128), nullable=False, index=True, comment="Slurm node name."),
        sa.Column("node_group", sa.String(64), nullable=False, comment="slurm-burst node group."),
        sa.Column("provider", sa.String(64), nullable=False, comment="Provider profile name."),
        sa.Column("region", sa.String(64), nullable=False, comment="Provider region or zone."),
        sa.Column("size", sa.String(64), nullable=False, comment="Instance size (type)."),
        sa.Column(
            "price_per_hour",
            sa.Numeric(12, 6),
            nullable=False,
            comment="Price per instance-hour when launched (config).",
        ),
        sa.Column(
            "recorded_at", UTCDateTime(), nullable=False, comment="When this row was written (UTC)."
        ),
        sa.CheckConstraint("price_per_hour >= 0", name="ck_instances_price_nonnegative"),
        comment="One row per cloud instance slurm-burst launched (append-only).",
    )
    op.create_table(
        "instance_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True, comment="Surrogate key."),
        sa.Column(
            "instance_id",
            sa.String(128),
            sa.ForeignKey("instances.instance_id"),
            nullable=False,
            index=True,
            comment="The instance.",
        ),
        sa.Column(
            "event",
            sa.Enum(
                *EVENTS,
                name="instance_event_kind",
                native_enum=False,
                create_constraint=True,
                length=16,
            ),
            nullable=False,
            comment="requested, running, joined, terminated or failed.",
        ),
        sa.Column("at", UTCDateTime(), nullable=False, comment="When it happened (UTC)."),
        sa.Column(
            "detail", sa.String(512), nullable=False, comment="Error code or note (never a secret)."
        ),
        sa.UniqueConstraint("instance_id", "event", name="uq_instance_events_once"),
        comment="Life events of instances (append-only, one per kind).",
    )


def downgrade() -> None:
    op.drop_table("instance_events")
    op.drop_table("instances")
