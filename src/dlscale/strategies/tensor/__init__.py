"""Strategy `tensor`: single layers split across devices (tensor parallelism), × data parallel.

The parent plans the split before any process starts (profiler/tensor_plan.py: `auto` from the
model's dataflow, the model's own `tp_plan`, or the spec's {module: style}) and shows it; each
of the degree × data_parallel processes then splits its copy of the model on a 2-D DeviceMesh
with torch's tensor-parallel API and runs the one training loop with a `TensorExchange`, so
devices (NCCL between GPUs), bf16/fp16, evaluation, checkpoints and resume come from the loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dlscale.errors import UserError
from dlscale.jobspec import Spec, TensorStrategy
from dlscale.launch.base import Launcher, Resources, WorkerContext
from dlscale.models import count_parameters
from dlscale.profiler.tensor_flow import record_flow
from dlscale.profiler.tensor_plan import TensorPlan, make_plan
from dlscale.strategies.parent import initial_model, launch, role_names
from dlscale.strategies.tensor.exchange import TensorExchange
from dlscale.strategies.worker import run_trainer
from dlscale.train import checkpoint as ckpt
from dlscale.train.device import resolve_device
from dlscale.train.plan import check_trainable
from dlscale.train.reporter import Reporter


def shard_process(context: WorkerContext, payload: dict) -> dict | None:
    return run_trainer(
        context, payload, lambda spec, device: TensorExchange(spec, context, payload, device)
    )


def plan_for(spec: Spec, model, data) -> TensorPlan:
    """The split of `model` for the spec's degree, from one sample's forward on the model's
    device (the meta device, for `check`); one line when nothing splits."""
    strategy: TensorStrategy = spec.strategy
    check_trainable(model, spec.model.name)  # planned in the parent, before any worker checks
    device = next(model.parameters()).device
    flow = record_flow(model, data.example(1)[0].to(device), spec.precision)
    plan = make_plan(
        flow,
        strategy.degree,
        strategy.plan,
        count_parameters(model),
        getattr(model, "tp_plan", None),
    )
    if not plan.layers:
        raise UserError(
            f"tensor plan: nothing in model '{spec.model.name}' splits over {strategy.degree} "
            "devices (no Linear pair or convolution whose features divide by the degree); "
            "use another degree, name the layers in strategy.plan, or another strategy"
        )
    return plan


def check(spec: Spec, meta_model, data) -> None:
    """What `run` refuses before any process starts, for `validate`: a plan that splits
    nothing (planned on the meta device: no memory). No model (its factory needs real
    tensors): `run` plans on the real one, so nothing is checked here."""
    if meta_model is not None:
        plan_for(spec, meta_model, data)


def run(
    spec: Spec,
    run_dir: Path,
    resume_from: Path | None,
    reporter: Reporter,
    launcher: Launcher | None = None,
    early_warnings: Sequence[str] = (),
) -> dict:
    """Plan the split, start degree × data_parallel processes; rank 0's record."""
    strategy: TensorStrategy = spec.strategy
    model, data = initial_model(spec, strategy.data_parallel, run_dir)
    saved = None
    if resume_from is not None:  # the plan the run began with
        saved = ckpt.load_checkpoint(resume_from).get("exchange", {}).get("tensor_plan")
    plan = TensorPlan.from_dict(saved) if saved else plan_for(spec, model, data)
    gpu = 1.0 if resolve_device(spec.device).type == "cuda" else 0.0
    degree = strategy.degree
    return launch(
        spec,
        run_dir,
        resume_from,
        reporter,
        launcher,
        shard_process,
        Resources(cpus=float(spec.threads or 1), gpus=gpu),
        extra={"tensor_plan": plan.to_dict()},
        rename=lambda text: role_names(
            text, lambda r: f"shard {r % degree} of replica {r // degree}"
        ),
        own_gpu=strategy.backend != "gloo",
        early_warnings=early_warnings,
    )
