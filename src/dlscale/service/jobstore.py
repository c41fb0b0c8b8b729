"""Jobs in the database: submit, move through the states of the contract (one event row per
state), find them as a user may see them, cancel, and list their files. Functions over an open
session that never commit (the caller's `with maker.begin()` is the transaction)."""

from __future__ import annotations

import hashlib
import secrets
import time

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from dlscale.errors import UserError
from dlscale.service.db import serialize
from dlscale.service.db.models import Artifact, Job, JobEvent, Membership, Tenant, User
from dlscale.service.deploy import SERVE_KIND
from dlscale.service.scheduler_types import Request

KINDS = ("train", "sweep", "profile", SERVE_KIND)  # a spec's kinds, and a deployment
ENDED = ("succeeded", "failed", "cancelled")
ACTIVE = ("starting", "running")
# A job that is `starting` may already have ended: its process can finish between two polls of
# the server, which then sees the result before it ever saw the job running.
NEXT = {
    "queued": ("starting", "cancelled"),
    "starting": ("running", *ENDED),
    "running": ENDED,
}
STATES = ("queued", *ACTIVE, *ENDED)


def new_job(
    db: Session,
    *,
    tenant: Tenant,
    user: User,
    kind: str,
    spec_text: str,
    seed: int,
    cpu_slots: int,
    gpu_slots: int,
    rerun_of: str | None = None,
    job_id: str | None = None,
) -> Job:
    """A queued job numbered after every earlier one (its place in the queue), with its first
    event."""
    if kind not in KINDS:
        raise UserError(f"kind '{kind}' is not one of {', '.join(KINDS)}")
    job_id = job_id or secrets.token_hex(8)
    Request(job_id, tenant.name, cpu_slots, gpu_slots)  # validates the slot counts, or raises
    # max + 1 is only safe while no other transaction numbers a job: take the write lock first.
    serialize(db.connection())
    seq = (db.scalar(select(func.max(Job.seq))) or 0) + 1
    now = time.time()
    job = Job(
        id=job_id,
        seq=seq,
        tenant_id=tenant.id,
        user_id=user.id,
        kind=kind,
        state="queued",
        spec_text=spec_text,
        spec_sha256=hashlib.sha256(spec_text.encode()).hexdigest(),
        seed=seed,
        cpu_slots=cpu_slots,
        gpu_slots=gpu_slots,
        submitted_at=now,
        reason="",
        cancel_requested=False,
        rerun_of=rerun_of,
        message="",
        bytes=0,
    )
    db.add(job)
    db.flush()
    db.add(JobEvent(job_id=job_id, at=now, state="queued", message="submitted"))
    db.flush()
    return job


def transition(db: Session, job: Job, state: str, message: str = "") -> JobEvent:
    """Move `job` to `state` (ValueError if the contract does not allow it), stamp its times,
    and append the event."""
    if state not in NEXT.get(job.state, ()):
        raise ValueError(f"job {job.id}: {job.state} -> {state} is not allowed")
    now = time.time()
    if state == "starting":
        job.started_at = now  # from here it holds slots (fair share charges them)
    if state in ENDED:
        job.ended_at = now
    job.reason = ""  # why it waited in the queue: out of date once it leaves it
    job.state = state
    job.message = message
    event = JobEvent(job_id=job.id, at=now, state=state, message=message)
    db.add(event)
    db.flush()
    return event


def note(db: Session, job: Job, message: str) -> JobEvent:
    """An event in the job's history that changes no state (a cancel asked for, a stop)."""
    event = JobEvent(job_id=job.id, at=time.time(), state=job.state, message=message)
    db.add(event)
    db.flush()
    return event


def delete_job(db: Session, job: Job) -> None:
    """The job's rows: its events, its artifacts' list, the job (its folder is the caller's)."""
    db.execute(delete(JobEvent).where(JobEvent.job_id == job.id))
    db.execute(delete(Artifact).where(Artifact.job_id == job.id))
    db.delete(job)
    db.flush()


def deletable_jobs(db: Session) -> list[str]:
    """Ids of the ended jobs whose deletion was asked for while they ran."""
    query = select(Job.id).where(Job.delete_requested.is_(True), Job.state.in_(ENDED))
    return list(db.scalars(query))


def job_events(db: Session, job_id: str, after_id: int = 0) -> list[JobEvent]:
    return list(
        db.scalars(
            select(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.id > after_id)
            .order_by(JobEvent.id)
        )
    )


def request_cancel(db: Session, job: Job) -> bool:
    """Cancel a queued job now; ask a starting or running one to stop (the server signals it,
    and its result says when it did). False when there was nothing to change."""
    if job.state == "queued":
        transition(db, job, "cancelled", "cancelled while queued")
        return True
    if job.state in ACTIVE and not job.cancel_requested:
        job.cancel_requested = True
        note(db, job, "cancel requested")
        return True
    return False


def visible_job(db: Session, user: User, job_id: str) -> tuple[Job, str] | None:
    """(job, the user's role in its tenant); None when there is no such job or the user is not
    a member of its tenant (the two look the same to them)."""
    found = db.execute(
        select(Job, Membership.role)
        .join(Membership, Membership.tenant_id == Job.tenant_id)
        .where(Job.id == job_id, Membership.user_id == user.id)
    ).first()
    return None if found is None else (found[0], found[1])


def jobs_of(
    db: Session,
    user: User,
    tenant: Tenant | str | None = None,
    limit: int = 100,
    before_seq: int | None = None,
) -> list[Job]:
    """The newest `limit` jobs of the tenants `user` belongs to (of one, if named), submitted
    before job number `before_seq` when given (the next page)."""
    query = (
        select(Job)
        .join(Membership, Membership.tenant_id == Job.tenant_id)
        .where(Membership.user_id == user.id)
    )
    if before_seq is not None:
        query = query.where(Job.seq < before_seq)
    if isinstance(tenant, Tenant):
        query = query.where(Job.tenant_id == tenant.id)
    elif tenant is not None:
        query = query.join(Tenant, Tenant.id == Job.tenant_id).where(Tenant.name == tenant)
    return list(db.scalars(query.order_by(Job.seq.desc()).limit(limit)))


def queued_count(db: Session, tenant: Tenant) -> int:
    """How many of the tenant's jobs wait in the queue."""
    query = select(func.count(Job.id)).where(Job.tenant_id == tenant.id, Job.state == "queued")
    return int(db.scalar(query) or 0)


def queued_jobs(db: Session) -> list[Job]:
    """Every queued job, first submitted first."""
    return list(db.scalars(select(Job).where(Job.state == "queued").order_by(Job.seq)))


def active_jobs(db: Session) -> list[Job]:
    """Every job holding slots (starting or running), in submit order."""
    return list(db.scalars(select(Job).where(Job.state.in_(ACTIVE)).order_by(Job.seq)))


def storage_used(db: Session, tenant: Tenant) -> int:
    """Bytes in the folders of the tenant's jobs (as last measured)."""
    return int(db.scalar(select(func.sum(Job.bytes)).where(Job.tenant_id == tenant.id)) or 0)


def set_artifacts(db: Session, job: Job, rows: list[tuple[str, int, str]]) -> list[Artifact]:
    """Replace the job's file list with `rows` of (name, size, sha256); each gets a new random
    id, the only handle a download accepts (names never reach the file system)."""
    db.execute(delete(Artifact).where(Artifact.job_id == job.id))
    made = [
        Artifact(id=secrets.token_urlsafe(12), job_id=job.id, name=name, size=size, sha256=sha)
        for name, size, sha in rows
    ]
    db.add_all(made)
    db.flush()
    return made


def artifacts_of(db: Session, job: Job) -> list[Artifact]:
    query = select(Artifact).where(Artifact.job_id == job.id).order_by(Artifact.name)
    return list(db.scalars(query))


def artifact(db: Session, job: Job, artifact_id: str) -> Artifact | None:
    """The job's artifact with this id; None for another job's id or an unknown one."""
    return db.scalar(select(Artifact).where(Artifact.id == artifact_id, Artifact.job_id == job.id))
