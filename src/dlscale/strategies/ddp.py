"""Strategy `ddp`: synchronous data parallel; N workers, one slice of every batch, allreduce.

Each worker holds a whole model (torch DistributedDataParallel), trains on its slice of every
global batch (the sampler cuts it), and gradients are averaged with allreduce during backward
over torch.distributed: gloo between CPU processes, NCCL between GPUs. Worker 0 reports,
evaluates and writes; the launcher (local processes or Ray actors) places and supervises them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from dlscale.data import DataBundle
from dlscale.errors import UserError
from dlscale.jobspec import Spec
from dlscale.jobspec.strategy import sync_batchnorm_refusal
from dlscale.launch.base import Launcher, Resources, WorkerContext
from dlscale.strategies.parent import launch
from dlscale.strategies.worker import backend_for, join, run_trainer
from dlscale.train.ddp_hook import AllreduceTimer, wrap
from dlscale.train.device import resolve_device
from dlscale.train.exchange import Exchange
from dlscale.train.reporter import Reporter


def bytes_sent_per_worker(payload_bytes: float, world_size: int) -> float:
    """A ring allreduce sends 2(N−1)/N of the payload from each worker (reduce-scatter, gather)."""
    return 2 * (world_size - 1) / world_size * payload_bytes


class DdpExchange(Exchange):
    """Gradients are averaged inside backward (DDP's buckets); nothing else moves."""

    name = "ddp"
    comm_overlaps = True

    def __init__(self, spec: Spec, context: WorkerContext, device: torch.device):
        self.spec, self.context, self.device = spec, context, device
        self.rank = self.data_rank = context.rank
        self.trainers = self.data_world = context.world_size
        self.timer = AllreduceTimer(context.world_size)

    def prepare(self, model: nn.Module, data: DataBundle, device: torch.device) -> nn.Module:
        module = super().prepare(model, data, device)
        if self.spec.strategy.sync_batchnorm:
            # torch's own conversion, before the optimizer and DDP see the model: each BatchNorm
            # becomes a SyncBatchNorm over the whole group, keeping its parameters and buffers
            # (so checkpoints load into the plain model).
            module = nn.SyncBatchNorm.convert_sync_batchnorm(module)
            if self.rank == 0 and not batchnorm_layers(module):
                # Said through the launcher: the parent's terminal, and the run's record.
                self.context.send("warn", no_batchnorm_warning(self.spec.model.name))
        return module

    def connect(self, module: nn.Module, optimizer) -> None:
        strategy = self.spec.strategy
        join(self.context, backend_for(self.device, strategy.backend), strategy.timeout_s)
        device_ids = [self.device.index or 0] if self.device.type == "cuda" else None
        self.model = wrap(module, self.timer, device_ids)  # rank 0's weights

    def accumulating(self):
        # DDP's own switch: backward leaves the gradients in `.grad` without a bucket's
        # all-reduce; the step's last micro-batch reduces the sum.
        return self.model.no_sync()

    def comm_totals(self) -> tuple[float, int]:
        return self.timer.totals()

    def close(self, finished: bool) -> None:
        # DDP's reducer holds the process group: released after the group was destroyed, the
        # group's destructor waited forever for its gloo threads (torch 2.13, now and then).
        # Released first, the group goes down with destroy_process_group, as it should.
        if self.model is not None:
            self.model.reducer = None
        super().close(finished)

    def sections(self, summaries: list[dict | None]) -> dict[str, dict]:
        seconds, payload = self.timer.totals()
        own = summaries[self.rank]
        steps = max(1, own["steps"])
        payload_per_step = payload / steps
        step_s = own["step_s"]
        return {
            "distributed": {
                "workers": self.trainers,
                "backend": dist.get_backend() if dist.is_initialized() else None,
                "per_worker_batch_size": self.spec.batch_size,
                "accumulate": self.spec.accumulate,
                "global_batch_size": self.spec.batch_size * self.spec.accumulate * self.trainers,
                "allreduces_per_step": self.timer.allreduces / steps,
                "allreduce_s_per_step": seconds / steps,
                "allreduce_share": seconds / step_s if step_s else 0.0,
                "allreduce_payload_bytes_per_step": payload_per_step,
                "bytes_sent_per_worker_per_step": bytes_sent_per_worker(
                    payload_per_step, self.trainers
                ),
            }
        }


def ddp_worker(context: WorkerContext, payload: dict) -> dict | None:
    """One worker: join the others, train its slice, return the record (worker 0) or None."""
    return run_trainer(context, payload, lambda spec, device: DdpExchange(spec, context, device))


def run(
    spec: Spec,
    run_dir: Path,
    resume_from: Path | None,
    reporter: Reporter,
    launcher: Launcher | None = None,
    early_warnings: Sequence[str] = (),
) -> dict:
    """Start `spec.strategy.workers` workers with the launcher; return worker 0's record."""
    device = resolve_device(spec.device)
    if spec.strategy.sync_batchnorm and device.type != "cuda":  # `auto` found no GPU here
        raise UserError(sync_batchnorm_refusal(f"{spec.device}, {device.type} here"))
    gpus = 1.0 if device.type == "cuda" else 0.0
    cpus = float(spec.threads or 1)  # a Ray cluster reserves each worker its threads' cores
    return launch(
        spec,
        run_dir,
        resume_from,
        reporter,
        launcher,
        ddp_worker,
        Resources(cpus=cpus, gpus=gpus),
        own_gpu=spec.strategy.backend != "gloo",
        early_warnings=early_warnings,
    )


def batchnorm_layers(model: nn.Module) -> int:
    """The layers convert_sync_batchnorm replaces: every BatchNorm1d, 2d or 3d (their base)."""
    return sum(isinstance(module, _BatchNorm) for module in model.modules())


def no_batchnorm_warning(model_name: str) -> str:
    """A model without batch norm trains as plain ddp: worth a word, not a refusal."""
    return (
        f"strategy.sync_batchnorm: model '{model_name}' has no BatchNorm layer, so nothing is "
        "synchronised"
    )
