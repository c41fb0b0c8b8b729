"""A tensor-parallel trainer's exchange: its shards of the planned layers on a DeviceMesh, the
collectives DTensor runs inside forward and backward (metered), and, with data parallel
replicas, gradients averaged across the replicas after backward.

Rank = replica × degree + shard: a tensor-parallel group is `degree` consecutive ranks (on a
GPU machine, GPUs of one node, where the links are fastest). Every trainer of a group sees the
same batch (its replica's share of the global batch) and draws the same dropout. Checkpoints
hold the whole model and optimizer, assembled from the shards, so they equal a single process's
in layout; a resume cuts them again.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, distribute_tensor

from dlscale.errors import UserError
from dlscale.jobspec import Spec, TensorStrategy
from dlscale.launch.base import WorkerContext
from dlscale.profiler.tensor_plan import TensorPlan
from dlscale.strategies.tensor.meter import CommMeter
from dlscale.strategies.tensor.section import tensor_section
from dlscale.strategies.tensor.styles import apply_plan
from dlscale.strategies.worker import average_gradients, backend_for, join
from dlscale.train.exchange import Exchange
from dlscale.train.score import evaluate

CHECK_SAMPLES = 4  # the plan's forward is checked against the whole model's on this many
CHECK_RTOL = 1e-4


class TensorExchange(Exchange):
    name = "tensor"

    def __init__(self, spec: Spec, context: WorkerContext, payload: dict, device: torch.device):
        self.spec, self.context, self.device = spec, context, device
        strategy: TensorStrategy = spec.strategy
        self.strategy = strategy
        self.degree, self.replicas = strategy.degree, strategy.data_parallel
        self.rank = context.rank
        self.trainers = self.degree * self.replicas
        self.replica, self.shard = divmod(context.rank, self.degree)
        self.data_rank, self.data_world = self.replica, self.replicas
        self.plan = TensorPlan.from_dict(payload["tensor_plan"])
        self.meter = CommMeter()
        self.sync_s, self.sync_bytes = 0.0, 0
        self.steps_run = 0  # by this process (the meter's figures are this process's)

    @property
    def seed_rank(self) -> int:
        return self.replica  # a group computes the same replicated activations

    # ---- setting up

    def prepare(self, model: nn.Module, data, device: torch.device) -> nn.Module:
        """Meet the others, build the 2-D mesh, split the planned layers, and check that the
        split model computes what the whole one does."""
        join(self.context, backend_for(device, self.strategy.backend), self.strategy.timeout_s)
        self.mesh = init_device_mesh(
            device.type, (self.replicas, self.degree), mesh_dim_names=("dp", "tp")
        )
        self.dp_group = self.mesh["dp"].get_group() if self.replicas > 1 else None
        model = model.to(device)
        x = data.example(CHECK_SAMPLES)[0].to(device)
        expected = _eval_forward(model, x)
        apply_plan(model, self.mesh["tp"], self.plan.layers)
        try:
            got = _eval_forward(model, x)
        except RuntimeError as exc:
            raise UserError(
                f"tensor plan {self.plan.styles}: the split model fails: "
                f"{str(exc).splitlines()[0]}; give strategy.plan"
            ) from None
        error = float((got - expected).abs().max() / expected.abs().max().clamp_min(1e-12))
        if got.shape != expected.shape or error > CHECK_RTOL:
            raise UserError(
                f"tensor plan {self.plan.styles} computes a different forward than the whole "
                f"model (largest relative difference {error:.1e}): a split layer's output meets "
                "an operation that needs all of it; give strategy.plan with those replicated"
            )
        self.plan_error = error
        self.module = model
        return model

    def param_groups(self, params: list[torch.Tensor]) -> list:
        """Split layers' parameters (DTensors) and whole ones in groups of their own: on a GPU
        the optimizer updates a group in one foreach kernel, which takes no mix of the two."""
        split = [p for p in params if isinstance(p, DTensor)]
        whole = [p for p in params if not isinstance(p, DTensor)]
        return [{"params": group} for group in (split, whole) if group]

    # ---- the step

    def forward_backward(self, step, x: torch.Tensor, y: torch.Tensor):
        self.steps_run += 1
        with self.meter:
            return step.forward_backward(x, y)

    def after_backward(self, step) -> None:
        """Replicas average their gradients (each shard with the same shard of the others)."""
        if self.dp_group is None:
            return
        t0 = time.perf_counter()
        grads = [_local(p.grad) for p in self.module.parameters() if p.grad is not None]
        self.sync_bytes += average_gradients(grads, self.dp_group, self.replicas)
        self.sync_s += time.perf_counter() - t0

    def agree_on_overflow(self, found_inf: list[torch.Tensor]) -> None:
        for flag in found_inf:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)

    def comm_totals(self) -> tuple[float, int]:
        return self.meter.seconds + self.sync_s, self.meter.payload_bytes + self.sync_bytes

    # ---- evaluation and state

    def evaluate(self, module: nn.Module, loader, device, precision: str):
        """Replica 0's group evaluates together (a split layer needs every shard)."""
        if self.replica != 0:
            return None
        result = evaluate(module, loader, device, precision)
        return result if self.is_main else None

    def full_state(self, state: dict) -> dict | None:
        """The whole model: every split tensor gathered (a collective of each group)."""
        whole = {name: _whole(value) for name, value in state.items()}
        return whole if self.is_main else None

    def load_model(self, module: nn.Module, state: dict) -> None:
        mine = module.state_dict()
        module.load_state_dict({name: _like(mine[name], state[name]) for name in mine})

    def optimizer_state(self, optimizer: torch.optim.Optimizer):
        saved = optimizer.state_dict()
        saved["state"] = {
            index: {key: _whole(value) for key, value in entry.items()}
            for index, entry in saved["state"].items()
        }
        return saved if self.is_main else None

    def load_optimizer(self, optimizer: torch.optim.Optimizer, saved) -> None:
        if saved is None:
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        state = {}
        for index, entry in saved["state"].items():
            param = params[int(index)]
            state[index] = {
                key: _like(param, value) if _same_shape(param, value) else value
                for key, value in entry.items()
            }
        optimizer.load_state_dict({**saved, "state": state})

    def extra_state(self) -> dict:
        return {"tensor_plan": self.plan.to_dict()}

    # ---- the record

    def describe(self) -> dict:
        return {
            "tensor": {
                **self.plan.to_dict(),
                "data_parallel": self.replicas,
                "batch_size": self.spec.batch_size,
            }
        }

    def worker_extras(self) -> dict:
        return {
            "role": "shard",
            "replica": self.replica,
            "shard": self.shard,
            "comm_s": self.meter.seconds,
            "replica_sync_s": self.sync_s,
        }

    def sections(self, summaries: list[dict | None]) -> dict[str, dict]:
        return {"tensor": tensor_section(self, summaries)}


def _eval_forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        model.train(was_training)
    return getattr(out, "logits", out).float()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _whole(value):
    return value.full_tensor().detach() if isinstance(value, DTensor) else value


def _same_shape(param: torch.Tensor, value) -> bool:
    return isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(param.shape)


def _like(target: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
    """`whole` cut as `target` is cut (each trainer keeps its own part; nothing moves)."""
    if not isinstance(target, DTensor):
        return whole
    return distribute_tensor(
        whole.to(target.device), target.device_mesh, target.placements, src_data_rank=None
    )
