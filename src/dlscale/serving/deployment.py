"""The model as a Ray Serve deployment: replicas (a fixed number, or autoscaled between a
floor and a ceiling), each batching the requests that arrive together into one model call
(`@serve.batch`), all counting into one statistics actor; and starting and stopping it on a
local Ray or a cluster's."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import ray
import torch
from ray import serve

from dlscale.serving.auth import BearerToken
from dlscale.serving.inputs import Batch
from dlscale.serving.routes import Answer, build_app
from dlscale.serving.stats import ServingStats

APP_NAME = "dlscale-model"
DEFAULT_MAX_BATCH_SIZE = 16
DEFAULT_BATCH_WAIT_S = 0.005


@dataclass
class Slice:
    """One request's share of a batched answer."""

    classes: list[int]
    confidence: list[float]


@dataclass
class ServingConfig:
    """How to serve: everything the driver decides and every replica reads."""

    load: Callable[[], object]  # builds the Predictor inside the replica, on its own device
    info: dict  # what /health says about the model (run, input shape and kind, precision)
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE  # requests per model call
    batch_wait_s: float = DEFAULT_BATCH_WAIT_S  # how long a lone request waits for others
    token: BearerToken | None = None  # what /predict and /metrics require, if anything


class ModelReplica:
    """One replica: the predictor, the routes, and the batcher between them."""

    def __init__(self, config: ServingConfig, stats) -> None:
        self.model = config.load()
        self.info = config.info
        self.token = config.token
        self.stats = stats  # the ServingStats actor every replica reports to
        self.replica = serve.get_replica_context().replica_tag
        self._batched.set_max_batch_size(config.max_batch_size)
        self._batched.set_batch_wait_timeout_s(config.batch_wait_s)

    def __serve_build_asgi_app__(self):
        return build_app(self, self.token)

    async def predict(self, batch: Batch, arrived_s: float) -> Answer:
        return await self._batched((batch.tensor, arrived_s))

    @serve.batch(max_batch_size=DEFAULT_MAX_BATCH_SIZE, batch_wait_timeout_s=DEFAULT_BATCH_WAIT_S)
    async def _batched(self, requests: list[tuple[torch.Tensor, float]]) -> list[Slice]:
        sizes = [int(tensor.shape[0]) for tensor, _ in requests]
        answer = self.model.predict(torch.cat([tensor for tensor, _ in requests]))
        done_s = time.perf_counter()
        # Fire and forget: the statistics never hold up an answer. Calls from one replica reach
        # the actor in order, so its own /metrics counts every batch it answered before.
        self.stats.record_batch.remote(sum(sizes), [done_s - arrived for _, arrived in requests])
        slices, start = [], 0
        for size in sizes:
            end = start + size
            slices.append(Slice(answer.classes[start:end], answer.confidence[start:end]))
            start = end
        return slices

    async def refused(self, status: int) -> None:
        self.stats.record_refusal.remote(status)

    async def snapshot(self) -> dict:
        return await self.stats.snapshot.remote()

    def health(self) -> dict:
        return {"status": "ok", "engine": "ray-serve", "replica": self.replica, **self.info}


@dataclass
class Scaling:
    """Replicas: `replicas` always, or autoscaled from `replicas` up to `max_replicas` by the
    requests each has in flight (Ray Serve's autoscaler)."""

    replicas: int = 1
    max_replicas: int | None = None
    num_cpus: float = 1.0  # per replica: its torch threads (Ray sets OMP_NUM_THREADS from it)
    num_gpus: float = 0.0  # per replica

    def options(self, max_batch_size: int) -> dict:
        # Two batches' worth in flight per replica: one runs while the next fills. Ray's
        # default (5) would cap every batch at 5 requests.
        in_flight = 2 * max_batch_size
        options: dict = {
            "max_ongoing_requests": in_flight,
            "ray_actor_options": {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus},
        }
        if self.max_replicas is None:
            options["num_replicas"] = self.replicas
        else:
            options["autoscaling_config"] = {
                "min_replicas": self.replicas,
                "initial_replicas": self.replicas,
                "max_replicas": self.max_replicas,
                # Scale up once a replica has a full batch waiting behind the one it runs.
                "target_ongoing_requests": max_batch_size,
            }
        return options


def deploy(config: ServingConfig, scaling: Scaling, host: str, port: int):
    """Start Serve's HTTP proxy on host:port (Ray must be running) and the model behind it at
    /; returns the statistics actor, which lives until `undeploy`."""
    # Serve logs every start-up step at INFO on the driver's stderr; the command says the one
    # line that matters (where it serves) itself.
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    stats = ray.remote(num_cpus=0)(ServingStats).remote()
    serve.start(http_options={"host": host, "port": port})
    deployment = serve.deployment(serve.ingress()(ModelReplica), name="model")
    app = deployment.options(**scaling.options(config.max_batch_size)).bind(config, stats)
    serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
    return stats


def undeploy(stats) -> None:
    """Take the model and its statistics actor off a cluster whose Serve may run other
    applications (a Ray this process started is simply shut down, Serve with it)."""
    serve.delete(APP_NAME)
    ray.kill(stats)
