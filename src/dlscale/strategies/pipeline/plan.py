"""Planning a pipeline before any process starts: the microbatch size, the split (from a
traced step), torch's tracer cutting the model, and the parameters tied across stages."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from dlscale.errors import CannotTrace, UserError, one_line
from dlscale.hardware.catalogue import load_catalogue
from dlscale.hardware.device import Hardware
from dlscale.hardware.trust import unreliable
from dlscale.jobspec import PipelineStrategy, Spec
from dlscale.models import build_model
from dlscale.models.registry import user_code_failure
from dlscale.profiler.pipeline_split import SplitPlan, plan_split
from dlscale.profiler.trace import trace_step
from dlscale.train.preflight import needs_real_tensors
from dlscale.train.step import build_optimizer


def predicted_bubble(stages: int, microbatches: int, schedule: str = "gpipe") -> float:
    """Idle share of a GPipe or 1F1B step: (S − 1) / (M + S − 1) (Huang et al., 2019); 2bw
    does not flush between steps, so none in steady state (slots.py counts its fill)."""
    if schedule == "2bw":
        return 0.0
    return (stages - 1) / (microbatches + stages - 1)


def microbatch_size(spec: Spec) -> int:
    strategy: PipelineStrategy = spec.strategy
    micro = strategy.microbatches_run
    if spec.batch_size % micro:
        raise UserError(
            f"batch_size {spec.batch_size} does not split into {micro} equal microbatches"
        )
    return spec.batch_size // micro


def plan_stages(spec: Spec, model: nn.Module, data, split: str | list[str]) -> SplitPlan:
    """The split, from a step traced at one microbatch on the meta device: balanced by the time
    predicted on `local` when this machine was measured (`dlscale bench machine`), else FLOPs.
    `split` is the spec's, or the boundaries a checkpoint recorded."""
    strategy: PipelineStrategy = spec.strategy
    micro = microbatch_size(spec)
    sample = data.example(1)[0][0]
    try:
        trace = trace_step(
            lambda: build_model(spec.model.name, spec.model.kwargs, data.model_defaults()),
            sample,
            micro,
            "fp32",
            lambda params: build_optimizer(params, spec.optimizer),
            spec.optimizer.name,
        )
    except UserError as exc:  # the factory's own failure, already one line
        failure = exc.__cause__ or exc.__context__
        # Only torch's own words for the meta device: a factory's NotImplementedError, or one
        # about a missing file, is its own failure, said as it is.
        if failure is None or "meta" not in str(failure).lower():
            raise
        raise cannot_trace(spec, failure) from None
    except (RuntimeError, ValueError, IndexError, TypeError, NotImplementedError) as exc:
        if needs_real_tensors(exc):
            raise cannot_trace(spec, exc) from None
        raise UserError(
            f"model '{spec.model.name}' cannot take samples of shape {tuple(sample.shape)}: "
            f"{one_line(exc)}"
        ) from None
    except (Exception, SystemExit) as exc:  # a defect in the user's code: name it, and where
        raise UserError(
            f"model '{spec.model.name}' failed on the meta device: {user_code_failure(exc)}"
        ) from None
    return plan_split(
        model,
        trace,
        strategy.stages,
        strategy.schedule,
        strategy.microbatches_run,
        split,
        local_calibration(),
        strategy.max_memory_per_worker,
    )


def cannot_trace(spec: Spec, exc: BaseException) -> CannotTrace:
    """The one line for a model whose factory or forward cannot run on the meta device."""
    return CannotTrace(
        f"model '{spec.model.name}' cannot be traced on the meta device to place its "
        f"pipeline stages ({one_line(exc)}): its factory or forward reads a tensor's "
        "values (e.g. `if x.sum() > 0`) or uses an op with no meta kernel; a pipeline "
        "needs a model whose steps do not depend on the data (single, ddp and ps train "
        "it as it is)"
    )


def local_calibration() -> Hardware | None:
    """The `local` entry to balance stages by time on, or None (balanced by FLOPs) when there is
    none or its measurement is unreliable: a busy machine's per-op cost once split LeNet as
    conv1 alone against everything else."""
    local = load_catalogue().get("local")
    return local if local is not None and not unreliable(local.measured) else None


def split_model(model: nn.Module, example: torch.Tensor, boundaries: list[str]):
    """torch's pipeline frontend: trace `model` on one microbatch and cut it at `boundaries`."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    try:
        with warnings.catch_warnings():  # torch.export's deprecation chatter, not the user's
            warnings.simplefilter("ignore", FutureWarning)
            return pipeline(
                model,
                mb_args=(example,),
                split_spec=dict.fromkeys(boundaries, SplitPoint.BEGINNING),
            )
    except Exception as exc:  # torch.export's many error types: one line for the user
        message = f"the model cannot be split into pipeline stages: {one_line(exc)}"
        raise UserError(message) from None


def tied_groups(model: nn.Module) -> list[set[str]]:
    """Names that refer to one parameter (GPT's tied embedding and head)."""
    by_tensor: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(param), []).append(name)
    return [set(names) for names in by_tensor.values() if len(names) > 1]
