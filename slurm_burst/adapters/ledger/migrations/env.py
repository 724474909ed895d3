"""Alembic environment: run by ``slurm-burst db upgrade`` (never by the alembic CLI).

The caller passes an open connection in ``config.attributes["connection"]``, so
the migration runs inside the caller's lock; the URL never comes from a file.
"""

from __future__ import annotations

from alembic import context

from slurm_burst.adapters.ledger.models import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
