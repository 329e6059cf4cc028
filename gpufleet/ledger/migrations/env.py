"""Alembic environment: the ledger runs its migrations itself, on the connection it opened
(`gpufleet.ledger.store.open_ledger`); there is no alembic.ini to keep."""

from __future__ import annotations

from alembic import context

from gpufleet.ledger.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata)
with context.begin_transaction():
    context.run_migrations()
