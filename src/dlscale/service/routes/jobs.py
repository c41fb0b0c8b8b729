"""Jobs: submit a spec (with small data files), list, read, cancel, rerun."""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import tempfile
from pathlib import Path

from fastapi import APIRouter, Depends, File, Form, HTTPException, Request, UploadFile

from dlscale import __version__, api
from dlscale.errors import UserError
from dlscale.service import specs, store
from dlscale.service.auth import ROLES
from dlscale.service.db import serialize
from dlscale.service.db.models import Job
from dlscale.service.deps import Principal, job_access, principal, service, writer
from dlscale.service.jobs import Request as SlotRequest
from dlscale.service.layout import job_dir, open_plain, write_job
from dlscale.service.loop import quota_of
from dlscale.service.scheduler import check_fits
from dlscale.service.uploads import check_name, unpack_zip

router = APIRouter()


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
    used, quota = store.storage_used(db, tenant), tenant.storage_bytes
    if quota is not None and used >= quota:
        raise HTTPException(409, f"tenant {name} is at its storage quota ({used} of {quota} bytes)")
    return tenant


def _inputs(files: list[UploadFile]) -> dict[str, bytes]:
    inputs: dict[str, bytes] = {}
    for upload in files:
        name = str(check_name(upload.filename or "", "upload"))
        if "/" in name:
            raise UserError(f"upload: '{name}': send folders as a zip archive")
        if name in inputs:
            raise UserError(f"upload: '{name}' is given twice")
        inputs[name] = upload.file.read()
    return inputs


def _create(
    request: Request,
    who: Principal,
    tenant,
    kind: str,
    text: str,
    seed: int,
    repro: dict,
    parallel: int | None,
    fill,
) -> dict:
    """Write the job's folder, validate the spec there, size it, and queue it (one
    transaction); `fill(folder)` puts the inputs in place."""
    state = service(request)
    if kind not in specs.KINDS:
        raise HTTPException(422, f"kind: '{kind}' is not one of {', '.join(specs.KINDS)}")
    if parallel is not None and not 1 <= parallel <= 64:
        raise HTTPException(422, "parallel: must be between 1 and 64")
    job_id = secrets.token_hex(8)
    folder = job_dir(state.config.data_dir, job_id)
    job = {"id": job_id, "kind": kind, "seed": seed, "spec_file": "spec.yaml", "parallel": parallel}
    try:
        write_job(folder, job, text, None)
        fill(folder)
        spec, _warnings = api.validate(folder / "spec.yaml")
        specs.check_inside(spec, folder)
        if kind == "sweep" and spec.sweep is None:
            raise UserError("kind sweep: the spec has no sweep: section")
        cpu, gpu = specs.slots(spec, kind, parallel, state.config.gpu_slots)
        never = check_fits(
            SlotRequest(job_id, tenant.name, cpu, gpu), quota_of(tenant), state.loop.machine
        )
        if never:
            raise UserError(f"refused: this job can never run here: {never}")
    except UserError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise _unprocessable(str(exc), folder) from None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    with state.maker.begin() as db:
        row = store.new_job(
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
        row.repro_json = json.dumps(
            {
                **repro,
                "spec_sha256": hashlib.sha256(text.encode()).hexdigest(),
                "seed": seed,
                "kind": kind,
                "dlscale": __version__,
            }
        )
        return {"id": row.id, "state": row.state, "seed": seed, "cpu_slots": cpu, "gpu_slots": gpu}


@router.post("/api/jobs", status_code=201)
def submit(
    request: Request,
    spec: UploadFile = File(..., description="The job spec (YAML)."),
    kind: str = Form("train"),
    tenant: str | None = Form(None),
    parallel: int | None = Form(None, description="Sweep: trials at a time."),
    files: list[UploadFile] = File(default=[], description="Data files (inputs/NAME)."),
    archive: UploadFile | None = File(None, description="A zip unpacked into inputs/."),
    who: Principal = Depends(writer),
) -> dict:
    """Queue a validated spec. An invalid one answers 422 with the CLI's one-line message."""
    state = service(request)
    with state.maker.begin() as db:
        owner = _tenant_for(db, who, tenant)
    try:
        submitted = specs.with_seed(spec.file.read())
        inputs = _inputs(files)
    except UserError as exc:
        raise _unprocessable(str(exc)) from None

    def fill(folder: Path) -> None:
        (folder / "inputs").mkdir(exist_ok=True)
        for name, data in inputs.items():
            (folder / "inputs" / name).write_bytes(data)
        if archive is not None:
            with tempfile.NamedTemporaryFile(dir=folder, suffix=".zip") as held:
                shutil.copyfileobj(archive.file, held)
                held.flush()
                unpack_zip(Path(held.name), folder / "inputs", state.config.max_body_bytes * 4)

    repro = {
        "submitted_sha256": hashlib.sha256(submitted.original.encode()).hexdigest(),
        "seed_drawn": submitted.seed_drawn,
        "inputs": {n: hashlib.sha256(d).hexdigest() for n, d in sorted(inputs.items())},
    }
    return _create(request, who, owner, kind, submitted.text, submitted.seed, repro, parallel, fill)


def job_view(db, job, role: str) -> dict:
    tenant = next(t for t in store.tenants(db) if t.id == job.tenant_id)
    events = [
        {"id": e.id, "at": e.at, "state": e.state, "message": e.message}
        for e in store.job_events(db, job.id)
    ]
    return {
        "id": job.id,
        "tenant": tenant.name,
        "user": job.user.name if getattr(job, "user", None) is not None else None,
        "kind": job.kind,
        "state": job.state,
        "reason": job.reason or "",
        "message": job.message or "",
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "cancel_requested": bool(job.cancel_requested),
        "rerun_of": job.rerun_of,
        "cpu_slots": job.cpu_slots,
        "gpu_slots": job.gpu_slots,
        "seed": job.seed,
        "spec": job.spec_text,
        "result": json.loads(job.result_json) if job.result_json else None,
        "reproduction": json.loads(job.repro_json) if job.repro_json else None,
        "events": events,
        "role": role,
    }


@router.get("/api/jobs")
def list_jobs(request: Request, tenant: str | None = None, who: Principal = Depends(principal)):
    """The caller's tenants' jobs, newest first."""
    if tenant is not None and "\x00" in tenant:
        raise HTTPException(422, "tenant: not a tenant name")
    with service(request).maker.begin() as db:
        names = {t.id: t.name for t in store.tenants(db)}
        return [
            {
                "id": j.id,
                "tenant": names[j.tenant_id],
                "kind": j.kind,
                "state": j.state,
                "reason": j.reason or "",
                "submitted_at": j.submitted_at,
                "ended_at": j.ended_at,
                "message": j.message or "",
            }
            for j in store.jobs_of(db, who.user, tenant)
        ]


@router.get("/api/jobs/{job_id}")
def read_job(job_id: str, request: Request, who: Principal = Depends(principal)) -> dict:
    job, role = job_access(request, job_id, who)
    with service(request).maker.begin() as db:
        return job_view(db, db.get(Job, job.id), role)  # fresh: nothing stale written back


@router.post("/api/jobs/{job_id}/cancel")
def cancel(job_id: str, request: Request, who: Principal = Depends(writer)) -> dict:
    """Stop a job: a queued one at once, a running one by SIGINT (its last checkpoint is kept);
    the request is stored first, so a cancel survives a server crash."""
    job, _ = job_access(request, job_id, who, "editor")
    state = service(request)
    with state.maker.begin() as db:
        serialize(db.connection())  # one writer of job states at a time (PostgreSQL)
        row = db.get(Job, job.id)  # fresh: a detached copy would write stale columns back
        changed = store.request_cancel(db, row)
        store.audit(db, "cancel", "ok", actor=who.user.name, target=job_id)
        result = {
            "id": row.id,
            "state": row.state,
            "cancel_requested": bool(row.cancel_requested),
            "changed": bool(changed),
        }
    if result["state"] in ("starting", "running"):
        state.executor.cancel(job_dir(state.config.data_dir, job_id))
    return result


@router.post("/api/jobs/{job_id}/rerun", status_code=201)
def rerun(job_id: str, request: Request, who: Principal = Depends(writer)) -> dict:
    """The same spec bytes, seed and inputs, as a new job; when it ends, its page says whether
    its weights are bit-identical to the original's."""
    job, _ = job_access(request, job_id, who, "editor")
    state = service(request)
    with state.maker.begin() as db:
        tenant = next(t for t in store.tenants(db) if t.id == job.tenant_id)
    source = job_dir(state.config.data_dir, job.id) / "inputs"

    def fill(folder: Path) -> None:
        if source.is_dir():
            shutil.copytree(source, folder / "inputs", symlinks=True, dirs_exist_ok=True)

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
    return _create(request, who, tenant, job.kind, job.spec_text, job.seed, repro, parallel, fill)
