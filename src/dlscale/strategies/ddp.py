"""Strategy `ddp`: synchronous data parallel; N workers, one shard of every batch, allreduce.

Each worker holds a whole model (torch DistributedDataParallel), trains on its slice of every
global batch (the sampler shards it), and gradients are averaged with allreduce every step over
torch.distributed: gloo between CPU processes, NCCL between GPUs. Worker 0 reports, evaluates and
writes; the launcher (local processes or Ray actors) places and supervises the workers.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from dlscale.launch.base import Launcher, Resources, WorkerContext
from dlscale.spec import Spec, parse_spec
from dlscale.strategies.events import EventReporter, default_launcher, forward_to
from dlscale.train.device import resolve_device
from dlscale.train.loop import Trainer
from dlscale.train.reporter import NullReporter, Reporter


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
    launcher = default_launcher(launcher)
    reporter = reporter or NullReporter()
    strategy = spec.strategy
    gpus = 1.0 if resolve_device(spec.device).type == "cuda" else 0.0
    payload = {
        "spec": spec.model_dump(mode="json"),
        "run_dir": str(run_dir),
        "resume_from": str(resume_from) if resume_from else None,
    }

    results = launcher.run(
        ddp_worker, payload, strategy.workers, Resources(cpus=1.0, gpus=gpus), strategy.port,
        forward_to(reporter),
    )  # fmt: skip
    record = results[0]
    reporter.finish(record)
    return record
