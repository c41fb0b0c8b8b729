"""Predictions written to a file: JSON (the whole result) or CSV (one row per sample), chosen by
the file's suffix, written whole or not at all."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from dlscale.atomic import write_atomic, write_json_atomic
from dlscale.errors import UserError
from dlscale.infer.record import PredictResult

COLUMNS = ("input", "predicted", "confidence", "label")
FORMATS = (".json", ".csv")


def check_out(path: str | Path) -> Path:
    """`--out` names a format we write: said before any work."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise UserError(f"--out {path}: choose a .json or .csv file")
    if path.exists() or path.is_symlink():
        raise UserError(
            f"--out {path} already exists: predictions would replace it; name a new file, or "
            "remove it first"
        )
    return path


def write_predictions(result: PredictResult, path: str | Path) -> Path:
    path = check_out(path)
    if path.suffix.lower() == ".json":
        write_json_atomic(path, result.to_json())
        return path
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in result.rows:
        cells = row.model_dump()
        writer.writerow({key: "" if cells[key] is None else cells[key] for key in COLUMNS})
    text = buffer.getvalue().encode()
    write_atomic(path, lambda handle: handle.write(text))
    return path
