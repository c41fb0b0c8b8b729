"""Operators and storage: users can be disabled; tenants get a limit on queued jobs; jobs record
why the server stopped them (a storage quota) and whether their deletion was asked for.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("users") as table:
        table.add_column(
            sa.Column("disabled", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("tenants") as table:
        table.add_column(sa.Column("max_queued_jobs", sa.Integer()))
    with op.batch_alter_table("jobs") as table:
        table.add_column(sa.Column("stop_reason", sa.Text()))
        table.add_column(
            sa.Column("delete_requested", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as table:
        table.drop_column("delete_requested")
        table.drop_column("stop_reason")
    with op.batch_alter_table("tenants") as table:
        table.drop_column("max_queued_jobs")
    with op.batch_alter_table("users") as table:
        table.drop_column("disabled")
