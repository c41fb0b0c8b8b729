"""What the parent of a multi-process strategy does around its launch: start the processes,
show their progress, and return the main trainer's run record with every warning in it."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from dlscale.atomic import write_json_atomic
from dlscale.data import build_data
from dlscale.errors import RunFailed, UserError
from dlscale.jobspec import Spec
from dlscale.launch.base import Launcher, Resources, WorkerFailed, WorkerFn, per_rank
from dlscale.models import build_model
from dlscale.strategies.events import default_launcher, forward_to
from dlscale.train.checkpoint import naming_intact
from dlscale.train.faults import record_end
from dlscale.train.ownership import claim_token
from dlscale.train.plan import Plan
from dlscale.train.reporter import NullReporter, Reporter


def launch(
    spec: Spec,
    run_dir: Path,
    resume_from: Path | None,
    reporter: Reporter | None,
    launcher: Launcher | None,
    fn: WorkerFn,
    resources: Resources | list[Resources],
    main_rank: int = 0,
    extra: dict | None = None,
    expendable: frozenset[int] = frozenset(),
    rename: Callable[[str], str] = str,
    own_gpu: bool = True,
    early_warnings: Sequence[str] = (),
) -> dict:
    """Run `fn` in `spec.strategy.processes` processes; the record of rank `main_rank`.

    The main trainer writes run.json, its warnings beginning with `early_warnings` (said before
    the run: they travel down in the payload). Warnings that only the parent hears (from the
    launcher, or from processes that do not write the record, such as a parameter server) may
    come after its last write (a worker left behind is named once the others have finished):
    they are added to the record's, and run.json is written again with them.

    `rename` turns the launcher's 'worker N' into the strategy's names. With `own_gpu`, every
    GPU process needs a GPU of its own (NCCL cannot share one).
    """
    launcher = default_launcher(launcher)
    processes = spec.strategy.processes
    if own_gpu and launcher.name == "local":
        check_gpus(spec, sum(1 for each in per_rank(resources, processes) if each.gpus))
    reporter = reporter or NullReporter()
    payload = {
        # What the user set, not every default: a worker's spec then knows which settings were
        # given and warns only about those (the same spec, so the same hash, either way).
        "spec": spec.model_dump(mode="json", exclude_unset=True),
        "run_dir": str(run_dir),
        "resume_from": str(resume_from) if resume_from else None,
        "early_warnings": list(early_warnings),  # the main trainer's record begins with them
        **(extra or {}),
    }
    heard: list[str] = []
    forward = forward_to(reporter)

    def handle(kind: str, args: tuple[Any, ...]) -> None:
        if kind == "warn":
            args = (rename(args[0]),)
            heard.append(args[0])
        forward(kind, args)

    try:
        results = launcher.run(
            fn,
            payload,
            processes,
            resources,
            spec.strategy.port,
            handle,
            expendable,
            spec.strategy.heartbeat_warn_s,
        )
    except WorkerFailed as exc:
        raise WorkerFailed(rename(str(exc))) from None
    except RunFailed as exc:  # its one line names the step: run.json says it too
        record_end(run_dir, "failed", str(exc))
        raise
    record = results[main_rank]
    missing = [message for message in heard if message not in record["warnings"]]
    if missing:
        record["warnings"] = record["warnings"] + missing
        with naming_intact(run_dir):
            write_json_atomic(Path(run_dir) / "run.json", record)
    reporter.finish(record)
    return record


def check_gpus(spec: Spec, needed: int) -> None:
    """One line, before anything starts, when this machine has fewer GPUs than processes."""
    if not needed:
        return
    visible = torch.cuda.device_count()
    if needed > visible:
        raise UserError(
            f"strategy '{spec.strategy.name}' runs {needed} processes on CUDA, each on a GPU of "
            f"its own (NCCL cannot share one between processes); {visible} visible here"
        )


def initial_model(spec: Spec, data_world: int | None = None, run_dir: Path | None = None):
    """The model every process starts from (same seed: same initial weights), and the data,
    staged for the run in `run_dir` where the spec stages it; with `data_world`, a batch too
    large for the data is one line here, before any process."""
    torch.manual_seed(spec.seed)
    run = claim_token(run_dir) if run_dir is not None else None
    data = build_data(spec.data, spec.seed, stage=True, run=run)
    if data_world is not None:
        Plan.of(spec, data.num_train, data_world)
    return build_model(spec.model.name, spec.model.kwargs, data.model_defaults()), data


def role_names(message: str, names: Callable[[int], str]) -> str:
    """The launcher numbers every process 'worker N'; strategies name them by role."""
    return re.sub(r"\bworker (\d+)", lambda match: names(int(match.group(1))), message)
