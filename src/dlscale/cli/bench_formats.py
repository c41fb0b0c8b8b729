"""`dlscale bench precision`, `sparsity` and `levels`: number formats, pruning and the levels
of CPU parallelism, measured."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from dlscale.api import bench
from dlscale.cli.errors import user_errors
from dlscale.tables import output_console
from dlscale.units import binary_bytes

console = output_console()
OUT_HELP = (
    "Output folder for the JSON and PNG (default runs/bench-<name>-<timestamp>); one that "
    "holds this bench's results already is refused."
)


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1e3:.2f} ms"


def _timed(row: dict, key: str) -> str:
    """A median time and its spread, marked where the spread is too wide to trust."""
    if row[f"{key}_s"] is None or row[f"{key}_spread"] is None:
        return _ms(row[f"{key}_s"])
    text = f"{_ms(row[f'{key}_s'])} ±{row[f'{key}_spread']:.0%}"
    return text + " noisy" if row[f"{key}_noisy"] else text


@user_errors
def precision(
    spec: Path = typer.Argument(..., help="Job spec (YAML): its model, data and optimizer."),
    steps: int | None = typer.Option(
        None, "--steps", help="Training steps per format (default: the spec's length)."
    ),
    latency_batch: int = typer.Option(
        bench.default_latency_batch(),
        "--latency-batch",
        help="Validation samples in the batch whose inference latency is timed.",
    ),
    out: Path | None = typer.Option(None, "--out", help=OUT_HELP),
) -> None:
    """The model trained at fp32 and bf16 (fp16 on a GPU), and quantized to int8 after
    training: accuracy, latency, model and activation bytes."""
    bench.check_out_dir(out, "precision")  # a bad --out is one line now, not after the bench
    result = bench.bench_precision(spec, steps, latency_batch)
    table = Table(
        title=f"{result['model']}: number formats on {result['device']}, "
        f"{result['steps']} training steps"
    )
    for column in (
        "format",
        "how",
        "val accuracy",
        "train step (median ±spread)",
        f"inference, batch {result['latency_batch']} (median ±spread)",
        "model",
        "saved activations",
    ):
        table.add_column(column, justify="left" if column in ("format", "how") else "right")
    for row in result["rows"]:
        if "error" in row:
            table.add_row(row["format"], row["kind"], f"not possible: {row['error']}")
            continue
        activations = row["activation_bytes"]
        table.add_row(
            row["format"],
            row["kind"],
            f"{100 * row['val_accuracy']:.1f}%",
            _timed(row, "train_step"),
            _timed(row, "latency"),
            binary_bytes(row["model_bytes"]),
            binary_bytes(activations) if activations else "-",
        )
    table.caption = "; ".join(result["notes"])
    console.print(table)
    json_path, png_path = bench.write_outputs("precision", result, out)
    console.print(f"wrote {json_path} and {png_path}")


@user_errors
def sparsity(
    spec: Path = typer.Argument(..., help="Job spec (YAML): its model, data and optimizer."),
    levels: str = typer.Option("0,0.5,0.8,0.9,0.95", "--levels", help="Fractions to prune."),
    pattern: str = typer.Option("unstructured", "--pattern", help="unstructured | 2:4."),
    finetune_steps: int = typer.Option(50, "--finetune-steps", help="Steps after pruning."),
    steps: int | None = typer.Option(
        None, "--steps", help="Dense training steps (default: the spec's length)."
    ),
    latency_batch: int = typer.Option(
        bench.default_latency_batch(),
        "--latency-batch",
        help="Validation samples in the batch whose inference latency is timed.",
    ),
    out: Path | None = typer.Option(None, "--out", help=OUT_HELP),
) -> None:
    """Magnitude pruning at each level with a short fine-tune: accuracy, latency on dense
    kernels, and the bytes a sparse format would store."""
    bench.check_out_dir(out, "sparsity")  # a bad --out is one line now, not after the bench
    result = bench.bench_sparsity(spec, levels, pattern, finetune_steps, steps, latency_batch)
    console.print(sparsity_table(result))
    json_path, png_path = bench.write_outputs("sparsity", result, out)
    console.print(f"wrote {json_path} and {png_path}")


def sparsity_table(result: dict) -> Table:
    """The pruning levels side by side, the caption's rule for the pattern measured."""
    pattern = result["pattern"]
    table = Table(title=f"{result['model']}: {pattern} pruning on {result['device']}")
    inference = f"inference, batch {result['latency_batch']} (median ±spread)"
    for column in ("pruned", "val accuracy", inference, "dense weights", "stored sparse"):
        table.add_column(column, justify="right")
    for row in result["rows"]:
        table.add_row(
            f"{100 * row['measured_sparsity']:.1f}%",
            f"{100 * row['val_accuracy']:.1f}%",
            _timed(row, "latency"),
            binary_bytes(row["dense_weight_bytes"]),
            binary_bytes(row["sparse_weight_bytes"]),
        )
    stored = (
        "2:4 stores the kept half and 2 bits of index for each: about half the dense bytes"
        if result.get("pattern") == "2:4"
        else "a sparse format (CSR) pays for indices, so it saves bytes only past about half zeros"
    )
    table.caption = f"dense kernels multiply the zeros too; {stored}"
    if result["noisy"]:
        table.caption += (
            f"; noisy: latency rounds spread over {result['noisy_spread']:.0%} (the machine's "
            "load changed while they were timed): compare no latencies, rerun"
        )
    return table


@user_errors
def levels(
    spec: Path = typer.Argument(..., help="Job spec (YAML): its model, data and batch."),
    steps: int = typer.Option(20, "--steps", help="Timed steps per measurement."),
    max_threads: int | None = typer.Option(
        None,
        "--max-threads",
        help="Threads and processes up to (default and most: the cores).",
    ),
    out: Path | None = typer.Option(None, "--out", help=OUT_HELP),
) -> None:
    """SIMD levels, then threads, then processes: speed-up at each level of parallelism."""
    bench.check_out_dir(out, "levels")  # a bad --out is one line now, not after the bench
    result = bench.bench_levels(spec, steps, max_threads)
    console.print(levels_table(result))
    json_path, png_path = bench.write_outputs("levels", result, out)
    console.print(f"wrote {json_path} and {png_path}")


def levels_table(result: dict) -> Table:
    """Each level's settings with their rate (± their steps' spread, noisy marked) and
    speed-up; the caption gives the load and says when a speed-up is not to be read."""
    facts = result["machine"]
    caches = ", ".join(f"{name} {size}" for name, size in facts["caches"].items())
    title = (
        f"{result['model']}: levels of parallelism, batch {result['batch_size']}; "
        f"{facts['cores']} cores, {facts['numa_nodes']} NUMA node(s); {caches}"
    )
    table = Table(title=title)
    for column in ("level", "setting", "samples/s", "speed-up"):
        table.add_column(column, justify="left" if column in ("level", "setting") else "right")
    for kind, key in (
        ("SIMD, 1 thread", "level"),
        ("threads", "threads"),
        ("processes (ddp)", "processes"),
    ):
        for row in result[key if key != "level" else "simd"]:
            rate = f"{row['samples_per_s']:,.0f}"
            if "step_spread" in row:  # a result saved before the spread was kept has none
                rate += f" ±{row['step_spread']:.0%}" + (" noisy" if row["noisy"] else "")
            table.add_row(kind, str(row[key]), rate, f"{row['speedup']:.2f}×")
    notes = []
    if result.get("load_1m") is not None:
        notes.append(f"load average {result['load_1m']:.2f} when it started")
    rows = [*result["simd"], *result["threads"], *result["processes"]]
    if any(row.get("noisy") for row in rows):
        notes.append(
            "noisy: a setting's steps spread over 25% (something else ran): its speed-up is "
            "not the level's; rerun on an idle machine"
        )
    table.caption = "; ".join(notes) or None
    return table
