"""One run of a sweep, in its own process (a pool task): train the run's spec with its strategy,
resuming from the run folder's last checkpoint if an interrupted sweep left one, and hand back
the figures the sweep ranks by. Ensemble members also save their validation predictions."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import torch

from dlscale.atomic import write_atomic
from dlscale.data import build_data
from dlscale.data.cache import keep_loaded
from dlscale.jobspec import Spec, parse_spec
from dlscale.launch.base import WorkerContext
from dlscale.models import build_model
from dlscale.strategies import STRATEGIES
from dlscale.strategies.events import EventReporter
from dlscale.train import checkpoint as ckpt
from dlscale.train.device import resolve_device
from dlscale.train.faults import ending_recorded
from dlscale.train.ownership import claim
from dlscale.train.resume_point import resume_point
from dlscale.train.score import predict

PREDICTIONS = "predictions.pt"
CURVE_KEYS = ("epoch", "step", "val_accuracy", "val_loss", "train_loss", "elapsed_s")


def run_trial(context: WorkerContext, job: dict[str, Any]) -> dict[str, Any]:
    """Train `job["raw"]` into `job["run_dir"]`; its final figures and epoch curve."""
    keep_loaded()  # this slot's next trials find the data this one reads (data/cache.py)
    spec = parse_spec(job["raw"], base_dir=Path(job["base_dir"]), source=job["source"])
    run_dir = Path(job["run_dir"])
    from dlscale.launch.local import LocalLauncher  # a trial's own workers run beside it

    reporter = EventReporter(context)
    # The trial's folder is its own while it trains, as a `train --out` folder is: a `train
    # --resume` into it is refused. The sweep's folder above it is its sweep's.
    with claim(run_dir, within=job.get("sweep_dir")):
        resume_from = None
        if ckpt.list_checkpoints(run_dir):  # left by an interrupted sweep; a broken one is skipped
            resume_from, skipped = resume_point(run_dir)
            for message in skipped:
                reporter.warn(message)
        run = STRATEGIES[spec.strategy.name]
        with ending_recorded(run_dir):  # a pruned or failed trial's record says so
            record = run(spec, run_dir, resume_from, reporter, LocalLauncher())
        if job.get("predict"):
            save_predictions(spec, run_dir)
    final = record["final"]
    return {
        "val_accuracy": final["val_accuracy"],
        "val_loss": final["val_loss"],
        "steps": final["step"],
        "wall_s": final["wall_s"],
        "samples_per_s": final["train_samples_per_s"],
        "setup_s": final["setup_s"],  # data and model ready, before the first step
        "global_batch_size": record["plan"]["global_batch_size"],
        "node": context.node,
        "host": context.host or socket.gethostname(),
        "pid": os.getpid(),  # the slot process (or Ray actor) that ran it
        "curve": [{key: point.get(key) for key in CURVE_KEYS} for point in record["epochs"]],
        "warnings": record.get("warnings", []),
    }


def save_predictions(spec: Spec, run_dir: Path) -> Path:
    """The trained model's class probabilities on its validation set, from its last checkpoint."""
    data = build_data(spec.data, spec.seed)
    model = build_model(spec.model.name, spec.model.kwargs, data.model_defaults())
    state = ckpt.load_checkpoint(ckpt.latest_checkpoint(run_dir))
    model.load_state_dict(state["model"])
    device = resolve_device(spec.device)
    loader = torch.utils.data.DataLoader(data.val, batch_size=max(256, spec.batch_size))
    probabilities, labels = predict(model.to(device), loader, device, spec.precision)
    path = run_dir / PREDICTIONS
    payload = {"probabilities": probabilities, "labels": labels}
    write_atomic(path, lambda handle: torch.save(payload, handle))
    return path


def load_predictions(run_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    state = torch.load(Path(run_dir) / PREDICTIONS, weights_only=True)
    return state["probabilities"], state["labels"]
