"""The run record (run.json, schema dlscale.run/2): one schema for every strategy.

`RunRecord` is the schema: the same keys in `final`, `timing`, `epochs`, `steps` and `workers`
whatever the strategy, and a strategy's own section beside them (`distributed` for ddp, `ps`,
`pipeline`, `tensor`). The loop builds it from plain figures; `RunRecord.model_validate` checks any
run.json against it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

RUN_SCHEMA = "dlscale.run/2"
RUN_RECORD = "run.json"  # the record's file in a run folder


def recorded(run_dir: str | Path) -> dict | None:
    """The run's record as its run.json holds it, or None where there is none, or it cannot be
    read or is not a mapping (a stopped run's, a torn file, a user's own)."""
    try:
        record = json.loads((Path(run_dir) / RUN_RECORD).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return record if isinstance(record, dict) else None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelInfo(_Strict):
    name: str
    parameters: int
    trainable_parameters: int


class DataInfo(_Strict):
    train_samples: int
    val_samples: int
    input_shape: list[int]
    num_classes: int
    task: str
    vocab_size: int | None = None  # token inputs: the embedding's rows (what predict rebuilds)
    source: str  # the data kind: digits, npz, webdataset, ...
    read_from_disk: bool  # read while training (hf, webdataset, images), not held in memory
    streamed: bool  # read front to back through a shuffle buffer (webdataset)
    staging: dict[str, Any] | None = None  # copying the files to local disk first (data.stage)


class PlanInfo(_Strict):
    steps_per_epoch: int
    total_steps: int
    epochs: int
    batch_size: int
    global_batch_size: int
    accumulate: int = 1  # micro-batches of batch_size per optimizer step (older runs: 1)


class Timing(_Strict):
    """The main trainer's step time, split; `*_share` are fractions of `step_s`."""

    steps: int
    samples: int
    data_wait_s: float
    h2d_s: float
    compute_s: float
    comm_wait_s: float
    step_s: float
    data_wait_share: float
    h2d_share: float
    compute_share: float
    comm_wait_share: float
    steady_data_wait_share: float
    warmup_steps: int
    warmup_s: float
    steady_steps: int
    median_step_s: float | None
    samples_per_s: float
    comm_s: float
    comm_share: float
    comm_payload_bytes_per_step: float
    # Read from disk: per-sample reading and decoding seconds (summed over loader workers).
    read_s_per_sample: float | None = None
    decode_s_per_sample: float | None = None
    read_bytes: int | None = None
    bad_samples: int | None = None


class Epoch(_Strict):
    epoch: int
    step: int
    train_loss: float | None
    val_loss: float | None
    val_accuracy: float | None
    samples_per_s: float
    elapsed_s: float


class Step(_Strict):
    step: int
    epoch: int
    loss: float | None
    data_wait_s: float
    h2d_s: float
    compute_s: float
    comm_wait_s: float
    step_s: float


class Final(_Strict):
    step: int
    val_accuracy: float | None
    val_loss: float | None
    train_loss: float | None
    train_samples_per_s: float  # every data-parallel worker together, after warm-up
    per_worker_samples_per_s: float
    median_step_s: float | None
    wall_s: float
    setup_s: float
    first_step_at_unix: float | None
    peak_memory_bytes: int
    peak_memory_kind: str


class Worker(BaseModel):
    """One trainer: the common figures, then its strategy's own (extra keys allowed)."""

    model_config = ConfigDict(extra="allow")

    rank: int
    status: Literal["completed", "died"]
    node: str | None = None
    steps: int | None = None
    samples: int | None = None
    samples_per_s: float | None = None


class RunRecord(_Strict):
    schema_: str = Field(RUN_SCHEMA, alias="schema")
    status: Literal["running", "completed", "failed", "interrupted"]
    error: str | None = None  # why a failed or interrupted run ended, in one line
    name: str
    strategy: str
    run_dir: str
    spec_hash: str
    spec: dict[str, Any]
    started_at: str
    updated_at: str
    resumed_from_step: int | None
    environment: dict[str, Any]
    model: ModelInfo
    data: DataInfo
    plan: PlanInfo
    timing: Timing
    epochs: list[Epoch]
    steps: list[Step]
    warnings: list[str]
    checkpoints: list[str]
    final: Final
    workers: list[Worker]
    distributed: dict[str, Any] | None = None  # ddp
    ps: dict[str, Any] | None = None
    pipeline: dict[str, Any] | None = None  # pipeline and hybrid
    tensor: dict[str, Any] | None = None  # tensor parallel

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> dict:
        optional = ("error", "distributed", "ps", "pipeline", "tensor")
        absent = {key for key in optional if getattr(self, key) is None}
        record = self.model_dump(mode="json", by_alias=True, exclude=absent | {"workers"})
        # A worker that died has only its rank and status.
        record["workers"] = [w.model_dump(mode="json", exclude_unset=True) for w in self.workers]
        return record
