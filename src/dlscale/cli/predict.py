"""`dlscale predict RUN INPUTS...`: a trained run's model on new inputs, as a table, JSON or a
file of predictions, with the accuracy where the inputs carry labels."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from dlscale.api import inference
from dlscale.api.inference import PredictResult
from dlscale.cli.errors import user_errors
from dlscale.tables import output_console

SHOWN_ROWS = 20  # a longer result shows its first rows; --out or --json holds them all
PROGRESS_FROM_SAMPLES = 1024  # fewer are done before a bar would be read


@user_errors
def predict(
    run: Path = typer.Argument(..., help="Run folder, or a checkpoint inside one."),
    inputs: list[str] = typer.Argument(
        ...,
        help="Image files or folders (class sub-folders give labels), .npz (x, optional y), "
        ".txt token files, WebDataset .tar shards or a pattern, a saved Hugging Face data set.",
    ),
    batch_size: int = typer.Option(64, "--batch-size", help="Samples per forward pass."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:N or mps."),
    precision: str = typer.Option(
        "fp32", "--precision", help="fp32, bf16 (autocast) or int8 (dynamic, CPU)."
    ),
    split: str | None = typer.Option(
        None, "--split", help="Hugging Face data set: the split (default: validation, else one)."
    ),
    out: Path | None = typer.Option(None, "--out", help="Write every prediction: .json or .csv."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Predict with a trained run's model: the model and its preprocessing come from the run."""
    with _progress(quiet=as_json) as bar:
        result = inference.predict(
            run, inputs, batch_size, device, precision, split, out, progress=bar
        )
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
        return
    console = output_console()
    console.print(rows_table(result))
    console.print(summary(result))
    if out is not None:
        console.print(f"wrote {result.out}")


def rows_table(result: PredictResult) -> Table:
    rows = result.rows
    labelled = any(row.label is not None for row in rows)
    what = "next token" if result.task == "language_modeling" else "class"
    table = Table(title=f"{result.model} ({result.precision}, {result.device})")
    table.add_column("input", overflow="fold")
    table.add_column(f"predicted {what}", justify="right")
    table.add_column("confidence", justify="right")
    if labelled:
        table.add_column("label", justify="right")
        table.add_column("right", justify="center")
    for row in rows[:SHOWN_ROWS]:
        cells = [escape(row.input), str(row.predicted), f"{100 * row.confidence:.1f}%"]
        if labelled:
            label = row.label
            cells += ["-" if label is None else str(label), _mark(row.predicted, label)]
        table.add_row(*cells)
    if len(rows) > SHOWN_ROWS:
        table.caption = f"first {SHOWN_ROWS} of {len(rows):,}; --out FILE.csv writes them all"
    return table


def summary(result: PredictResult) -> str:
    """One line: how many, and the accuracy beside the run's own where labels were there."""
    where = result.run_dir or result.checkpoint
    line = f"{result.samples:,} samples from step {result.step} of {where}"
    if result.accuracy is None:
        return line + " (no labels: no accuracy)"
    per = " tokens" if result.task == "language_modeling" else ""
    line += (
        f"; accuracy {100 * result.accuracy:.2f}% ({result.correct:,} of {result.counted:,}{per})"
    )
    recorded = result.run_val_accuracy
    if recorded is None:
        return line
    at = result.run_val_step
    at = f" at step {at}" if at is not None and at != result.step else ""
    line += f"; the run's validation accuracy{at}: {100 * recorded:.2f}%"
    if result.run_precision != result.precision:
        ran = result.run_precision
        line += f", validated in {ran}" + (
            f" (--precision {ran} predicts closer to how it did)" if ran == "bf16" else ""
        )
    return line


def _mark(predicted: int, label: int | None) -> str:
    if label is None:
        return ""
    return "✓" if predicted == label else "✗"


class _progress:
    """A bar on stderr for inputs of more than PROGRESS_FROM_SAMPLES, gone when done."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.bar: Progress | None = None
        self.task = None

    def __enter__(self):
        return None if self.quiet else self

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            if total < PROGRESS_FROM_SAMPLES:
                return
            self.bar = Progress(
                TextColumn("[bold blue]predict"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task("predict", total=total)
        self.bar.update(self.task, completed=done)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
