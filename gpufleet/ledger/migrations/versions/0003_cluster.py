"""The cluster of each row: several clusters of a fleet may share one ledger (PostgreSQL), each
controller keeping to its own rows; a ledger of one cluster leaves it empty.

Revision ID: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TABLES = ("segments", "capacity", "reservations")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("cluster", sa.String(64), nullable=True))
        op.create_index(f"ix_{table}_cluster", table, ["cluster"])


def downgrade() -> None:
    for table in TABLES:
        op.drop_index(f"ix_{table}_cluster", table)
        op.drop_column(table, "cluster")
