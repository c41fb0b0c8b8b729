"""`dlscale bench io`: storage, decoding and the model side by side, as a table and files."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dlscale.api import bench
from dlscale.cli.errors import user_errors
from dlscale.tables import output_console
from dlscale.units import binary_bytes
from dlscale.units import duration as seconds

console = output_console()
OUT_HELP = (
    "Output folder for the JSON and PNG (default runs/bench-io-<timestamp>); one that holds "
    "this bench's results already is refused."
)


@user_errors
def io_command(
    spec: Path = typer.Argument(..., help="Job spec whose data is read from disk."),
    readers: int | None = typer.Option(
        None, "--readers", help="Concurrent storage readers (default: loader.workers, or 4)."
    ),
    seconds_each: float = typer.Option(3.0, "--seconds", help="Time budget per measurement."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    out: Path | None = typer.Option(None, "--out", help=OUT_HELP),
) -> None:
    """Storage read, decoding per loader worker and the model's rate: which bounds training."""
    bench.check_out_dir(out, "io")  # a bad --out is one line now, not after the bench
    bench.check_io(spec, readers, seconds_each)  # one line, not after "measuring ..."
    say = Console(stderr=True, highlight=False) if as_json else console
    say.print(f"measuring {spec}: storage, decoding, the model ({seconds_each:g} s each) ...")
    result = bench.bench_io(spec, readers, seconds_each)
    json_path, png_path = bench.write_outputs("io", result, out)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        console.print(io_table(result))
    say.print(f"wrote {json_path} and {png_path}")


def io_table(result: dict) -> Table:
    title = f"{result['spec']}: {result['data']} data, {result['model']}, batch "
    table = Table(title=escape(f"{title}{result['batch_size']} on {result['device']}"))
    for name in ("measured", "samples/s", "MB/s", "note"):
        table.add_column(name, justify="left" if name in ("measured", "note") else "right")
    per_sample = result["disk_bytes_per_sample"]
    one, many = result["storage_one_reader"], result["storage_readers"]
    decode, model = result["decode_one_worker"], result["model_step"]
    workers = result["loader_workers"]

    def row(what: str, samples_per_s: float, note: str = "") -> None:
        mb = samples_per_s * per_sample / 1e6
        table.add_row(what, f"{samples_per_s:,.0f}", f"{mb:,.1f}", note)

    row("storage, 1 reader", one["read_bytes_per_s"] / per_sample, storage_note(one))
    row(
        f"storage, {many['readers']} readers",
        many["read_bytes_per_s"] / per_sample,
        f"{result['contention_ratio']:.2f}× one reader; {storage_note(many)}",
    )
    split = (
        f"reading {seconds(decode['read_s_per_sample'])}, decoding "
        f"{seconds(decode['decode_s_per_sample'])} a sample"
    )
    row(
        "decode, 1 loader worker",
        decode["samples_per_s"],
        f"{split}; {spread(decode['batch_spread'], 'batches', result['noisy_spread'])}",
    )
    if workers > 1:
        row(
            f"decode, {workers} loader workers",
            decode["samples_per_s"] * workers,
            f"loader.workers: {workers}",
        )
    row(
        f"model step ({result['device']})",
        model["samples_per_s"],
        f"{seconds(model['step_time_s'])} a step; "
        f"{spread(model['step_spread'], 'steps', result['noisy_spread'])}",
    )
    cache = (
        "page cache dropped before each measurement"
        if result["page_cache_dropped"]
        else "page cache could NOT be dropped: files already in memory time memory, not storage"
    )
    if result["filesystem"] in ("tmpfs", "ramfs"):
        cache = f"the files are on {result['filesystem']}: storage here is memory"
    load = result["load_average_1m_5m_15m"]
    facts = [cache, f"{per_sample / 1e3:,.1f} kB of files a sample"]
    if workers == 0:
        facts.append("loader.workers: 0: the training process decodes between its steps")
    if load:
        facts.append(f"load average {load[0]:.1f} on {result['cores']} cores")
    table.caption = escape(f"{result['verdict']}\n" + "; ".join(facts))
    return table


def spread(value: float, repeats: str, noisy_spread: float) -> str:
    """How far the repeats (steps, batches) varied, 10th to 90th percentile; marked noisy where
    that is too wide to rank the rates by."""
    return f"{repeats} ±{value:.0%}" + (" noisy" if value > noisy_spread else "")


def storage_note(measured: dict) -> str:
    read = binary_bytes(measured["read_bytes"])
    return f"{read} in {seconds(measured['seconds'])}" + (
        " (all of it)" if measured["all_read"] else ""
    )
