"""The service's first schema: users, tenants, memberships, tokens, web sessions, jobs, job
events, artifacts, audit.

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Created in this order (foreign keys point backwards), dropped in the reverse one.
TABLES = (
    "users",
    "tenants",
    "memberships",
    "tokens",
    "web_sessions",
    "jobs",
    "job_events",
    "artifacts",
    "audit",
)


def _id() -> sa.Column:
    return sa.Column("id", sa.Integer(), primary_key=True)


def _users_and_tenants() -> None:
    op.create_table(
        "users",
        _id(),
        sa.Column("name", sa.String(100), nullable=False, unique=True),
        sa.Column("password_hash", sa.String(200), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
    )
    op.create_table(
        "tenants",
        _id(),
        sa.Column("name", sa.String(100), nullable=False, unique=True),
        sa.Column("weight", sa.Double(), nullable=False),
        sa.Column("max_concurrent_jobs", sa.Integer()),
        sa.Column("cpu_slots", sa.Integer()),
        sa.Column("gpu_slots", sa.Integer()),
        sa.Column("storage_bytes", sa.BigInteger()),
        sa.Column("usage", sa.Double(), nullable=False),
        sa.Column("usage_at", sa.Double()),
    )
    op.create_table(
        "memberships",
        _id(),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.UniqueConstraint("tenant_id", "user_id"),
    )
    op.create_index("ix_memberships_user_id", "memberships", ["user_id"])


def _credentials() -> None:
    op.create_table(
        "tokens",
        _id(),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("prefix", sa.String(20), nullable=False, unique=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("scope", sa.String(20), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double()),
        sa.Column("last_used_at", sa.Double()),
        sa.Column("revoked", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_tokens_user_id", "tokens", ["user_id"])
    op.create_table(
        "web_sessions",
        _id(),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("csrf_digest", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
    )
    op.create_index("ix_web_sessions_user_id", "web_sessions", ["user_id"])
    op.create_index("ix_web_sessions_expires_at", "web_sessions", ["expires_at"])


def _jobs() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("seq", sa.Integer(), nullable=False, unique=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("user_id", sa.Integer(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("spec_text", sa.Text(), nullable=False),
        sa.Column("spec_sha256", sa.String(64), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("cpu_slots", sa.Integer(), nullable=False),
        sa.Column("gpu_slots", sa.Integer(), nullable=False),
        sa.Column("submitted_at", sa.Double()),
        sa.Column("started_at", sa.Double()),
        sa.Column("ended_at", sa.Double()),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("rerun_of", sa.String(32)),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("result_json", sa.Text()),
        sa.Column("repro_json", sa.Text()),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_jobs_state_seq", "jobs", ["state", "seq"])
    op.create_index("ix_jobs_tenant_seq", "jobs", ["tenant_id", "seq"])
    op.create_table(
        "job_events",
        _id(),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id", "id"])
    op.create_table(
        "artifacts",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
    )
    op.create_index("ix_artifacts_job_id", "artifacts", ["job_id"])


def _audit() -> None:
    op.create_table(
        "audit",
        _id(),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("actor", sa.String(200)),
        sa.Column("ip", sa.String(64)),
        sa.Column("action", sa.String(50), nullable=False),
        sa.Column("target", sa.String(200)),
        sa.Column("outcome", sa.String(20), nullable=False),
        sa.Column("detail", sa.Text()),
    )
    op.create_index("ix_audit_at", "audit", ["at"])


def upgrade() -> None:
    _users_and_tenants()
    _credentials()
    _jobs()
    _audit()


def downgrade() -> None:
    for table in reversed(TABLES):
        op.drop_table(table)  # its indexes go with it
