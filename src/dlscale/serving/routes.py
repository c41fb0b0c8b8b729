"""The HTTP face of a served model, the same for every engine behind it: POST /predict,
GET /health, GET /metrics (Prometheus text, or JSON with ?format=json), behind a bearer token
where the server has one."""

from __future__ import annotations

import json
import math
import time
from typing import Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from dlscale.errors import one_line
from dlscale.serving.auth import BearerToken
from dlscale.serving.inputs import MAX_BODY_BYTES, BadInput, Batch, Model, parse_body
from dlscale.serving.stats import prometheus_text


class Answer(Protocol):
    classes: list[int]
    confidence: list[float]


class Engine(Protocol):
    """What runs the model behind the routes: in one process, or a Ray Serve replica that
    batches concurrent requests into one model call."""

    model: Model

    async def predict(self, batch: Batch, arrived_s: float) -> Answer: ...

    async def refused(self, status: int) -> None: ...

    async def snapshot(self) -> dict: ...

    def health(self) -> dict: ...


UNAUTHORIZED = "send the serving token as 'Authorization: Bearer TOKEN'"


def build_app(engine: Engine, token: BearerToken | None = None) -> FastAPI:
    """The three routes over `engine`; no interactive docs (nothing to serve but predictions).
    With a `token`, /predict and /metrics answer 401 to a request without it, and /health says
    only that the server is up: a liveness probe (a load balancer's, a container runtime's)
    carries no secret, and "ok" tells a stranger nothing the open port did not."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    def allowed(request: Request) -> bool:
        return token is None or token.accepts(request.headers.get("authorization"))

    async def unauthorized() -> JSONResponse:
        await engine.refused(401)
        # RFC 6750 §3: a 401 names the scheme it wants.
        return JSONResponse(
            {"error": UNAUTHORIZED}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
        )

    @app.post("/predict")
    async def predict(request: Request):
        arrived_s = time.perf_counter()
        # Before the body is read: a caller without the token costs no parsing.
        if not allowed(request):
            return await unauthorized()
        try:
            batch = parse_body(await _json_body(request), engine.model)
        except BadInput as exc:
            await engine.refused(exc.status)
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        answer = await engine.predict(batch, arrived_s)
        return {"predictions": predictions(answer)}

    @app.get("/health")
    async def health(request: Request):
        return engine.health() if allowed(request) else {"status": "ok"}

    @app.get("/metrics")
    async def metrics(request: Request, format: str = "prometheus"):
        if not allowed(request):
            return await unauthorized()
        snapshot = await engine.snapshot()
        if format == "json":
            return snapshot
        return PlainTextResponse(prometheus_text(snapshot), media_type="text/plain; version=0.0.4")

    return app


async def _json_body(request: Request) -> object:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise BadInput(f"a body of {declared} bytes; at most {MAX_BODY_BYTES} are read", 413)
    # Read in chunks and stop past the limit: a chunked body declares no length.
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BadInput(f"a body of over {MAX_BODY_BYTES} bytes; at most that is read", 413)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        return json.loads(raw)
    # ValueError: bad JSON, bad UTF-8, or an integer past Python's 4300-digit limit.
    except ValueError as exc:
        raise BadInput(f"the body is not JSON ({one_line(exc)})", 400) from None
    except RecursionError:  # nesting deeper than the parser goes
        raise BadInput("the body nests too deeply to be a batch of samples", 400) from None


NOT_FINITE = "the model's output is not finite (NaN or ±inf): no prediction is given"


def predictions(answer: Answer) -> list[dict]:
    """One {"class", "confidence"} per sample; a sample whose output is not a number (a
    diverged model, or an input that overflows it) gets none: class and confidence null (JSON
    has no NaN, and the class of NaN logits means nothing) and an error saying so."""
    return [
        {"class": cls, "confidence": conf}
        if math.isfinite(conf)
        else {"class": None, "confidence": None, "error": NOT_FINITE}
        for cls, conf in zip(answer.classes, answer.confidence, strict=True)
    ]
