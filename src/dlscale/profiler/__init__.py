"""Profiler: trace a training step on the meta device, then predict it on real hardware."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from dlscale.errors import UserError, one_line
from dlscale.hardware.spec import Hardware
from dlscale.models.registry import user_code_failure
from dlscale.profiler.advice import Verdict, verdict
from dlscale.profiler.memory import TrainingMemory, training_memory
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


def trace_workload(workload: Workload) -> StepTrace:
    """Trace one step; a model that cannot take the sample's shape is one clear line."""
    try:
        return trace_step(
            workload.build,
            workload.sample,
            workload.batch_size,
            workload.precision,
            lambda params: build_optimizer(params, workload.optimizer),
            workload.optimizer.name,
        )
    except UserError:  # the factory's own failure, already one line
        raise
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        shape = tuple(workload.sample.shape)
        raise UserError(
            f"model '{workload.model_name}' cannot take samples of shape {shape}: {one_line(exc)}"
        ) from None
    except (Exception, SystemExit) as exc:  # a defect in the user's code: name it, and where
        raise UserError(
            f"model '{workload.model_name}' failed on the meta device: {user_code_failure(exc)}"
        ) from None


def profile(workload: Workload, hardware: list[Hardware]) -> ProfileResult:
    start = time.perf_counter()
    trace = trace_workload(workload)
    memory = training_memory(trace)
    reports = []
    for device in hardware:
        prediction = predict(trace, device, workload.dataset_size)
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
                ),
            )
        )
    return ProfileResult(workload, trace, memory, reports, time.perf_counter() - start)


__all__ = ["HardwareReport", "ProfileResult", "Workload", "profile", "trace_workload"]
