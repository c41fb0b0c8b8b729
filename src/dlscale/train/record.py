"""The run record (run.json, schema dlscale.run/1): what ran, where, how fast, how well."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from dlscale.models import count_parameters
from dlscale.train import checkpoint as ckpt
from dlscale.train.device import peak_memory
from dlscale.train.distributed import bytes_sent_per_worker

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
