"""What every process of a parallel strategy does on its side: find its device, meet the
others over torch.distributed, and run the one training loop with its strategy's exchange."""

from __future__ import annotations

import atexit
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from dlscale.jobspec import Spec, parse_spec
from dlscale.launch.base import READY, WorkerContext
from dlscale.strategies.events import EventReporter
from dlscale.train.device import resolve_device
from dlscale.train.exchange import Exchange
from dlscale.train.loop import Trainer
from dlscale.train.reporter import NullReporter


def worker_device(spec: Spec, context: WorkerContext) -> torch.device:
    """The GPU the launcher gave this process when the spec runs on CUDA; otherwise the CPU."""
    device = resolve_device(spec.device)
    if device.type == "cuda":
        device = torch.device("cuda", context.gpu or 0)
        torch.cuda.set_device(device)
    return device


def backend_for(device: torch.device, asked: str = "auto") -> str:
    """NCCL between GPUs, gloo between CPU processes (or what the spec asks for)."""
    if asked != "auto":
        return asked
    return "nccl" if device.type == "cuda" else "gloo"


def join(context: WorkerContext, backend: str, timeout_s: float) -> None:
    """Meet every other process of the job (torch.distributed's TCP rendezvous)."""
    dist.init_process_group(
        backend,
        init_method=f"tcp://{context.master_addr}:{context.master_port}",
        rank=context.rank,
        world_size=context.world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def average_gradients(grads: list[torch.Tensor], group, members: int) -> int:
    """Average `grads` in place with the same tensors of the group's other `members` (one
    all-reduce of them flattened together); the payload's bytes."""
    if not grads:
        return 0
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    dist.all_reduce(flat, group=group)
    flat /= members
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()
    return flat.numel() * flat.element_size()


def ready(context: WorkerContext) -> None:
    """Tell the launcher this process has met the others: from now on a strategy that trains
    on without a worker may lose it."""
    context.send(READY, context.rank)


def run_trainer(
    context: WorkerContext, payload: dict, make_exchange: Callable[[Spec, torch.device], Exchange]
) -> dict | None:
    """Build this process's trainer around its exchange, resume it if asked, run it; the run
    record on the main trainer, None on the others."""
    spec = parse_spec(payload["spec"])
    if spec.threads is not None:  # the spec's count, over the launcher's share of the cores
        torch.set_num_threads(spec.threads)
    device = worker_device(spec, context)
    exchange = make_exchange(spec, device)
    try:
        reporter = EventReporter(context) if exchange.is_main else NullReporter()
        run_dir, early_warnings = Path(payload["run_dir"]), payload["early_warnings"]
        trainer = Trainer(spec, run_dir, reporter, exchange, device, early_warnings)
        trainer.worker_info = {
            "node": context.node,
            "host": context.host,
            "address": context.address,
        }
        if payload.get("resume_from"):
            trainer.resume(Path(payload["resume_from"]))
        ready(context)
        record = trainer.run()
    except BaseException:
        exchange.close(finished=False)
        raise
    # Leaving the process group comes after the launcher has this process's result: a teardown
    # that stalls (a gloo group's destructor waiting on its threads) must not hold up the job,
    # whose launcher stops every process once it has every result.
    atexit.register(exchange.close, finished=True)
    return record
