"""What each run's nodes were bought as (on-demand, spot, reserved: its rate); the
notifications' delivery log (one row per message sent or given up on) and what the
controller's alerts remember (episodes told, idle clocks, digests sent): a restarted controller
tells nothing again that it already told.

Revision ID: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("segments", sa.Column("capacity_type", sa.String(16), nullable=True))
    op.create_table(
        "deliveries",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("happened_at", sa.DateTime, nullable=False),
        sa.Column("route", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("dedup_key", sa.String(512), nullable=False),
        sa.Column("team", sa.String(64), nullable=True),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("title", sa.String(512), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("cluster", sa.String(64), nullable=True),
    )
    op.create_index("ix_deliveries_at", "deliveries", ["at"])
    op.create_index("ix_deliveries_route_key", "deliveries", ["route", "dedup_key"])
    op.create_table(
        "alert_state",
        sa.Column("key", sa.String(160), primary_key=True),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("alert_state")
    op.drop_index("ix_deliveries_route_key", "deliveries")
    op.drop_index("ix_deliveries_at", "deliveries")
    op.drop_table("deliveries")
    op.drop_column("segments", "capacity_type")
