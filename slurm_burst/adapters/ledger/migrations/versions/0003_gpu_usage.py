"""GPU usage per job and node, from NVML samples of the burst nodes.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from slurm_burst.adapters.ledger.models import UTCDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_usage",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True, comment="Surrogate key."),
        sa.Column(
            "job_key",
            sa.String(96),
            nullable=False,
            index=True,
            comment="cluster:jobid:start-epoch, as jobs.job_key.",
        ),
        sa.Column("job_id", sa.BigInteger, nullable=False, comment="Slurm job id."),
        sa.Column("node", sa.String(128), nullable=False, comment="Burst node."),
        sa.Column(
            "period_start", UTCDateTime(), nullable=False, comment="Start of the period (UTC)."
        ),
        sa.Column("period_end", UTCDateTime(), nullable=False, comment="End of the period (UTC)."),
        sa.Column("gpus", sa.Integer, nullable=False, comment="GPUs the job held on the node."),
        sa.Column("samples", sa.Integer, nullable=False, comment="Samples in the period."),
        sa.Column("gpu_seconds", sa.Double, nullable=False, comment="GPUs held x seconds."),
        sa.Column(
            "busy_gpu_seconds",
            sa.Double,
            nullable=False,
            comment="Utilization x GPUs x seconds (the part of gpu_seconds the GPUs were busy).",
        ),
        sa.Column(
            "memory_used_max_bytes",
            sa.BigInteger,
            nullable=False,
            comment="Most GPU memory the job's GPUs held at a sample, bytes.",
        ),
        sa.UniqueConstraint("job_key", "node", "period_start", name="uq_gpu_usage_once"),
        sa.CheckConstraint(
            "gpu_seconds >= 0 AND busy_gpu_seconds >= 0 AND busy_gpu_seconds <= gpu_seconds",
            name="ck_gpu_usage_seconds",
        ),
        comment="GPU use of a job on a node over a period, from NVML samples (append-only).",
    )


def downgrade() -> None:
    op.drop_table("gpu_usage")
