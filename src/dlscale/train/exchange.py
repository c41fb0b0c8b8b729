"""The Exchange: what a strategy supplies to the one training loop, and the one-process default.

The loop (train/loop.py) and the step (train/step.py) are written once. Around them, a strategy
says only how gradients and weights move: ddp wraps the model so that backward allreduces;
the parameter-server workers push gradients and pull weights after backward; a pipeline stage
runs its schedule in place of forward and backward and sums tied gradients; hybrid also averages
them across replicas. Everything else (devices, precision, evaluation, checkpoints and resume,
timing, progress, the run record) comes from the loop, for every strategy alike.

This class is the `single` strategy's exchange (nothing moves) and the defaults every other
exchange starts from: one plain subclass each, overriding only the hooks it needs.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from dlscale.train.score import evaluate

if TYPE_CHECKING:
    from dlscale.data import DataBundle


class Step(Protocol):
    """What an exchange may ask of the step it works around (train/step.py's TrainStep)."""

    scaler: torch.amp.GradScaler | None

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...

    def unscale(self) -> bool: ...

    def update_scale(self) -> None: ...

    def apply(self) -> None: ...


class Exchange:
    """One process trains alone. Trainers are the processes that run the loop (a ps server does
    not); `rank` numbers them, and the trainer with `is_main` reports, evaluates and writes."""

    name = "single"
    rank = 0  # this trainer among the trainers
    trainers = 1
    data_rank, data_world = 0, 1  # which slice of every global batch this trainer takes
    main_rank = 0  # the trainer that reports, evaluates and writes
    updates_locally = True  # the step applies the optimizer here (not on a parameter server)
    comm_overlaps = False  # communication runs during backward (DDP) rather than after it
    optimizer_sharded = False  # each trainer's optimizer holds a different part (pipeline)
    lockstep = True  # trainers take every step together, so the main one's history is theirs
    # Whether `trainer_state` holds anything: the same on every trainer of a run, since every
    # trainer then takes part in gathering it.
    holds_trainer_state = False
    model: nn.Module | None = None  # what the step calls, when not the trained module (DDP)

    @property
    def is_main(self) -> bool:
        return self.rank == self.main_rank

    @property
    def seed_rank(self) -> int:
        """Which random stream (dropout) this trainer draws: its own, unless trainers that
        compute the same activations must draw the same (a tensor-parallel group)."""
        return self.rank

    # ---- setting up

    def prepare(self, model: nn.Module, data: DataBundle, device: torch.device) -> nn.Module:
        """The part of `model` this trainer trains, on `device` (a pipeline keeps its stage)."""
        return model.to(device)

    def param_groups(self, params: list[torch.Tensor]) -> list:
        """What the optimizer is built over: the trainable parameters, or groups of them."""
        return params

    def connect(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Join the other processes once the module and its optimizer exist (DDP, stages)."""

    def start(self) -> None:
        """Just before the first step (a ps worker pulls the servers' weights)."""

    def close(self, finished: bool) -> None:
        """Leave the process group, whatever happened. After a finished run every process
        leaves together: one that tore down its group while a peer was still writing the record
        left DDP's gloo group hanging in its destructor on the peer (torch 2.13)."""
        if dist.is_initialized():
            if finished:
                dist.barrier()
            dist.destroy_process_group()

    # ---- around the step (TrainStep.__call__)

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad(set_to_none=True)

    def forward_backward(self, step: Step, x: torch.Tensor, y: torch.Tensor):
        """Gradients in `.grad`; the loss (None on a trainer that does not see it)."""
        return step.forward_backward(x, y)

    def accumulating(self) -> AbstractContextManager:
        """Around a micro-batch's backward that is not a step's last (the spec's `accumulate`):
        its gradients stay in `.grad` here, to be summed with the next micro-batch's, and
        nothing moves (ddp: DistributedDataParallel.no_sync)."""
        return nullcontext()

    def after_backward(self, step: Step) -> None:
        """Gradients are this trainer's own; make them what the update needs."""

    def agree_on_overflow(self, found_inf: list[torch.Tensor]) -> None:
        """fp16: make every trainer skip the update if any trainer's gradients overflowed."""

    def after_update(self, step: Step) -> None:
        """The update is done (or skipped, if the servers apply it)."""

    def comm_totals(self) -> tuple[float, int]:
        """Seconds spent communicating and payload bytes moved, so far."""
        return 0.0, 0

    # ---- evaluation, checkpoints, the record

    def evaluate(self, module: nn.Module, loader, device, precision: str):
        """(loss, accuracy) on the main trainer; None elsewhere."""
        if not self.is_main:
            return None
        return evaluate(module, loader, device, precision)

    def gather(self, value: Any) -> list[Any] | None:
        """Every trainer's `value` by rank, on the main trainer (None elsewhere). A collective:
        every trainer calls it. Tensors travel on the CPU."""
        if self.trainers == 1:
            return [value]
        # all_gather, not gather: after a gloo gather_object, tearing down DDP's process group
        # hung in ProcessGroupGloo's destructor here (torch 2.13); every trainer briefly holds
        # every value, which for a model's state is a copy of the whole model each.
        gathered: list[Any] = [None] * self.trainers
        dist.all_gather_object(gathered, _to_cpu(value))
        return gathered if self.is_main else None

    def full_state(self, state: dict) -> dict | None:
        """The whole model's state dict on the main trainer, from each trainer's `state`."""
        return state if self.is_main else None

    def load_model(self, module: nn.Module, state: dict) -> None:
        """Take this trainer's part of a whole-model state dict."""
        module.load_state_dict(state)

    def optimizer_state(self, optimizer: torch.optim.Optimizer):
        """What a checkpoint keeps of the optimizer (every trainer's, when each holds a part)."""
        state = optimizer.state_dict()
        return self.gather(state) if self.optimizer_sharded else state

    def load_optimizer(self, optimizer: torch.optim.Optimizer, saved) -> None:
        """Take this trainer's part of what `optimizer_state` saved."""
        if self.optimizer_sharded and saved is not None:
            saved = saved[self.rank] if self.rank < len(saved) else None
        if saved is not None:
            optimizer.load_state_dict(saved)

    def extra_state(self) -> dict:
        """What the strategy needs in a checkpoint to resume (a pipeline's split)."""
        return {}

    def trainer_state(self) -> Any:
        """What this trainer holds, beyond its weights, optimizer and random stream, that a
        resume needs, made whole for a checkpoint (a PipeDream-2BW stage finishes its batch in
        flight and gives its gradient). Called on every trainer when `holds_trainer_state`."""
        return None

    def load_trainer_state(self, saved: Any) -> None:
        """Take this trainer's part of what `trainer_state` saved (None: the checkpoint has
        none, as one written before it existed)."""

    def resume_step(self, step: int) -> int:
        """The step this trainer continues from, given the checkpoint's."""
        return step

    def finish(self, summary: dict) -> list[dict | None] | None:
        """Training is over: every trainer's summary on the main trainer (None for a trainer
        that died on the way, where a strategy trains on without it)."""
        return self.gather(summary)

    def describe(self) -> dict:
        """Facts shown before training starts, beside the loop's."""
        return {}

    def worker_extras(self) -> dict:
        """This trainer's own strategy figures, for run.json's `workers`."""
        return {}

    def sections(self, summaries: list[dict | None]) -> dict[str, dict]:
        """The strategy's own sections of run.json (on the main trainer)."""
        return {}


def _to_cpu(value: Any) -> Any:
    """`value` with every tensor in it moved to the CPU (pickled CUDA tensors name a device)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(item) for item in value)
    return value
