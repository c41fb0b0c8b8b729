"""`dlscale data ...`: write data sets larger than memory as shards, and stage them locally."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from dlscale.api import data
from dlscale.cli.errors import stderr, user_errors
from dlscale.cli.help import FlagHelpGroup
from dlscale.cli.options import parse_int_list
from dlscale.tables import output_console
from dlscale.units import binary_bytes

app = typer.Typer(
    name="data",
    cls=FlagHelpGroup,
    help="Write data sets as WebDataset shards (or Hugging Face datasets); stage them locally.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = output_console(soft_wrap=True)  # a path in a line is never broken


@app.command()
@user_errors
def convert(
    source: str = typer.Argument(
        ..., help="digits, synthetic, or a job spec (YAML) whose data section is read."
    ),
    out: Path = typer.Argument(..., help="New or empty folder for the shards and dataset.json."),
    format: str = typer.Option("webdataset", "--format", help="webdataset | hf."),
    shard_size: str = typer.Option(
        "64MB", "--shard-size", help="Bytes per shard file: 64MB, 1GiB or a number of bytes."
    ),
    image_format: str = typer.Option(
        "npy", "--image-format", help="npy | png: how images are stored (png: smaller, decoded)."
    ),
    samples: int | None = typer.Option(None, "--samples", help="synthetic: samples in all."),
    shape: str | None = typer.Option(None, "--shape", help="synthetic: one sample, e.g. 3,32,32."),
    classes: int | None = typer.Option(None, "--classes", help="synthetic: number of classes."),
    seed: int | None = typer.Option(None, "--seed", help="digits, synthetic: generation, split."),
    val_fraction: float | None = typer.Option(
        None, "--val-fraction", help="digits, synthetic: share for validation (default 0.2)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Write a data set as WebDataset shards (or an hf dataset) in bounded memory, any size."""
    sizes = parse_int_list(shape, "--shape") if shape is not None else None
    with progress_bar(f"converting into {out}", quiet=as_json) as on_progress:
        result = data.convert_data(
            source,
            out,
            format,
            shard_size,
            image_format,
            samples,
            sizes,
            classes,
            seed,
            val_fraction,
            on_progress,
        )
    for warning in result["warnings"]:
        stderr.print(f"[bold yellow]warning:[/] {escape(warning)}", markup=True)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    counts = result["samples"]
    unit = "shard" if result["format"] == "webdataset" else "Arrow file"
    console.print(
        f"wrote {result['out']}: {result['shards']} {unit}(s), {counts['train']:,} training + "
        f"{counts['val']:,} validation samples, {binary_bytes(result['bytes'])} "
        f"in {result['seconds']:.1f} s"
    )


@app.command()
@user_errors
def stage(
    source: str = typer.Argument(
        ..., help="A shard pattern, or a folder: shards with dataset.json, an hf dataset, images."
    ),
    dst: Path = typer.Argument(..., help="Local folder to copy into (kept between runs)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Copy a data set to local disk once, resumably, verified by sha256 (as data.stage: DIR)."""
    result = data.stage_data(source, dst)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    reused = result["files"] - result["copied_files"]
    rate = result["copied_bytes_per_s"]
    speed = f" ({binary_bytes(rate)}/s)" if rate and result["copied_bytes"] else ""
    console.print(
        f"staged {result['files']} file(s), {binary_bytes(result['bytes'])} into {result['dir']}: "
        f"copied {result['copied_files']} ({binary_bytes(result['copied_bytes'])}) in "
        f"{result['seconds']:.2f} s{speed}, {reused} already there; verified by sha256"
    )


@contextmanager
def progress_bar(title: str, quiet: bool) -> Iterator[Callable[[int, int], None]]:
    """A rich bar of samples written, on a terminal only (piped output stays clean)."""
    if quiet or not console.is_terminal:
        yield lambda done, total: None
        return
    columns = (TextColumn(title), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(title, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
