"""The first ledger: run segments, pool capacity and reservations over time.

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _interval(name: str, *key: sa.Column) -> None:  # type: ignore[type-arg]
    op.create_table(
        name,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        *key,
        sa.Column("started_at", sa.DateTime, nullable=False),
        sa.Column("ended_at", sa.DateTime, nullable=True),
        sa.Column("seen_at", sa.DateTime, nullable=False),
        sa.UniqueConstraint(key[0].name, "started_at", name=f"uq_{name}_key_started"),
    )
    op.create_index(f"ix_{name}_ended_at", name, ["ended_at"])


def upgrade() -> None:
    op.create_table(
        "segments",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("uid", sa.String(64), nullable=False),
        sa.Column("workload", sa.String(320), nullable=False),
        sa.Column("namespace", sa.String(64), nullable=False),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("workload_class", sa.String(16), nullable=False),
        sa.Column("pool", sa.String(64), nullable=True),
        sa.Column("gpu_type", sa.String(64), nullable=True),
        sa.Column("gpus", sa.Float, nullable=False),
        sa.Column("nodes", sa.Integer, nullable=False),
        sa.Column("price_per_gpu_hour", sa.Float, nullable=True),
        sa.Column("started_at", sa.DateTime, nullable=False),
        sa.Column("ended_at", sa.DateTime, nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(128), nullable=True),
        sa.Column("lost_gpu_seconds", sa.Float, nullable=True),
        sa.UniqueConstraint("uid", "started_at", name="uq_segments_uid_started"),
    )
    op.create_index("ix_segments_started_at", "segments", ["started_at"])
    op.create_index("ix_segments_ended_at", "segments", ["ended_at"])
    op.create_index("ix_segments_outcome", "segments", ["outcome"])
    _interval(
        "capacity",
        sa.Column("pool", sa.String(64), nullable=False),
        sa.Column("gpu_type", sa.String(64), nullable=False),
        sa.Column("price_per_gpu_hour", sa.Float, nullable=True),
        sa.Column("gpus", sa.Float, nullable=False),
        sa.Column("allocated_gpus", sa.Float, nullable=False),
        sa.Column("unhealthy_gpus", sa.Float, nullable=False),
    )
    _interval(
        "reservations",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("pool", sa.String(64), nullable=False),
        sa.Column("gpus", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("reservations")
    op.drop_table("capacity")
    op.drop_table("segments")
