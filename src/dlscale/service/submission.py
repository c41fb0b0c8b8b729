"""A job's way into the queue: write its folder, check it, size it and queue it, for a new spec
(with its data files and the tenant's own code) or a rerun of an earlier job.

A submission is checked in two steps: its structure here (intake.py: strict YAML, the spec
schema, paths, slots, quotas), then everything that needs its model, data or code in a
validation job inside the job sandbox (executor.validate); either refusal is a 422 in one line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from fastapi import HTTPException
from sqlalchemy.orm import Session

from dlscale import __version__
from dlscale.atomic import WriteFailed
from dlscale.errors import UserError
from dlscale.jobspec import load_spec
from dlscale.service import deploy as deployment
from dlscale.service import intake, jobstore, store
from dlscale.service.auth import ROLES
from dlscale.service.db.models import Job, Tenant, User
from dlscale.service.layout import (
    INPUTS,
    JOB_FILE,
    SPEC_FILE,
    folder_bytes,
    job_dir,
    open_plain,
    remove_job_dir,
    write_job,
)
from dlscale.service.loop import quota_of
from dlscale.service.scheduler import check_fits
from dlscale.service.scheduler_types import Request as SlotRequest
from dlscale.service.state import ServiceState
from dlscale.service.uploads import check_name, copy_inputs, unpack_zip
from dlscale.service.validators import ExecutorBusy

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
# Facts of the original submission a rerun's reproduction record carries over.
CARRIED = ("submitted_sha256", "seed_drawn", "inputs")


@dataclass(frozen=True)
class Submission:
    """What a client sent to submit a job, as read from its request."""

    user: User
    tenant: str | None  # as named; None: the caller's only tenant they may submit to
    kind: str
    spec: bytes  # its first intake.MAX_SPEC_BYTES + 1 bytes: more is refused
    parallel: int | None  # sweep: trials at a time
    files: list[tuple[str, BinaryIO]]  # (name as sent, its content) for inputs/NAME
    archive: BinaryIO | None  # a zip unpacked into inputs/
    address: str  # the client's, for the audit log


@dataclass(frozen=True)
class _Draft:
    """A job to write, check and queue, from a submit or a rerun."""

    user: User
    tenant: Tenant
    kind: str
    spec_text: str
    seed: int
    parallel: int | None
    repro: dict  # the reproduction record's facts known before the folder is written
    fill: Callable[[Path], dict]  # puts the inputs in the folder; their facts for the record
    action: str  # "submit" | "rerun" | "deploy", as audited
    address: str
    slots: tuple[int, int] | None = None  # (cpu, gpu) of a job with no spec to size it from
    facts: dict | None = None  # more for job.json (a deployment's options, for its runner)


def _unprocessable(message: str, folder: Path | None = None) -> HTTPException:
    if folder is not None:  # the client named paths relative to its job; keep them that way
        message = message.replace(f"{folder.resolve()}/", "").replace(f"{folder}/", "")
    return HTTPException(422, message)


def _tenant_for(db: Session, user: User, name: str | None) -> Tenant:
    """The tenant a submission goes to: named, or the caller's only one they may submit to."""
    roles = store.roles(db, user)
    if name is None:
        editable = [t for t, role in roles.items() if ROLES[role] >= ROLES["editor"]]
        if not editable and len(roles) == 1:
            editable = list(roles)  # their only tenant: the role check below says why not
        if len(editable) != 1:
            choices = ", ".join(sorted(editable)) or "none"
            raise HTTPException(422, f"name the tenant (--tenant); you may submit to: {choices}")
        name = editable[0]
    if name not in roles:
        raise HTTPException(404, "tenant not found")
    if ROLES[roles[name]] < ROLES["editor"]:
        raise HTTPException(403, f"needs role editor in tenant {name} (you are {roles[name]})")
    tenant = store.tenant_named(db, name)
    used, quota = jobstore.storage_used(db, tenant), tenant.storage_bytes
    if quota is not None and used >= quota:
        raise HTTPException(409, f"tenant {name} is at its storage quota ({used} of {quota} bytes)")
    return tenant


def _check_queue(state: ServiceState, tenant: Tenant) -> None:
    """429 while the tenant has as many jobs waiting as it may (its own limit, else the
    server's): a client looping on submit fills no one's queue but its own, and not forever."""
    limit = tenant.max_queued_jobs
    limit = state.config.max_queued_jobs if limit is None else limit
    with state.maker.begin() as db:
        waiting = jobstore.queued_count(db, tenant)
    if waiting >= limit:
        raise HTTPException(
            429,
            f"tenant {tenant.name} has {waiting} jobs waiting, its limit; submit more once "
            "some have started (or cancel some)",
            headers={"Retry-After": "60"},
        )


def _check_names(names: list[str]) -> list[str]:
    checked: list[str] = []
    for sent in names:
        name = str(check_name(sent, "upload"))
        if "/" in name:
            raise UserError(f"upload: '{name}': send folders as a zip archive")
        if name in checked:
            raise UserError(f"upload: '{name}' is given twice")
        checked.append(name)
    return checked


def _stream_to(source: BinaryIO, path: Path) -> str:
    """Copy an upload into a new file in chunks (never whole in memory); its sha256."""
    digest = hashlib.sha256()
    with open(path, "xb") as sink:
        while chunk := source.read(CHUNK_BYTES):
            digest.update(chunk)
            sink.write(chunk)
    return digest.hexdigest()


def _validated(state: ServiceState, folder: Path, draft: _Draft, job_id: str):
    """(cpu slots, gpu slots, folder bytes) of a job written to `folder`, once its structure
    and then its validation job accept it; UserError with the one line that refuses it."""
    tenant = draft.tenant
    if draft.slots is not None:  # a deployment: its options say what it holds
        cpu, gpu = draft.slots
    else:
        spec = load_spec(folder / SPEC_FILE)  # the schema only: no model, no data, no code
        intake.check_inside(spec, folder)
        if draft.kind == "sweep" and spec.sweep is None:
            raise UserError("kind sweep: the spec has no sweep: section")
        cpu, gpu = intake.slots(spec, draft.kind, draft.parallel, state.config.gpu_slots)
    never = check_fits(
        SlotRequest(job_id, tenant.name, cpu, gpu), quota_of(tenant), state.loop.machine
    )
    if never:
        raise UserError(f"refused: this job can never run here: {never}")
    size = folder_bytes(folder)
    with state.maker.begin() as db:
        used = jobstore.storage_used(db, tenant)
    left = None if tenant.storage_bytes is None else tenant.storage_bytes - used
    if left is not None and size > left:
        raise UserError(
            f"refused: its files ({size:,} bytes) would take tenant {tenant.name} past its "
            f"storage quota ({used:,} of {tenant.storage_bytes:,} bytes used)"
        )
    limits = state.config.limits(cpu, gpu, job_id, left)
    state.executor.prepare(folder, limits.uid)
    verdict = state.executor.validate(folder, limits, state.config.validate_timeout_s)
    if not verdict.ok:
        raise UserError(verdict.message)
    return cpu, gpu, size


def _write_checked(state: ServiceState, draft: _Draft, job_id: str) -> tuple[dict, int, int, int]:
    """(reproduction facts, cpu slots, gpu slots, bytes) of the job's folder, written and then
    checked (structure, then its validation job); a refused job leaves no folder behind.
    `draft.fill(folder)` puts the inputs in place and returns the record's facts about them."""
    folder = job_dir(state.config.data_dir, job_id)
    job = {
        "id": job_id,
        "kind": draft.kind,
        "seed": draft.seed,
        "spec_file": SPEC_FILE,
        "parallel": draft.parallel,
        **(draft.facts or {}),
    }
    try:
        write_job(folder, job, draft.spec_text, None)
        repro = {**draft.repro, **draft.fill(folder)}
        cpu, gpu, size = _validated(state, folder, draft, job_id)
    except WriteFailed as exc:  # the server's disk, not the client's spec: no 422
        remove_job_dir(folder)
        log.error("job %s: %s", job_id, exc)  # the path is for the operator, not the tenant
        raise HTTPException(
            503,
            "the server could not store the job (a write to its disk failed); try again later",
            headers={"Retry-After": "60"},
        ) from None
    except UserError as exc:
        remove_job_dir(folder)
        raise _unprocessable(str(exc), folder) from None
    except ExecutorBusy as exc:
        remove_job_dir(folder)
        raise HTTPException(503, str(exc), headers={"Retry-After": "10"}) from None
    except BaseException:
        remove_job_dir(folder)
        raise
    return repro, cpu, gpu, size


def _queue(state: ServiceState, draft: _Draft) -> dict:
    """Write the job's folder, check it, size it, and queue it with its reproduction record
    (one transaction, audited): the new job's id, state, seed and slots."""
    kind, seed = draft.kind, draft.seed
    if kind not in intake.KINDS and draft.slots is None:
        raise HTTPException(422, f"kind: '{kind}' is not one of {', '.join(intake.KINDS)}")
    if draft.parallel is not None and not 1 <= draft.parallel <= 64:
        raise HTTPException(422, "parallel: must be between 1 and 64")
    _check_queue(state, draft.tenant)
    job_id = secrets.token_hex(8)
    repro, cpu, gpu, size = _write_checked(state, draft, job_id)
    with state.maker.begin() as db:
        row = jobstore.new_job(
            db,
            tenant=draft.tenant,
            user=draft.user,
            kind=kind,
            spec_text=draft.spec_text,
            seed=seed,
            cpu_slots=cpu,
            gpu_slots=gpu,
            rerun_of=repro.get("rerun_of"),
            job_id=job_id,
        )
        row.bytes = size
        spec_sha256 = hashlib.sha256(draft.spec_text.encode()).hexdigest()
        record = {"spec_sha256": spec_sha256, "seed": seed, "kind": kind, "dlscale": __version__}
        row.repro_json = json.dumps({**repro, **record})
        store.audit(
            db,
            draft.action,
            "ok",
            actor=draft.user.name,
            ip=draft.address,
            target=job_id,
            detail=draft.tenant.name,
        )
        return {"id": row.id, "state": row.state, "seed": seed, "cpu_slots": cpu, "gpu_slots": gpu}


def submit(state: ServiceState, submission: Submission) -> dict:
    """Queue a new spec once it is checked and its validation job accepts it: the new job's id,
    state, seed and slots."""
    with state.maker.begin() as db:
        tenant = _tenant_for(db, submission.user, submission.tenant)
    try:
        submitted = intake.with_seed(submission.spec)
        names = _check_names([name for name, _ in submission.files])
    except UserError as exc:
        raise _unprocessable(str(exc)) from None

    def fill(folder: Path) -> dict:
        inputs = folder / INPUTS
        digests = {
            name: _stream_to(source, inputs / name)
            for name, (_, source) in zip(names, submission.files, strict=True)
        }
        if submission.archive is not None:
            with tempfile.NamedTemporaryFile(dir=folder, suffix=".zip") as held:
                shutil.copyfileobj(submission.archive, held)
                held.flush()
                unpack_zip(Path(held.name), inputs, state.config.max_body_bytes * 4)
        return {"inputs": dict(sorted(digests.items()))}

    repro = {
        "submitted_sha256": hashlib.sha256(submitted.original.encode()).hexdigest(),
        "seed_drawn": submitted.seed_drawn,
    }
    draft = _Draft(
        user=submission.user,
        tenant=tenant,
        kind=submission.kind,
        spec_text=submitted.text,
        seed=submitted.seed,
        parallel=submission.parallel,
        repro=repro,
        fill=fill,
        action="submit",
        address=submission.address,
    )
    return _queue(state, draft)


def rerun(state: ServiceState, user: User, job: Job, address: str) -> dict:
    """Queue `job` again with the same spec bytes, seed and inputs (`user` may edit it: the
    route checked): the new job's id, state, seed and slots."""
    tenant = job.tenant
    if job.kind == deployment.SERVE_KIND:
        raise HTTPException(
            422, f"job {job.id} is a deployment: to serve its model again, deploy its train job"
        )
    source = job_dir(state.config.data_dir, job.id) / INPUTS

    def fill(folder: Path) -> dict:
        copy_inputs(source, folder / INPUTS)  # its regular files only, never a link
        return {}

    carried = json.loads(job.repro_json or "{}").items()
    repro = {**{k: v for k, v in carried if k in CARRIED}, "rerun_of": job.id}
    try:
        with open_plain(job_dir(state.config.data_dir, job.id) / JOB_FILE) as handle:
            parallel = json.load(handle).get("parallel")
    except (FileNotFoundError, ValueError, AttributeError):
        raise HTTPException(409, "the original job's folder is gone or damaged") from None
    with state.maker.begin() as db:
        _tenant_for(db, user, tenant.name)  # the role and the storage quota, as for a submit
    draft = _Draft(
        user=user,
        tenant=tenant,
        kind=job.kind,
        spec_text=job.spec_text,
        seed=job.seed,
        parallel=parallel,
        repro=repro,
        fill=fill,
        action="rerun",
        address=address,
    )
    return _queue(state, draft)


def deploy(
    state: ServiceState, user: User, job: Job, options: deployment.DeployOptions, address: str
) -> dict:
    """Queue a deployment of `job`'s model (`user` may edit it: the route checked): a job of
    kind serve-model that serves it until cancelled; its id, state and slots."""
    try:
        options.check()
    except UserError as exc:
        raise _unprocessable(str(exc)) from None
    refused = deployment.refusal(job.kind, job.state, job.id)
    if refused is not None:
        raise HTTPException(*refused)
    if not deployment.DEPLOYING.claim(job.tenant.name):
        raise HTTPException(
            429,
            f"a deployment for tenant {job.tenant.name} is being made; try again once it is queued",
            headers={"Retry-After": "5"},
        )
    try:
        return _deploy(state, user, job, options, address)
    finally:
        deployment.DEPLOYING.release(job.tenant.name)


def _deploy(
    state: ServiceState, user: User, job: Job, options: deployment.DeployOptions, address: str
) -> dict:
    source = job_dir(state.config.data_dir, job.id)
    with state.maker.begin() as db:
        tenant = _tenant_for(db, user, job.tenant.name)  # the role and the quota, as a submit's
        quota = tenant.storage_bytes
        left = None if quota is None else quota - jobstore.storage_used(db, tenant)

    def fill(folder: Path) -> dict:
        # The quota is checked as the files are copied, not once they all are: a model of many
        # checkpoints cannot fill the disk before it is refused.
        deployment.copy_model(source, folder, left)
        return {"deploys": job.id, "device": options.device, "precision": options.precision}

    draft = _Draft(
        user=user,
        tenant=job.tenant,
        kind=deployment.SERVE_KIND,
        spec_text=options.spec_text(job.id),
        seed=job.seed,
        parallel=None,
        repro={},
        fill=fill,
        action="deploy",
        address=address,
        slots=options.slots,
        facts={"serve": {"device": options.device, "precision": options.precision}},
    )
    return _queue(state, draft)
