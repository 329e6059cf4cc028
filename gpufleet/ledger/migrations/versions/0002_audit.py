"""The remediation audit log.

Revision ID: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("entry", sa.String(16), nullable=False),
        sa.Column("proposal", sa.Integer, nullable=True),
        sa.Column("workload", sa.String(320), nullable=False),
        sa.Column("pattern", sa.String(64), nullable=False),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("tier", sa.Integer, nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
    )
    op.create_index("ix_audit_proposal", "audit", ["proposal"])


def downgrade() -> None:
    op.drop_table("audit")
