"""The verbs that use a trained model: `load_predictor` (a run or checkpoint, ready for
batches) and `predict` (a run over files of inputs, with the accuracy where they carry labels).

Contract of `load_predictor(run_or_checkpoint, device="auto", precision="fp32") -> Predictor`
(what `dlscale predict` and `dlscale serve-model` both build on; kept stable):

- `run_or_checkpoint`: a run folder (its newest checkpoint) or a checkpoint file. The model,
  its arguments and the input layout come from the run's run.json (two folders above a
  checkpoint in its run), else from the checkpoint itself (the spec and data layout the
  training loop saves in it as `model_source`). Weights load with
  `torch.load(weights_only=True)`, checked against their digest and the run's spec hash.
  Anything wrong is a one-line `UserError` (exit 2).
- `device`: "auto" (cuda, then mps, then cpu), "cpu", "cuda", "cuda:N".
- `precision`: "fp32"; "bf16" (autocast, weights fp32); "int8" (torch's dynamic quantization of
  the Linear layers, as `bench precision` measures it; CPU only).
- `Predictor.input_shape` (one sample, no batch dimension), `.input_kind` ("image": float32
  (C, H, W) in [0, 1]; "features": float32; "tokens": int64 ids), `.task`, `.num_classes`.
- `Predictor.predict(x)`: `x` a tensor (N, *input_shape); returns a `Prediction` with
  `.classes` (N ints: the class, or for a language model the next token after the sequence),
  `.confidence` (N floats: its softmax probability) and `.logits` (float32, CPU). A batch of
  another shape or dtype is a one-line `UserError`. It changes no state (eval mode,
  no gradients), so one Predictor may answer many requests.
- `Predictor.check(x)`: the same shape check alone; `Predictor.images(files)`: image files or
  bytes decoded into a batch as the run's reader decoded its images.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dlscale.errors import UserError
from dlscale.infer.inputs import open_source
from dlscale.infer.output import check_out, write_predictions
from dlscale.infer.predict import Progress, run_sources
from dlscale.infer.predictor import Prediction, Predictor, build_predictor
from dlscale.infer.record import PredictResult
from dlscale.infer.trained import load_trained

__all__ = ["Prediction", "Predictor", "load_predictor", "predict"]


def load_predictor(
    run_or_checkpoint: str | Path, device: str = "auto", precision: str = "fp32"
) -> Predictor:
    """A trained run's model, rebuilt from its record with its checkpoint's weights, on
    `device` at `precision` (fp32, bf16 or int8), ready for `predict(batch)`."""
    return build_predictor(load_trained(run_or_checkpoint), device, precision)


def predict(
    run_or_checkpoint: str | Path,
    inputs: Sequence[str | Path],
    batch_size: int = 64,
    device: str = "auto",
    precision: str = "fp32",
    split: str | None = None,
    out: str | Path | None = None,
    progress: Progress | None = None,
) -> PredictResult:
    """Run a trained model over input files (images or folders of them, .npz, .txt tokens,
    WebDataset shards, a saved Hugging Face data set; `split` picks the latter's split), in
    batches of `batch_size`. Returns the result, typed (its `to_json()` has schema
    dlscale.predict/1): one row per sample (input, predicted, confidence, label) and, where the
    inputs carry labels, the accuracy beside the run's recorded validation accuracy; also
    written to `out` (.json or .csv), whose path it then names."""
    if not inputs:
        raise UserError("no inputs given: name image files or folders, .npz, .txt, shards")
    if out is not None:
        check_out(out)  # before the model loads: a wrong suffix is said at once
    predictor = load_predictor(run_or_checkpoint, device, precision)
    sources = [open_source(path, predictor.trained, split) for path in inputs]
    result = run_sources(predictor, sources, batch_size, progress)
    if out is not None:
        result.out = str(write_predictions(result, out))
    return result
