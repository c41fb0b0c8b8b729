"""How many trials of a sweep run at once: what one trial takes (cores, GPUs) and how many such
slots the launcher has free."""

from __future__ import annotations

from dlscale.errors import UserError
from dlscale.jobspec import Spec
from dlscale.launch.base import Launcher, Resources
from dlscale.sweep.space import run_units
from dlscale.train.device import resolve_device


def trial_slots(
    spec: Spec, checked: list[Spec], parallel: int | None, launcher: Launcher
) -> tuple[int, Resources, str | None]:
    """Trials at once for the sweep of `spec` (its trials' specs `checked`), at most `parallel`:
    the count, what each slot is given, and a warning when fewer than `parallel` fit."""
    processes = max(run.strategy.processes for run in checked)
    gpus = float(max(gpus_of(run) for run in checked))
    resources = Resources(cpus=float(processes), gpus=gpus)
    capacity = launcher.capacity(resources)
    if capacity < 1:
        need = f"{processes} core(s)" + (f" and {gpus:g} GPU(s)" if gpus else "")
        raise UserError(f"one trial needs {need}; {launcher.name} does not have that many free")
    total_runs = spec.sweep.trials * len(run_units(spec.sweep))
    slots = min(parallel or capacity, capacity, total_runs)
    warning = None
    if parallel is not None and parallel > capacity:
        warning = (
            f"--parallel {parallel}: {capacity} trial(s) of {processes} process(es) fit "
            f"({launcher.name}); running {capacity} at a time"
        )
    return slots, resources, warning


def gpus_of(spec: Spec) -> int:
    """GPUs one run of `spec` takes: one per trainer process when it runs on CUDA (a parameter
    server holds its shard in host memory)."""
    return spec.strategy.trainers if resolve_device(spec.device).type == "cuda" else 0
