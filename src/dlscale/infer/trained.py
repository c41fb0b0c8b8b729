"""A trained model on disk: a run folder or one of its checkpoints, read back as the facts of
its run record (model, data layout, preprocessing) and the weights of its newest checkpoint."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.data.pixels import ImageLayout
from dlscale.errors import UserError, one_line
from dlscale.jobspec import parse_spec
from dlscale.train import checkpoint as ckpt
from dlscale.train.record import RUN_RECORD
from dlscale.train.spec_change import bookkeeping_only, written_by


@dataclass(frozen=True)
class TrainedModel:
    """What a predictor is rebuilt from; every field is read from the run, none from the user."""

    run_dir: Path | None  # None: a checkpoint on its own, which carries its model's spec
    checkpoint: Path
    step: int
    model_name: str
    model_kwargs: dict[str, Any]
    data_spec: dict[str, Any]  # the run's `data` section as run.json holds it
    input_shape: tuple[int, ...]  # one sample, without the batch dimension
    num_classes: int  # classes, or the vocabulary for language modelling
    task: str  # "classification" or "language_modeling"
    vocab_size: int | None  # token inputs only
    precision: str  # what it trained (and validated) at
    val_accuracy: float | None  # the run's final validation accuracy, as recorded
    val_step: int | None  # the step it was measured at
    weights: dict[str, Any]  # the model's state dict

    @property
    def input_kind(self) -> str:
        """ "tokens" (int64 ids), "image" (C, H, W floats in [0, 1]) or "features" (floats)."""
        if self.vocab_size is not None:
            return "tokens"
        return "image" if len(self.input_shape) == 3 else "features"

    def image_layout(self) -> ImageLayout:
        """How an image file becomes this model's input: the run's channels (grey `L` for one,
        else RGB) and size; resized only where the run resized its own images (`image_size`)."""
        if self.input_kind != "image":
            raise UserError(
                f"model '{self.model_name}' of {self.checkpoint} takes {self.input_kind} of shape "
                f"{self.input_shape}, not images"
            )
        channels, height, width = self.input_shape
        mode = "L" if channels == 1 else "RGB"
        return ImageLayout(mode, height, width, resize=self.data_spec.get("image_size") is not None)

    def model_defaults(self) -> dict[str, int]:
        """The factory arguments the data implied when the run built its model (as
        `DataBundle.model_defaults` gave them), from the record instead of the data."""
        defaults = {"num_classes": self.num_classes}
        if self.vocab_size is not None:
            defaults.update(vocab_size=self.vocab_size, context_length=self.input_shape[0])
        else:
            size = 1
            for extent in self.input_shape:
                size *= extent
            defaults.update(in_channels=self.input_shape[0], input_size=size)
        return defaults


def locate(path: str | Path) -> tuple[Path | None, Path]:
    """(run folder, checkpoint) for a run folder (its newest checkpoint) or a checkpoint file:
    inside its run (runs/<run>/checkpoints/step-N.pt, with run.json two folders up) or on its
    own (run folder None: the checkpoint must say how to rebuild its model)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such run folder or checkpoint")
    if path.is_dir():
        if not (path / RUN_RECORD).is_file():
            raise UserError(f"{path}: not a run folder (no {RUN_RECORD}); pass a run's folder")
        newest = ckpt.latest_checkpoint(path)
        if newest is None:
            raise UserError(f"{path}: the run saved no checkpoint, so it has no model to use")
        return path, newest
    run_dir = path.resolve().parent.parent
    return (run_dir if (run_dir / RUN_RECORD).is_file() else None), path


def read_record(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read the run record ({one_line(exc)})") from None
    if not isinstance(record, dict) or not {"spec", "data", "spec_hash"} <= record.keys():
        raise UserError(f"{path}: not a dlscale run record (no spec, data or spec_hash)")
    return record


def model_source(run_dir: Path | None, checkpoint: Path, state: dict) -> dict[str, Any]:
    """The spec and data layout the model is rebuilt from: the run's record, else what the
    checkpoint itself carries (`model_source`, written by the training loop)."""
    if run_dir is None:
        carried = state.get("model_source")
        if not isinstance(carried, dict):
            raise UserError(
                f"{checkpoint}: a checkpoint away from its run's {RUN_RECORD}, and written "
                "before checkpoints carried their model's spec: pass the run folder, or put the "
                "checkpoint back in its run's checkpoints/ folder"
            )
        return {**carried, "final": {}}
    record = read_record(run_dir)
    if state.get("spec_hash") != record["spec_hash"] and not same_model(state, record, run_dir):
        raise UserError(
            f"{checkpoint} was written by another spec (hash {state.get('spec_hash')}) than "
            f"the run at {run_dir} (hash {record['spec_hash']}): its weights do not fit that model"
        )
    return record


def same_model(state: dict, record: dict, run_dir: Path) -> bool:
    """A checkpoint of an earlier spec of this run that differs from the record's only in
    checkpoint bookkeeping (a --resume may change that): the same model."""
    earlier = written_by(state, run_dir)
    try:
        current = parse_spec(record["spec"])
    except (UserError, KeyError, TypeError, ValueError):
        return False
    return earlier is not None and bookkeeping_only(earlier, current) is None


def validated_at(source: dict, final: dict) -> int | None:
    """The step the run's recorded accuracy was measured at: the end of its last validated
    epoch (an interrupted run's `final.step` is its newest checkpoint's, past it)."""
    if final.get("val_accuracy") is None:
        return None
    epochs = source.get("epochs")
    validated = [
        entry.get("step")
        for entry in (epochs if isinstance(epochs, list) else [])
        if isinstance(entry, dict) and entry.get("val_accuracy") is not None
    ]
    step = validated[-1] if validated else final.get("step")
    return step if isinstance(step, int) else None


def load_trained(path: str | Path) -> TrainedModel:
    """The run (or checkpoint) at `path`; weights loaded with `weights_only=True` and checked
    against their digest and against the run's spec."""
    run_dir, checkpoint = locate(path)
    state = ckpt.load_checkpoint(checkpoint)
    if not isinstance(state.get("model"), dict):
        raise UserError(f"{checkpoint}: holds no model weights")
    source = model_source(run_dir, checkpoint, state)
    spec, data = source["spec"], source["data"]
    final = source.get("final") or {}
    vocab_size = data.get("vocab_size")
    if vocab_size is None and data["task"] == "language_modeling":
        vocab_size = data["num_classes"]  # records before vocab_size: the vocabulary is the classes
    return TrainedModel(
        run_dir=run_dir,
        checkpoint=checkpoint,
        step=int(state.get("step", 0)),
        model_name=spec["model"]["name"],
        model_kwargs=dict(spec["model"].get("kwargs") or {}),
        data_spec=dict(spec["data"]),
        input_shape=tuple(data["input_shape"]),
        num_classes=int(data["num_classes"]),
        task=data["task"],
        vocab_size=vocab_size,
        precision=spec.get("precision", "fp32"),
        val_accuracy=final.get("val_accuracy"),
        val_step=validated_at(source, final),
        weights=state["model"],
    )
