"""GPU time of hosts outside Kubernetes (GPUHosts), by host and workload.

Revision ID: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "host_usage",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("host", sa.String(253), nullable=False),
        sa.Column("workload", sa.String(253), nullable=True),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("gpu_hours", sa.Float, nullable=False),
        sa.Column("idle_gpu_hours", sa.Float, nullable=False),
        sa.Column("cluster", sa.String(64), nullable=True),
    )
    op.create_index("ix_host_usage_at", "host_usage", ["at"])
    op.create_index("ix_host_usage_host", "host_usage", ["host"])


def downgrade() -> None:
    op.drop_index("ix_host_usage_host", "host_usage")
    op.drop_index("ix_host_usage_at", "host_usage")
    op.drop_table("host_usage")
