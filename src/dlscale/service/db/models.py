"""The service's tables as typed SQLAlchemy models: people, tenants, credentials, jobs and
their history, job files, and the audit log. Times are float seconds (time.time())."""

from __future__ import annotations

from typing import ClassVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    Double,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

NAME = String(100)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar = {float: Double(), str: String(200), bool: Boolean()}


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(NAME, unique=True)
    password_hash: Mapped[str]
    is_admin: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[float]
    disabled: Mapped[bool] = mapped_column(default=False)  # an operator turned the account off


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(NAME, unique=True)
    weight: Mapped[float] = mapped_column(default=1.0)
    max_concurrent_jobs: Mapped[int | None]
    cpu_slots: Mapped[int | None]
    gpu_slots: Mapped[int | None]
    storage_bytes: Mapped[int | None] = mapped_column(BigInteger)  # quota; None: no limit
    max_queued_jobs: Mapped[int | None]  # jobs waiting at once; None: the server's default
    usage: Mapped[float] = mapped_column(default=0.0)  # decayed slot-seconds (fairshare.py)
    usage_at: Mapped[float | None]  # when `usage` was last decayed and charged


class Membership(Base):
    __tablename__ = "memberships"
    __table_args__ = (UniqueConstraint("tenant_id", "user_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    role: Mapped[str] = mapped_column(String(20))


class Token(Base):
    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    prefix: Mapped[str] = mapped_column(String(20), unique=True)  # not secret: names the token
    digest: Mapped[str] = mapped_column(String(64))  # HMAC-SHA256 of the whole token text
    scope: Mapped[str] = mapped_column(String(20))
    created_at: Mapped[float]
    expires_at: Mapped[float | None]
    last_used_at: Mapped[float | None]
    revoked: Mapped[bool] = mapped_column(default=False)


class WebSession(Base):
    __tablename__ = "web_sessions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)  # HMAC of the cookie's value
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    csrf_digest: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float]
    expires_at: Mapped[float] = mapped_column(index=True)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_state_seq", "state", "seq"),
        Index("ix_jobs_tenant_seq", "tenant_id", "seq"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # opaque, server-chosen
    seq: Mapped[int] = mapped_column(Integer, unique=True)  # submit order, 1, 2, ...
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    kind: Mapped[str] = mapped_column(String(20))
    state: Mapped[str] = mapped_column(String(20))
    spec_text: Mapped[str] = mapped_column(Text)
    spec_sha256: Mapped[str] = mapped_column(String(64))
    seed: Mapped[int] = mapped_column(BigInteger)
    cpu_slots: Mapped[int]
    gpu_slots: Mapped[int]
    submitted_at: Mapped[float | None]
    started_at: Mapped[float | None]
    ended_at: Mapped[float | None]
    reason: Mapped[str] = mapped_column(Text, default="")  # why it waits (the scheduler's)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    rerun_of: Mapped[str | None] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")
    result_json: Mapped[str | None] = mapped_column(Text)
    repro_json: Mapped[str | None] = mapped_column(Text)
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)  # its folder's size
    stop_reason: Mapped[str | None] = mapped_column(Text)  # why the server stopped it
    delete_requested: Mapped[bool] = mapped_column(default=False)  # deleted once it has ended

    # Loaded with the job (one join each): job pages show who submitted it and for which
    # tenant after the session ends, and a rerun queues into the original's tenant.
    user: Mapped[User] = relationship(lazy="joined", viewonly=True)
    tenant: Mapped[Tenant] = relationship(lazy="joined", viewonly=True)


class JobEvent(Base):
    """Append-only: one row per state a job entered."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    at: Mapped[float]
    state: Mapped[str] = mapped_column(String(20))
    message: Mapped[str] = mapped_column(Text, default="")


class Artifact(Base):
    __tablename__ = "artifacts"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # opaque: downloads go by id
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    name: Mapped[str] = mapped_column(Text)  # relative to the job's run folder; display only
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))


class AuditEntry(Base):
    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[float] = mapped_column(index=True)
    actor: Mapped[str | None]
    ip: Mapped[str | None] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(50))
    target: Mapped[str | None]
    outcome: Mapped[str] = mapped_column(String(20))
    detail: Mapped[str | None] = mapped_column(Text)
