"""Deployed models: deploy a succeeded train job's model as a job of its own, and reach it
(predict, health, metrics) with the tenant's own credentials, through service/model_proxy.py."""

from __future__ import annotations

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import Response

from dlscale.service import submission
from dlscale.service.deploy import SERVE_KIND, DeployOptions
from dlscale.service.deps import EditableJob, ViewableJob, Writer, client_address, service
from dlscale.service.layout import job_dir
from dlscale.service.model_proxy import NotServed, forward, read_body

router = APIRouter()
JSON = "application/json"
PROMETHEUS = "text/plain; version=0.0.4"


@router.post("/api/jobs/{job_id}/deploy", status_code=201)
def deploy(
    request: Request,
    who: Writer,
    access: EditableJob,
    device: str = Form("cpu", description="cpu | cuda (holds a GPU slot)."),
    precision: str = Form("fp32", description="fp32 | bf16 | int8 (int8: cpu only)."),
) -> dict:
    """Serve this succeeded train job's model as a new job (kind serve-model), in its own
    sandbox, until it is cancelled; it answers POST /api/jobs/{new id}/predict."""
    options = DeployOptions(device=device, precision=precision)
    address = client_address(request)
    return submission.deploy(service(request), who.user, access.job, options, address)


@router.post("/api/jobs/{job_id}/predict")
async def predict(request: Request, access: ViewableJob) -> Response:
    """Predictions of the deployed model for `{"inputs": [sample, ...]}` (docs/serving.md): the
    body is passed to the model's sandbox unread; its answer (or its 400/413/422) comes back."""
    folder = _served(request, access)
    try:
        with service(request).model_requests.slot(access.job.id):
            body = await read_body(request)
            return await _forward(request, access, folder, "POST", "/predict", body, JSON)
    except NotServed as exc:
        raise _http(exc) from None


@router.get("/api/jobs/{job_id}/model/health")
async def health(request: Request, access: ViewableJob) -> Response:
    """What the deployed model takes (input shape and kind, classes, precision)."""
    folder = _served(request, access)
    try:
        with service(request).model_requests.slot(access.job.id):
            return await _forward(request, access, folder, "GET", "/health", b"", JSON)
    except NotServed as exc:
        raise _http(exc) from None


@router.get("/api/jobs/{job_id}/model/metrics")
async def metrics(request: Request, access: ViewableJob, format: str = "prometheus") -> Response:
    """The deployed model's request counts and latencies: Prometheus text, or ?format=json."""
    if format not in ("prometheus", "json"):
        raise HTTPException(422, "format: prometheus or json")
    folder = _served(request, access)
    path, media = ("/metrics?format=json", JSON) if format == "json" else ("/metrics", PROMETHEUS)
    try:
        with service(request).model_requests.slot(access.job.id):
            return await _forward(request, access, folder, "GET", path, b"", media)
    except NotServed as exc:
        raise _http(exc) from None


def _served(request: Request, access) -> object:
    """The deployment's folder while it serves; else the one line saying why not: 409 for a
    job that is not a deployment or has ended, 503 (with Retry-After) for one not started yet."""
    job = access.job
    if job.kind != SERVE_KIND:
        raise HTTPException(
            409,
            f"job {job.id} is a {job.kind} job, not a deployed model: deploy it first "
            f"(POST /api/jobs/{job.id}/deploy)",
        )
    if job.state in ("queued", "starting"):
        raise HTTPException(
            503,
            f"job {job.id} is {job.state}: its model is served once it runs; try again",
            headers={"Retry-After": "5"},
        )
    if job.state != "running":
        raise HTTPException(
            409, f"job {job.id} has ended ({job.state}): its model is no longer served"
        )
    return job_dir(service(request).config.data_dir, job.id)


async def _forward(request, access, folder, method: str, path: str, body: bytes, media: str):
    uid = service(request).config.job_uid(access.job.id)
    answer = await forward(folder, uid, method, path, body)
    return Response(answer.body, status_code=answer.status, media_type=media)


def _http(exc: NotServed) -> HTTPException:
    headers = None if exc.retry_after_s is None else {"Retry-After": str(exc.retry_after_s)}
    return HTTPException(exc.status, str(exc), headers=headers)
