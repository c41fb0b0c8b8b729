"""What a job produces: its log and per-epoch metrics (live, as server-sent events) and its
artifacts, listed with size and sha256 and fetched by opaque id, never by a client's path."""

from __future__ import annotations

import json
from pathlib import PurePosixPath

from fastapi import APIRouter, Header, HTTPException, Request
from fastapi.responses import StreamingResponse

from dlscale.service import jobstore
from dlscale.service.db.models import Job
from dlscale.service.deps import ARTIFACT_ID, ViewableJob, service
from dlscale.service.layout import MAX_PARSED_BYTES, job_dir, open_artifact, open_plain
from dlscale.service.sse import follow, start_offset

router = APIRouter()
STREAMS = {"logs": ("log.txt", "log"), "metrics": ("metrics.jsonl", "metrics")}


def _stream(
    request: Request,
    job_id: str,
    which: str,
    last_event_id: str | None,
    after: int | None,
    live: bool,
) -> StreamingResponse:
    state = service(request)
    name, kind = STREAMS[which]
    path = job_dir(state.config.data_dir, job_id) / name

    def ended() -> str | None:
        with state.maker.begin() as db:
            job = db.get(Job, job_id)
            return job.state if job is not None and job.state in jobstore.ENDED else None

    events = follow(path, start_offset(last_event_id, after), kind, ended, live)
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


@router.get("/api/jobs/{job_id}/logs")
def logs(
    job_id: str,
    request: Request,
    access: ViewableJob,
    follow: bool = True,
    after: int | None = None,
    last_event_id: str | None = Header(None),
):
    """The job's log as server-sent events (`event: log`, id = byte offset); reconnect with
    Last-Event-ID (or ?after=) to resume; an `end` event carries the final state."""
    return _stream(request, job_id, "logs", last_event_id, after, follow)


@router.get("/api/jobs/{job_id}/metrics/stream")
def metrics_stream(
    job_id: str,
    request: Request,
    access: ViewableJob,
    follow: bool = True,
    after: int | None = None,
    last_event_id: str | None = Header(None),
):
    """Each finished epoch's metrics (JSON) as server-sent events, resumable like the log."""
    return _stream(request, job_id, "metrics", last_event_id, after, follow)


@router.get("/api/jobs/{job_id}/metrics")
def metrics(job_id: str, request: Request, access: ViewableJob) -> list[dict]:
    """Every finished epoch's metrics so far (the first MAX_PARSED_BYTES of them: a job writes
    its own metrics file, and may write it to any size)."""
    path = job_dir(service(request).config.data_dir, job_id) / "metrics.jsonl"
    try:
        with open_plain(path) as handle:  # never through a symlink a job might plant
            text = handle.read(MAX_PARSED_BYTES).decode(errors="replace")
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return rows


@router.get("/api/jobs/{job_id}/artifacts")
def artifacts(job_id: str, request: Request, access: ViewableJob) -> list[dict]:
    """The files a finished job left, with size and sha256; download each by its id."""
    with service(request).maker.begin() as db:
        rows = jobstore.artifacts_of(db, access.job)
        return [{"id": a.id, "name": a.name, "size": a.size, "sha256": a.sha256} for a in rows]


@router.get("/api/jobs/{job_id}/artifacts/{artifact_id}")
def download(job_id: str, artifact_id: str, request: Request, access: ViewableJob):
    state = service(request)
    name = None
    if ARTIFACT_ID.fullmatch(artifact_id):  # ids are the server's own; anything else: none
        with state.maker.begin() as db:
            row = jobstore.artifact(db, access.job, artifact_id)
            name = row.name if row is not None else None
    if name is None:
        raise HTTPException(404, "artifact not found")
    try:
        handle = open_artifact(job_dir(state.config.data_dir, job_id), name)
    except (FileNotFoundError, OSError):
        raise HTTPException(404, "artifact not found") from None

    def chunks():
        with handle:
            while chunk := handle.read(1 << 20):
                yield chunk

    filename = PurePosixPath(name).name.replace('"', "")
    return StreamingResponse(
        chunks(),
        media_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
