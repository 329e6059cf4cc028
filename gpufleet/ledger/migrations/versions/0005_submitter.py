"""Who created each run's workload (its submitter, as the API server named them): cost and
usage by user.

Revision ID: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("segments", sa.Column("submitter", sa.String(253), nullable=True))


def downgrade() -> None:
    op.drop_column("segments", "submitter")
