"""Running a predictor over input sources: one row per sample and, where the inputs carry labels,
the accuracy, counted as training's validation counts it (per sample, or per token)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dlscale.errors import UserError
from dlscale.infer.inputs import Source
from dlscale.infer.predictor import Predictor
from dlscale.infer.record import PREDICT_SCHEMA, InputSource, PredictedRow, PredictResult

# progress(samples done, samples in all)
Progress = Callable[[int, int], None]


def run_sources(
    predictor: Predictor,
    sources: Sequence[Source],
    batch_size: int,
    progress: Progress | None = None,
) -> PredictResult:
    """Every sample of `sources` through the model, `batch_size` at a time: the result with a
    row per sample and the accuracy over the labelled sources."""
    if batch_size < 1:
        raise UserError(f"--batch-size must be at least 1 (got {batch_size})")
    total = sum(source.count for source in sources)
    rows: list[PredictedRow] = []
    correct = counted = 0
    for source in sources:
        for x, y, names in source.batches(batch_size):
            predictor.check(x, source.path, per_sample=True)
            if y is not None:
                predictor.check_labels(y, x, source.path)
            prediction = predictor.predict(x)
            finite = torch.isfinite(prediction.logits.reshape(len(names), -1)).all(dim=1)
            if not bool(finite.all()):
                first = names[int((~finite).nonzero()[0])]
                raise UserError(
                    f"{first}: the model's output is not finite (NaN or ±inf): this input "
                    "overflows it, or its weights are not numbers; no prediction is given"
                )
            shown = None if y is None else (y[:, -1] if y.ndim == 2 else y).tolist()
            for index, name in enumerate(names):
                rows.append(
                    PredictedRow(
                        input=name,
                        predicted=prediction.classes[index],
                        confidence=prediction.confidence[index],
                        label=None if shown is None else shown[index],
                    )
                )
            if y is not None:
                right, count = predictor.correct(prediction, y)
                correct += right
                counted += count
            if progress is not None:
                progress(len(rows), total)
    trained = predictor.trained
    return PredictResult(
        schema=PREDICT_SCHEMA,
        run_dir=None if trained.run_dir is None else str(trained.run_dir),
        checkpoint=str(trained.checkpoint),
        step=trained.step,
        model=trained.model_name,
        task=trained.task,
        device=str(predictor.device),
        precision=predictor.precision,
        batch_size=batch_size,
        inputs=[InputSource(path=s.path, kind=s.kind, samples=s.count) for s in sources],
        samples=len(rows),
        labelled=all(source.labelled for source in sources),
        correct=correct if counted else None,
        counted=counted or None,
        accuracy=correct / counted if counted else None,
        run_val_accuracy=trained.val_accuracy,
        run_val_step=trained.val_step,
        run_precision=trained.precision,
        rows=rows,
    )
