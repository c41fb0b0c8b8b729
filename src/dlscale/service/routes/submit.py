"""Submitting jobs: a new spec (with its data files and the tenant's own code), or a rerun of an
earlier one. A submission is checked in two steps: its structure here (intake.py: strict YAML,
the spec schema, paths, slots, quotas), then everything that needs its model, data or code in a
validation job inside the job sandbox (executor.validate); either refusal is a 422 in one line.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from fastapi import APIRouter, Depends, File, Form, HTTPException, Request, UploadFile

from dlscale import __version__
from dlscale.errors import UserError
from dlscale.jobspec import load_spec
from dlscale.service import intake, jobstore, store
from dlscale.service.auth import ROLES
from dlscale.service.deps import Principal, client_address, job_access, service, writer
from dlscale.service.layout import (
    INPUTS,
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
from dlscale.service.uploads import check_name, copy_inputs, unpack_zip
from dlscale.service.validators import ExecutorBusy

router = APIRouter()
CHUNK_BYTES = 1 << 20


def _unprocessable(message: str, folder: Path | None = None) -> HTTPException:
    if folder is not None:  # the client named paths relative to its job; keep them that way
        message = message.replace(f"{folder.resolve()}/", "").replace(f"{folder}/", "")
    return HTTPException(422, message)


def _tenant_for(db, who: Principal, name: str | None):
    """The tenant a submission goes to: named, or the caller's only one they may submit to."""
    roles = store.roles(db, who.user)
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
    tenant = next(t for t in store.tenants(db) if t.name == name)
    used, quota = jobstore.storage_used(db, tenant), tenant.storage_bytes
    if quota is not None and used >= quota:
        raise HTTPException(409, f"tenant {name} is at its storage quota ({used} of {quota} bytes)")
    return tenant


def _check_queue(request: Request, tenant) -> None:
    """429 while the tenant has as many jobs waiting as it may (its own limit, else the
    server's): a client looping on submit fills no one's queue but its own, and not forever."""
    state = service(request)
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


def _check_names(files: list[UploadFile]) -> list[str]:
    names: list[str] = []
    for upload in files:
        name = str(check_name(upload.filename or "", "upload"))
        if "/" in name:
            raise UserError(f"upload: '{name}': send folders as a zip archive")
        if name in names:
            raise UserError(f"upload: '{name}' is given twice")
        names.append(name)
    return names


def _validated(request: Request, folder: Path, kind: str, parallel: int | None, tenant, job_id):
    """(cpu slots, gpu slots, folder bytes) of a job written to `folder`, once its structure
    and then its validation job accept it; UserError with the one line that refuses it."""
    state = service(request)
    spec = load_spec(folder / SPEC_FILE)  # the schema only: no model, no data, no code
    intake.check_inside(spec, folder)
    if kind == "sweep" and spec.sweep is None:
        raise UserError("kind sweep: the spec has no sweep: section")
    cpu, gpu = intake.slots(spec, kind, parallel, state.config.gpu_slots)
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


def _create(
    request: Request,
    who: Principal,
    tenant,
    kind: str,
    text: str,
    seed: int,
    repro: dict,
    parallel: int | None,
    fill: Callable[[Path], dict],
    action: str,
) -> dict:
    """Write the job's folder, check it (structure, then its validation job), size it, and
    queue it (one transaction); `fill(folder)` puts the inputs in place and returns the
    reproduction record's facts about them."""
    state = service(request)
    if kind not in intake.KINDS:
        raise HTTPException(422, f"kind: '{kind}' is not one of {', '.join(intake.KINDS)}")
    if parallel is not None and not 1 <= parallel <= 64:
        raise HTTPException(422, "parallel: must be between 1 and 64")
    _check_queue(request, tenant)
    job_id = secrets.token_hex(8)
    folder = job_dir(state.config.data_dir, job_id)
    job = {"id": job_id, "kind": kind, "seed": seed, "spec_file": SPEC_FILE, "parallel": parallel}
    try:
        write_job(folder, job, text, None)
        repro = {**repro, **fill(folder)}
        cpu, gpu, size = _validated(request, folder, kind, parallel, tenant, job_id)
    except UserError as exc:
        remove_job_dir(folder)
        raise _unprocessable(str(exc), folder) from None
    except ExecutorBusy as exc:
        remove_job_dir(folder)
        raise HTTPException(503, str(exc), headers={"Retry-After": "10"}) from None
    except BaseException:
        remove_job_dir(folder)
        raise
    with state.maker.begin() as db:
        row = jobstore.new_job(
            db,
            tenant=tenant,
            user=who.user,
            kind=kind,
            spec_text=text,
            seed=seed,
            cpu_slots=cpu,
            gpu_slots=gpu,
            rerun_of=repro.get("rerun_of"),
            job_id=job_id,
        )
        row.bytes = size
        row.repro_json = json.dumps(
            {
                **repro,
                "spec_sha256": hashlib.sha256(text.encode()).hexdigest(),
                "seed": seed,
                "kind": kind,
                "dlscale": __version__,
            }
        )
        address = client_address(request)
        store.audit(
            db, action, "ok", actor=who.user.name, ip=address, target=job_id, detail=tenant.name
        )
        return {"id": row.id, "state": row.state, "seed": seed, "cpu_slots": cpu, "gpu_slots": gpu}


def _stream_to(upload: UploadFile, path: Path) -> str:
    """Copy an upload into a new file in chunks (never whole in memory); its sha256."""
    digest = hashlib.sha256()
    with open(path, "xb") as sink:
        while chunk := upload.file.read(CHUNK_BYTES):
            digest.update(chunk)
            sink.write(chunk)
    return digest.hexdigest()


@router.post("/api/jobs", status_code=201)
def submit(
    request: Request,
    spec: UploadFile = File(..., description="The job spec (YAML)."),
    kind: str = Form("train"),
    tenant: str | None = Form(None),
    parallel: int | None = Form(None, description="Sweep: trials at a time."),
    files: list[UploadFile] = File(default=[], description="Data files (inputs/NAME)."),
    archive: UploadFile | None = File(
        None, description="A zip unpacked into inputs/ (data, and the tenant's own Python code)."
    ),
    who: Principal = Depends(writer),
) -> dict:
    """Queue a validated spec. An invalid one answers 422 with the CLI's one-line message."""
    state = service(request)
    with state.maker.begin() as db:
        owner = _tenant_for(db, who, tenant)
    try:
        submitted = intake.with_seed(spec.file.read(intake.MAX_SPEC_BYTES + 1))
        names = _check_names(files)
    except UserError as exc:
        raise _unprocessable(str(exc)) from None

    def fill(folder: Path) -> dict:
        inputs = folder / INPUTS
        digests = {
            name: _stream_to(upload, inputs / name)
            for name, upload in zip(names, files, strict=True)
        }
        if archive is not None:
            with tempfile.NamedTemporaryFile(dir=folder, suffix=".zip") as held:
                shutil.copyfileobj(archive.file, held)
                held.flush()
                unpack_zip(Path(held.name), inputs, state.config.max_body_bytes * 4)
        return {"inputs": dict(sorted(digests.items()))}

    repro = {
        "submitted_sha256": hashlib.sha256(submitted.original.encode()).hexdigest(),
        "seed_drawn": submitted.seed_drawn,
    }
    return _create(
        request, who, owner, kind, submitted.text, submitted.seed, repro, parallel, fill, "submit"
    )


@router.post("/api/jobs/{job_id}/rerun", status_code=201)
def rerun(job_id: str, request: Request, who: Principal = Depends(writer)) -> dict:
    """The same spec bytes, seed and inputs, as a new job; when it ends, its page says whether
    its weights are bit-identical to the original's."""
    job, _ = job_access(request, job_id, who, "editor")
    state = service(request)
    with state.maker.begin() as db:
        tenant = next(t for t in store.tenants(db) if t.id == job.tenant_id)
    source = job_dir(state.config.data_dir, job.id) / INPUTS

    def fill(folder: Path) -> dict:
        copy_inputs(source, folder / INPUTS)  # its regular files only, never a link
        return {}

    repro = {
        **{
            k: v
            for k, v in json.loads(job.repro_json or "{}").items()
            if k in ("submitted_sha256", "seed_drawn", "inputs")
        },
        "rerun_of": job.id,
    }
    try:
        with open_plain(job_dir(state.config.data_dir, job.id) / "job.json") as handle:
            parallel = json.load(handle).get("parallel")
    except (FileNotFoundError, ValueError, AttributeError):
        raise HTTPException(409, "the original job's folder is gone or damaged") from None
    with state.maker.begin() as db:
        _tenant_for(db, who, tenant.name)  # the role and the storage quota, as for a submit
    return _create(
        request, who, tenant, job.kind, job.spec_text, job.seed, repro, parallel, fill, "rerun"
    )
