"""Jobs as their tenants see them: list (a page at a time), read, cancel, delete. Submitting and
rerunning are in submit.py."""

from __future__ import annotations

import json

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import JSONResponse

from dlscale.service import jobstore, store
from dlscale.service.db import serialize
from dlscale.service.db.models import Job
from dlscale.service.deps import (
    Caller,
    EditableJob,
    ViewableJob,
    Writer,
    client_address,
    service,
)
from dlscale.service.layout import job_dir, remove_job_dir
from dlscale.service.timesplit import time_split

router = APIRouter()
MAX_PAGE = 1000  # jobs in one page of the list


def job_view(db, job, role: str) -> dict:
    events = [
        {"id": e.id, "at": e.at, "state": e.state, "message": e.message}
        for e in jobstore.job_events(db, job.id)
    ]
    return {
        "id": job.id,
        "tenant": job.tenant.name,
        "user": job.user.name if getattr(job, "user", None) is not None else None,
        "kind": job.kind,
        "state": job.state,
        "reason": job.reason or "",
        "message": job.message or "",
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "cancel_requested": bool(job.cancel_requested),
        "delete_requested": bool(job.delete_requested),
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
def list_jobs(
    request: Request,
    response: Response,
    who: Caller,
    tenant: str | None = None,
    limit: int = 100,
    before: str | None = None,
):
    """The caller's tenants' jobs, newest first, `limit` at a time (at most 1,000); when more
    are older, the X-Next-Before header holds the id to pass as `before` for the next page (a
    Link header too)."""
    if tenant is not None and "\x00" in tenant:
        raise HTTPException(422, "tenant: not a tenant name")
    if not 1 <= limit <= MAX_PAGE:
        raise HTTPException(422, f"limit: must be between 1 and {MAX_PAGE}")
    with service(request).maker.begin() as db:
        cursor = None
        if before is not None:
            found = jobstore.visible_job(db, who.user, before) if len(before) == 16 else None
            if found is None:
                raise HTTPException(422, "before: not one of your jobs' ids")
            cursor = found[0].seq
        rows = jobstore.jobs_of(db, who.user, tenant, limit + 1, cursor)
        listed = [
            {
                "id": j.id,
                "tenant": j.tenant.name,
                "kind": j.kind,
                "state": j.state,
                "reason": j.reason or "",
                "submitted_at": j.submitted_at,
                "started_at": j.started_at,
                "ended_at": j.ended_at,
                "message": j.message or "",
            }
            for j in rows[:limit]
        ]
    if len(rows) > limit:
        last = listed[-1]["id"]
        response.headers["X-Next-Before"] = last
        query = f"limit={limit}&before={last}" + (f"&tenant={tenant}" if tenant else "")
        response.headers["Link"] = f'</api/jobs?{query}>; rel="next"'
    return listed


@router.get("/api/jobs/{job_id}")
def read_job(job_id: str, request: Request, access: ViewableJob) -> dict:
    """The job: its state and history, result and reproduction record, and where its steps
    spent their time so far (from its run record, updated at every epoch)."""
    state = service(request)
    with state.maker.begin() as db:
        row = db.get(Job, access.job.id)  # fresh: nothing stale written back
        view = job_view(db, row, access.role)
    return {**view, "time_split": time_split(job_dir(state.config.data_dir, job_id))}


@router.post("/api/jobs/{job_id}/cancel")
def cancel(job_id: str, request: Request, who: Writer, access: EditableJob) -> dict:
    """Stop a job: a queued one at once, a running one by SIGINT (its last checkpoint is kept);
    the request is stored first, so a cancel survives a server crash."""
    state = service(request)
    with state.maker.begin() as db:
        serialize(db.connection())  # one writer of job states at a time (PostgreSQL)
        row = db.get(Job, access.job.id)  # fresh: a detached copy would write stale columns back
        changed = jobstore.request_cancel(db, row)
        address = client_address(request)
        store.audit(db, "cancel", "ok", actor=who.user.name, ip=address, target=job_id)
        result = {
            "id": row.id,
            "state": row.state,
            "cancel_requested": bool(row.cancel_requested),
            "changed": bool(changed),
        }
    if result["state"] in ("starting", "running"):
        state.executor.cancel(job_dir(state.config.data_dir, job_id))
    return result


@router.delete("/api/jobs/{job_id}")
def delete(job_id: str, request: Request, who: Writer, access: EditableJob) -> JSONResponse:
    """Delete a job and its folder, freeing its tenant's storage: at once when it is queued or
    has ended (200); a running one is cancelled first and deleted when it has stopped (202)."""
    state = service(request)
    folder = job_dir(state.config.data_dir, job_id)
    with state.maker.begin() as db:
        serialize(db.connection())  # the scheduler cannot start it meanwhile
        row = db.get(Job, access.job.id)
        active = row.state in jobstore.ACTIVE
        if active:
            jobstore.request_cancel(db, row)
            row.delete_requested = True
            jobstore.note(db, row, "deletion requested: it is deleted once it has stopped")
        else:
            jobstore.delete_job(db, row)
        address = client_address(request)
        store.audit(db, "delete", "ok", actor=who.user.name, ip=address, target=job_id)
    if active:
        state.executor.cancel(folder)
        body = {"id": job_id, "deleted": False, "delete_requested": True}
        return JSONResponse(body, status_code=202)
    remove_job_dir(folder)
    return JSONResponse({"id": job_id, "deleted": True, "delete_requested": False})
