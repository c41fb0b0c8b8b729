"""Strategy `ddp`: synchronous data parallel; N workers, one shard of every batch, allreduce.

Each worker holds a whole model (torch DistributedDataParallel), trains on its slice of every
global batch (the sampler shards it), and gradients are averaged with allreduce every step over
torch.distributed: gloo between CPU processes, NCCL between GPUs. Worker 0 reports, evaluates and
writes; the launcher (local processes or Ray actors) places and supervises the workers.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dlscale.launch.base import Launcher, Resources, WorkerContext
from dlscale.spec import Spec, parse_spec
from dlscale.train.device import resolve_device
from dlscale.train.loop import Trainer
from dlscale.train.reporter import NullReporter, Reporter

FORWARDED = ("start", "step", "epoch_end", "warn")  # `finish` is the parent's own


STEP_EVENT_INTERVAL_S = 0.1  # a progress bar needs no more; each event costs both processes CPU


class EventReporter:
    """Worker 0's reporter: sends events to the parent, which shows them.

    Step events are thinned to one per STEP_EVENT_INTERVAL_S (the last step of an epoch always
    goes, with the epoch's end): pickling, the queue's pipe and the parent's redraw cost CPU
    that the workers need, a few percent of a small model's throughput on a 2-core machine.
    """

    def __init__(self, context: WorkerContext):
        self.context = context
        self.last_step_sent = 0.0

    def start(self, plan: dict) -> None:
        self.context.send("start", plan)

    def step(self, step: int, epoch: int, loss: float, samples_per_s: float) -> None:
        now = time.monotonic()
        if now - self.last_step_sent >= STEP_EVENT_INTERVAL_S:
            self.last_step_sent = now
            self.context.send("step", step, epoch, loss, samples_per_s)

    def epoch_end(self, record: dict) -> None:
        self.context.send("epoch_end", record)

    def warn(self, message: str) -> None:
        self.context.send("warn", message)

    def finish(self, record: dict) -> None:
        pass


def worker_device(spec: Spec, local_rank: int) -> torch.device:
    """One GPU per worker process when the spec runs on CUDA; otherwise the CPU."""
    device = resolve_device(spec.device)
    if device.type == "cuda":
        return torch.device("cuda", local_rank)
    return device


def ddp_worker(context: WorkerContext, payload: dict) -> dict:
    """One worker: join the process group, train its shard, return its run record."""
    spec = parse_spec(payload["spec"])
    device = worker_device(spec, context.local_rank)
    backend = spec.strategy.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{context.master_addr}:{context.master_port}",
        rank=context.rank,
        world_size=context.world_size,
        timeout=timedelta(seconds=spec.strategy.timeout_s),
    )
    try:
        reporter = EventReporter(context) if context.rank == 0 else NullReporter()
        trainer = Trainer(
            spec, Path(payload["run_dir"]), reporter, context.rank, context.world_size, device
        )
        trainer.worker_info = {"node": context.node}
        if payload["resume_from"]:
            trainer.resume(Path(payload["resume_from"]))
        return trainer.run()
    finally:
        dist.destroy_process_group()


def run(
    spec: Spec,
    run_dir: Path,
    resume_from: Path | None,
    reporter: Reporter,
    launcher: Launcher | None = None,
) -> dict:
    """Start `spec.strategy.workers` workers with the launcher; return worker 0's record."""
    if launcher is None:
        from dlscale.launch.local import LocalLauncher

        launcher = LocalLauncher()
    reporter = reporter or NullReporter()
    strategy = spec.strategy
    gpus = 1.0 if resolve_device(spec.device).type == "cuda" else 0.0
    payload = {
        "spec": spec.model_dump(mode="json"),
        "run_dir": str(run_dir),
        "resume_from": str(resume_from) if resume_from else None,
    }

    def forward(kind: str, args: tuple[Any, ...]) -> None:
        if kind in FORWARDED:
            getattr(reporter, kind)(*args)

    results = launcher.run(
        ddp_worker, payload, strategy.workers, Resources(cpus=1.0, gpus=gpus), strategy.port,
        forward,
    )  # fmt: skip
    record = results[0]
    reporter.finish(record)
    return record
