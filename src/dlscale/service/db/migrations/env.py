"""Alembic's entry point for the service's schema: runs on the connection that
dlscale.service.db.migrate hands over (no alembic.ini, no URL of its own)."""

from alembic import context

from dlscale.service.db.models import Base

connection = context.config.attributes.get("connection")
assert connection is not None, "run migrations through dlscale.service.db.migrate"
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    # SQLite alters a table by copying it; later revisions that alter columns need this.
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
