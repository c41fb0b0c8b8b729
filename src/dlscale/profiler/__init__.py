"""Profiler: trace a training step on the meta device, then predict it on real hardware."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from dlscale.errors import UserError, one_line
from dlscale.hardware.device import Hardware
from dlscale.models.registry import user_code_failure
from dlscale.profiler.advice import Verdict, verdict
from dlscale.profiler.memory import TrainingMemory, training_memory
from dlscale.profiler.recorder import ModuleFailure, OpFailure
from dlscale.profiler.roofline import Prediction, predict
from dlscale.profiler.target import Workload
from dlscale.profiler.trace import StepTrace, trace_step
from dlscale.train.step import build_optimizer


@dataclass
class HardwareReport:
    hardware: Hardware
    prediction: Prediction
    verdict: Verdict


@dataclass
class ProfileResult:
    workload: Workload
    trace: StepTrace
    memory: TrainingMemory
    reports: list[HardwareReport]
    profile_s: float
    scaling: list = field(default_factory=list)  # ScalingReport per device, with --devices
    # Devices --devices left out, each with why (an entry with no interconnect or host link)
    scaling_skipped: dict[str, str] = field(default_factory=dict)
    systolic: list = field(default_factory=list)  # SystolicReport per chip, with --dataflow
    inference: list = field(default_factory=list)  # InferenceRow per device, with --inference


def trace_workload(workload: Workload) -> StepTrace:
    """Trace one step; a model that cannot be traced is one clear line naming the op and the
    module that failed, or why its data-dependent control flow cannot be traced."""
    try:
        try:
            return _trace(workload, fake=False)
        except OpFailure as failure:
            if not failure.data_dependent:
                raise
            # Libraries that check values skip the check for fake tensors (torch.compile's)
            return _trace(workload, fake=True)
    except UserError:  # the factory's own failure, already one line
        raise
    except OpFailure as failure:
        raise UserError(_op_failure(workload, failure)) from None
    except ModuleFailure as failure:
        if isinstance(failure.error, RuntimeError | ValueError | IndexError | TypeError):
            raise UserError(
                f"{_what(workload)}: in '{failure.module}' ({failure.module_type}): "
                f"{type(failure.error).__name__}: {one_line(failure.error)}"
            ) from None
        raise UserError(
            f"model '{workload.model_name}' failed on the meta device in '{failure.module}' "
            f"({failure.module_type}): {user_code_failure(failure.error)}"
        ) from None
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        raise UserError(f"{_what(workload)}: {one_line(exc)}") from None
    except (Exception, SystemExit) as exc:  # a defect in the user's code: name it, and where
        raise UserError(
            f"model '{workload.model_name}' failed on the meta device: {user_code_failure(exc)}"
        ) from None


def _trace(workload: Workload, fake: bool) -> StepTrace:
    return trace_step(
        workload.build,
        workload.sample,
        workload.batch_size,
        workload.precision,
        lambda params: build_optimizer(params, workload.optimizer),
        workload.optimizer.name,
        inputs=workload.inputs,
        inputs_label=workload.inputs_label,
        fake=fake,
    )


def _what(workload: Workload) -> str:
    if workload.inputs is not None:
        return f"model '{workload.model_name}' cannot take the inputs of {workload.inputs_label}"
    shape = tuple(workload.sample.shape)
    return f"model '{workload.model_name}' cannot take samples of shape {shape}"


def _op_failure(workload: Workload, failure: OpFailure) -> str:
    where = f"in '{failure.module}' ({failure.module_type})" + (
        ", backward" if failure.phase == "backward" else ""
    )
    if failure.data_dependent:
        return (
            f"model '{workload.model_name}' cannot be traced: {where}, aten.{failure.op} needs "
            "the values of the data (a Python branch on a tensor, .item(), .tolist() or "
            "nonzero), and the profiler runs on shapes alone, never computing values; make "
            "the branch depend on shapes, or time real steps with 'dlscale estimate SPEC'"
        )
    return f"{_what(workload)}: aten.{failure.op} failed {where}: {one_line(failure.error)}"


def profile(workload: Workload, hardware: list[Hardware]) -> ProfileResult:
    start = time.perf_counter()
    trace = trace_workload(workload)
    memory = training_memory(trace)
    reports = []
    for device in hardware:
        prediction = predict(
            trace,
            device,
            workload.dataset_size,
            workload.pinned,
            workload.accumulate,
            workload.fresh_pages,
        )
        reports.append(
            HardwareReport(
                device,
                prediction,
                verdict(
                    memory,
                    prediction,
                    device,
                    trace.module_types,
                    workload.dataset_bytes,
                    workload.data_from_disk,
                    workload.precision,
                    workload.accumulate,
                ),
            )
        )
    return ProfileResult(workload, trace, memory, reports, time.perf_counter() - start)


__all__ = ["HardwareReport", "ProfileResult", "Workload", "profile", "trace_workload"]
