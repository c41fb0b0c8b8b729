"""The model in one process with no batching and no Ray: the FastAPI endpoint Ray Serve is
measured against (benchmarks/serve_model.py), with the same routes and checks."""

from __future__ import annotations

import time

from fastapi import FastAPI

from dlscale.serving.auth import BearerToken
from dlscale.serving.inputs import Batch
from dlscale.serving.routes import Answer, build_app
from dlscale.serving.stats import ServingStats


class PlainEngine:
    """Each request is one model call, made on the event loop: requests take turns."""

    def __init__(self, predictor, info: dict):
        self.model = predictor
        self.info = info
        self.stats = ServingStats()

    async def predict(self, batch: Batch, arrived_s: float) -> Answer:
        answer = self.model.predict(batch.tensor)
        self.stats.record_batch(batch.num_samples, [time.perf_counter() - arrived_s])
        return answer

    async def refused(self, status: int) -> None:
        self.stats.record_refusal(status)

    async def snapshot(self) -> dict:
        return self.stats.snapshot()

    def health(self) -> dict:
        return {"status": "ok", "engine": "plain", **self.info}


def build_plain_app(predictor, info: dict, token: BearerToken | None = None) -> FastAPI:
    """A FastAPI app serving `predictor` from this process (run it with uvicorn), behind
    `token` if there is one."""
    return build_app(PlainEngine(predictor, info), token)
