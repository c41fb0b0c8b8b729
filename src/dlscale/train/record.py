"""The run record (run.json, schema dlscale.run/1): what ran, where, how fast, how well."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import torch

from dlscale.models import count_parameters
from dlscale.train import checkpoint as ckpt
from dlscale.train.device import peak_memory
from dlscale.train.distributed import bytes_sent_per_worker
from dlscale.train.env import environment
from dlscale.train.metrics import TimingTotals

if TYPE_CHECKING:
    from dlscale.train.loop import Trainer

RUN_SCHEMA = "dlscale.run/1"


def run_record(trainer: Trainer, status: str) -> dict:
    spec, timing = trainer.spec, trainer.timing
    peak_bytes, peak_kind = peak_memory(trainer.device)
    last = trainer.epochs_log[-1] if trainer.epochs_log else {}
    per_worker = timing.samples / trainer.train_wall_s if trainer.train_wall_s > 0 else 0.0
    record = {
        "schema": RUN_SCHEMA,
        "status": status,
        "name": spec.name,
        "run_dir": str(trainer.run_dir),
        "spec_hash": spec.spec_hash(),
        "spec": spec.model_dump(mode="json"),
        "started_at": trainer.started_at,
        "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "resumed_from_step": trainer.resumed_from,
        "environment": trainer.environment,
        "model": {
            "name": spec.model.name,
            "parameters": count_parameters(trainer.module),
            "trainable_parameters": count_parameters(trainer.module, trainable_only=True),
        },
        "data": {
            "train_samples": trainer.data.num_train,
            "val_samples": len(trainer.data.val),
            "input_shape": list(trainer.data.input_shape),
            "num_classes": trainer.data.num_classes,
            "task": trainer.data.task,
        },
        "plan": dict(trainer.plan.__dict__),
        "timing": timing.summary(),
        "epochs": trainer.epochs_log,
        "steps": trainer.steps_log.records,
        "warnings": trainer.warnings,
        "checkpoints": [str(p) for _, p in ckpt.list_checkpoints(trainer.run_dir)],
        "final": {
            "step": trainer.step,
            "val_accuracy": last.get("val_accuracy"),
            "val_loss": last.get("val_loss"),
            "train_loss": last.get("train_loss"),
            # All workers together: each trains its share of every global batch in lockstep.
            "train_samples_per_s": per_worker * trainer.world_size,
            "per_worker_samples_per_s": per_worker,
            "wall_s": time.perf_counter() - trainer.t_start,
            "setup_s": trainer.setup_s,
            "first_step_at_unix": trainer.first_step_at,
            "peak_memory_bytes": peak_bytes,
            "peak_memory_kind": peak_kind,
        },
    }
    if trainer.world_size > 1:
        record["distributed"] = distributed_summary(trainer)
        record["workers"] = trainer.workers
    return record


def distributed_summary(trainer: Trainer) -> dict:
    timing = trainer.timing
    steps = max(1, timing.steps)
    payload = timing.comm_payload_bytes / steps
    return {
        "workers": trainer.world_size,
        "backend": _backend(),
        "per_worker_batch_size": trainer.spec.batch_size,
        "global_batch_size": trainer.plan.global_batch_size,
        "allreduce_s_per_step": timing.comm_s / steps,
        "allreduce_share": timing.comm_s / timing.step_s if timing.step_s else 0.0,
        "allreduce_payload_bytes_per_step": payload,
        "bytes_sent_per_worker_per_step": bytes_sent_per_worker(payload, trainer.world_size),
    }


def _backend() -> str | None:
    import torch.distributed as dist

    return dist.get_backend() if dist.is_initialized() else None


def process_group_record(
    spec,
    run_dir,
    model,
    data,
    plan,
    main: dict,
    warnings: list[str],
    final: tuple[float, float, int],
    started_at: str,
    wall_s: float,
    throughput: tuple[int, float, int],
    peak_memory_bytes: int,
    resumed_from_step: int | None = None,
) -> dict:
    """run.json for strategies whose processes each return a summary to the parent (ps,
    pipeline, hybrid): the common schema. `main` is the reporting process's summary (`timing`,
    `epochs`, `setup_s`); `final` is (val_loss, val_acc, step) of the assembled model;
    `throughput` is (samples trained, training wall seconds, parallel trainers)."""
    val_loss, val_acc, step = final
    samples, train_wall, trainers = throughput
    epochs = main["epochs"]
    train_losses = [e["train_loss"] for e in epochs if e["train_loss"] is not None]
    rate = samples / train_wall if train_wall else 0.0
    return {
        "schema": RUN_SCHEMA,
        "status": "completed",
        "name": spec.name,
        "run_dir": str(run_dir),
        "spec_hash": spec.spec_hash(),
        "spec": spec.model_dump(mode="json"),
        "started_at": started_at,
        "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "resumed_from_step": resumed_from_step,
        "environment": environment(torch.device("cpu")),
        "model": {
            "name": spec.model.name,
            "parameters": count_parameters(model),
            "trainable_parameters": count_parameters(model, trainable_only=True),
        },
        "data": {
            "train_samples": data.num_train,
            "val_samples": len(data.val),
            "input_shape": list(data.input_shape),
            "num_classes": data.num_classes,
            "task": data.task,
        },
        "plan": dict(plan.__dict__),
        "timing": TimingTotals.from_state(main["timing"]).summary(),
        "epochs": epochs,
        "steps": [],
        "warnings": warnings,
        "checkpoints": [str(p) for _, p in ckpt.list_checkpoints(run_dir)],
        "final": {
            "step": step,
            "val_accuracy": val_acc,
            "val_loss": val_loss,
            "train_loss": train_losses[-1] if train_losses else None,
            "train_samples_per_s": rate,
            "per_worker_samples_per_s": rate / trainers,
            "wall_s": wall_s,
            "setup_s": main["setup_s"],
            "first_step_at_unix": None,
            "peak_memory_bytes": peak_memory_bytes,
            "peak_memory_kind": "host_peak_rss",
        },
        "time_to_accuracy": [
            {"elapsed_s": e["elapsed_s"], "epoch": e["epoch"], "val_accuracy": e["val_accuracy"]}
            for e in epochs
        ],
    }
