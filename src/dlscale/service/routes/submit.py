"""Submitting jobs: a new spec (with its data files and the tenant's own code), or a rerun of an
earlier one: each route reads its request and hands it to service/submission.py, which checks
it, writes the job's folder and queues it."""

from __future__ import annotations

from fastapi import APIRouter, File, Form, Request, UploadFile

from dlscale.service import intake, submission
from dlscale.service.deps import EditableJob, Writer, client_address, service
from dlscale.service.submission import Submission

router = APIRouter()


@router.post("/api/jobs", status_code=201)
def submit(
    request: Request,
    who: Writer,
    spec: UploadFile = File(..., description="The job spec (YAML)."),
    kind: str = Form("train"),
    tenant: str | None = Form(None),
    parallel: int | None = Form(None, description="Sweep: trials at a time."),
    files: list[UploadFile] = File(default=[], description="Data files (inputs/NAME)."),
    archive: UploadFile | None = File(
        None, description="A zip unpacked into inputs/ (data, and the tenant's own Python code)."
    ),
) -> dict:
    """Queue a validated spec. An invalid one answers 422 with the CLI's one-line message."""
    state = service(request)
    sent = Submission(
        user=who.user,
        tenant=tenant,
        kind=kind,
        spec=spec.file.read(intake.MAX_SPEC_BYTES + 1),
        parallel=parallel,
        files=[(upload.filename or "", upload.file) for upload in files],
        archive=None if archive is None else archive.file,
        address=client_address(request),
    )
    return submission.submit(state, sent)


@router.post("/api/jobs/{job_id}/rerun", status_code=201)
def rerun(request: Request, who: Writer, access: EditableJob) -> dict:
    """The same spec bytes, seed and inputs, as a new job; when it ends, its page says whether
    its weights are bit-identical to the original's."""
    return submission.rerun(service(request), who.user, access.job, client_address(request))
