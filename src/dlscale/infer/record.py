"""A prediction run's result (schema dlscale.predict/1), typed: what `api.inference.predict`
returns, `dlscale predict --json` prints and `--out FILE.json` holds.

`PredictResult` is built from the figures infer/predict.py gathers; `to_json()` is the document,
key for key, and `PredictResult.model_validate` checks one read back.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PREDICT_SCHEMA = "dlscale.predict/1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputSource(_Strict):
    """One input path as given, the kind it was read as, and its samples."""

    path: str
    kind: Literal["images", "npz", "tokens", "webdataset", "hf"]
    samples: int


class PredictedRow(_Strict):
    """One sample: its class (a language model's: the token after its sequence), that class's
    softmax probability, and its label where the input carries one."""

    input: str  # an image file, NPZ[index], TEXT@offset, SHARDS#index, or a data set's row
    predicted: int
    confidence: float
    label: int | None


class PredictResult(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: str = Field(PREDICT_SCHEMA, alias="schema")
    run_dir: str | None  # None: a checkpoint on its own
    checkpoint: str
    step: int
    model: str
    task: str
    device: str
    precision: Literal["fp32", "bf16", "int8"]
    batch_size: int
    inputs: list[InputSource]
    samples: int
    labelled: bool  # every input carries labels
    # Over the labelled inputs, counted as training's validation counts (per sample, or per
    # token); None where none had labels.
    correct: int | None
    counted: int | None
    accuracy: float | None
    run_val_accuracy: float | None  # the run's own final validation accuracy, as recorded
    run_val_step: int | None = None  # the step it was measured at (`step` may be earlier)
    # What the run trained and validated at: under bf16 autocast a close sample may fall
    # otherwise than at predict's fp32.
    run_precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    rows: list[PredictedRow]
    out: str | None = None  # the file it was also written to (absent from that file itself)

    def to_json(self) -> dict:
        absent = {"out"} if self.out is None else set()
        return self.model_dump(mode="json", by_alias=True, exclude=absent)
