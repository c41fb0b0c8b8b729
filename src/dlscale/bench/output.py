"""Bench results on disk: one JSON record and one PNG plot per bench, in one output folder; the
plots of the benches that time this machine (those of training runs are in run_plots.py).

Plots are drawn on a bare matplotlib Figure with the Agg canvas: no pyplot, no global backend
switch, no display needed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dlscale.atomic import write_atomic, write_json_atomic
from dlscale.bench.io_plot import plot_io
from dlscale.bench.link_plot import plot_link
from dlscale.bench.run_plots import (
    finish_axes,
    plot_compare,
    plot_levels,
    plot_precision,
    plot_scale,
    plot_sparsity,
)
from dlscale.train.ownership import claim
from dlscale.train.run_folder import output_dir
from dlscale.units import binary_bytes

GIGA = 1e9


def write_outputs(bench: str, result: dict, out: str | Path | None = None) -> tuple[Path, Path]:
    """Write `<bench>.json` and `<bench>.png` into the output folder; returns both paths."""
    folder = output_dir(bench, out)
    json_path = folder / f"{bench}.json"
    png_path = folder / f"{bench}.png"
    figure = Figure(figsize=(9, 5.5), layout="constrained")
    FigureCanvasAgg(figure)
    PLOTS[bench](figure, result)
    with claim(folder):  # the JSON and its plot come from one run, not one each from two
        write_json_atomic(json_path, result)
        write_atomic(png_path, lambda handle: figure.savefig(handle, format="png", dpi=110))
    return json_path, png_path


def plot_machine(figure: Figure, result: dict) -> None:
    """Matmul FLOP/s vs matrix size, one line per precision."""
    axes = figure.add_subplot()
    for precision in dict.fromkeys(row["precision"] for row in result["matmul"]):
        rows = [row for row in result["matmul"] if row["precision"] == precision]
        sizes = [row["size"] for row in rows]
        axes.plot(sizes, [row["flops_per_s"] / GIGA for row in rows], marker="o", label=precision)
    _log2_ticks(axes, sorted({row["size"] for row in result["matmul"]}))
    axes.set_xlabel("matrix size n (n×n @ n×n)")
    axes.set_ylabel("GFLOP/s")
    bandwidth = result["bandwidth"]
    overhead = result["op_overhead_s"]
    axes.set_title(
        f"{result['name']} ({result['device']}, {result['threads']} threads): copy "
        f"{bandwidth['copy_bytes_per_s'] / GIGA:.1f} GB/s, triad "
        f"{bandwidth['triad_bytes_per_s'] / GIGA:.1f} GB/s, op overhead "
        f"{overhead['add_s'] * 1e6:.1f} µs",
        fontsize=10,
    )
    finish_axes(axes)


def plot_matmul(figure: Figure, result: dict) -> None:
    """Matmul time vs size (log-log): CPU, GPU, and GPU including the copies there and back."""
    axes = figure.add_subplot()
    rows = [row for row in result["rows"] if not row.get("skipped")]
    sizes = [row["size"] for row in rows]
    lines = (
        ("cpu_time_s", "CPU"),
        ("gpu_time_s", "GPU"),
        ("gpu_with_transfer_time_s", "GPU + copies"),
    )
    for key, label in lines:
        measured = [(row["size"], row[key]) for row in rows if row[key] is not None]
        if measured:
            axes.plot(*zip(*measured, strict=True), marker="o", label=label)
    wins = (
        ("gpu_wins_from_size", ":", "GPU faster"),
        ("gpu_wins_with_transfer_from_size", "--", "GPU + copies faster"),
    )
    _vertical_marks(axes, result, wins, "{label} from {value}")
    _log2_ticks(axes, sizes)
    axes.set_yscale("log")
    axes.set_xlabel("matrix size n (n×n @ n×n)")
    axes.set_ylabel("time per product (s)")
    versus = f"CPU vs {result['gpu']}" if result["gpu_available"] else "CPU"
    note = f"\n{result['note']}" if result["note"] else ""
    axes.set_title(f"{result['precision']} matmul, {versus}{note}", fontsize=10)
    finish_axes(axes)


def plot_loader(figure: Figure, result: dict) -> None:
    """Throughput and data-wait share vs worker count, per pin setting; the baseline as a line."""
    throughput = figure.add_subplot(1, 2, 1)
    waiting = figure.add_subplot(1, 2, 2)
    rows = [row for row in result["rows"] if row["loading"] == "per-sample"]
    baseline = next(row for row in result["rows"] if row["loading"] == "in-memory")
    for pin in dict.fromkeys(row["pin_memory"] for row in rows):
        chosen = [row for row in rows if row["pin_memory"] == pin]
        workers = [row["workers"] for row in chosen]
        label = f"per-sample loading, pin_memory={pin}"
        throughput.plot(workers, [row["samples_per_s"] for row in chosen], marker="o", label=label)
        waiting.plot(
            workers, [100 * row["data_wait_share"] for row in chosen], marker="o", label=label
        )
    throughput.axhline(
        baseline["samples_per_s"], color="grey", linestyle="--", label="in-memory batches"
    )
    waiting.axhline(
        100 * baseline["data_wait_share"], color="grey", linestyle="--", label="in-memory batches"
    )
    throughput.set_ylabel("training samples/s (steady state)")
    waiting.set_ylabel("data wait (% of step time)")
    for axes in (throughput, waiting):
        axes.set_xlabel("DataLoader workers")
        axes.set_xticks(sorted({row["workers"] for row in rows}))
        axes.set_ylim(bottom=0)
        finish_axes(axes)
    figure.suptitle(
        f"{result['spec']}: {result['model']}, batch {result['batch_size']}, {result['device']}"
    )


def plot_width(figure: Figure, result: dict) -> None:
    """Step time and time per parameter vs width (log-log), with a line where the working set
    leaves each cache and RAM (at the first width past it)."""
    rows = [row for row in result["rows"] if row["step_time_s"] is not None]
    widths = [row["width"] for row in rows]
    step = figure.add_subplot(1, 2, 1)
    per_param = figure.add_subplot(1, 2, 2)
    step.plot(widths, [row["step_time_s"] for row in rows], marker="o")
    step.set_ylabel("training step time (s)")
    per_param.plot(widths, [row["time_per_parameter_s"] * 1e9 for row in rows], marker="o")
    per_param.set_ylabel("step time per parameter (ns)")
    styles = ("--", ":", "-.", (0, (5, 1)), (0, (1, 3)))
    sizes = {level["name"]: level["bytes"] for level in result["levels"]}
    crossed = result["working_set_exceeds_from_width"]
    for axes in (step, per_param):
        for index, (name, first) in enumerate(crossed.items()):
            if first is not None:
                label = f"working set > {name} ({binary_bytes(sizes[name])}) from w = {first}"
                axes.axvline(first, color="grey", linestyle=styles[index % 5], label=label)
        _log2_ticks(axes, widths)
        axes.tick_params(axis="x", labelrotation=60)  # widths close on a log axis: 4096, 5120
        axes.set_yscale("log")
        axes.set_xlabel("hidden width w (mlp hidden=[w, w])")
        finish_axes(axes)
    skipped = [row["width"] for row in result["rows"] if row["skipped"]]
    note = f"; not timed: {skipped}" if skipped else ""
    limit = result.get("memory_limit_bytes")
    where = f", in a {binary_bytes(limit)} cgroup" if limit else ""
    figure.suptitle(
        f"MLP width sweep, batch {result['batch_size']}, {result['device']}{where}{note}"
    )


def _vertical_marks(axes: Axes, result: dict, marks: tuple, template: str) -> None:
    """A grey vertical line at result[key] for each (key, style, label) whose value is known."""
    for key, style, label in marks:
        if result[key] is not None:
            text = template.format(label=label, value=result[key])
            axes.axvline(result[key], color="grey", linestyle=style, label=text)


def _log2_ticks(axes: Axes, values: list[int]) -> None:
    """A log2 x axis labelled with the measured values themselves (64, 128, ...), not 2^k."""
    axes.set_xscale("log", base=2)
    axes.set_xticks(values, labels=[str(v) for v in values])
    axes.minorticks_off()


def plot_batch(figure: Figure, result: dict) -> None:
    """Throughput vs batch size, measured beside the roofline; predicted memory vs the budget."""
    rows = result["rows"]
    batches = [row["batch_size"] for row in rows]
    throughput = figure.add_subplot(1, 2, 1)
    memory = figure.add_subplot(1, 2, 2)
    measured = [row for row in rows if row["measured_step_s"]]
    throughput.plot(
        [row["batch_size"] for row in measured],
        [row["measured_samples_per_s"] for row in measured],
        marker="o",
        label="measured",
    )
    predicted = [row for row in rows if row["predicted_step_s"]]
    if predicted:
        throughput.plot(
            [row["batch_size"] for row in predicted],
            [row["predicted_samples_per_s"] for row in predicted],
            marker="x",
            linestyle="--",
            label="predicted (roofline on local)",
        )
    throughput.set_ylabel("training samples/s")
    memory.plot(
        batches,
        [row["predicted_memory_bytes"] / GIGA for row in rows],
        marker="o",
        label="predicted training memory",
    )
    memory.axhline(
        result["memory_budget_bytes"] / GIGA, color="red", linestyle="--", label="memory budget"
    )
    memory.set_ylabel("GB")
    memory.set_yscale("log")
    for axes in (throughput, memory):
        _log2_ticks(axes, batches)
        axes.set_xlabel("batch size")
        finish_axes(axes)
    figure.suptitle(f"{result['model']}: throughput vs batch size, {result['device']}")


PLOTS: dict[str, Callable[[Figure, dict], None]] = {
    "levels": plot_levels,
    "precision": plot_precision,
    "sparsity": plot_sparsity,
    "scale": plot_scale,
    "compare": plot_compare,
    "batch": plot_batch,
    "machine": plot_machine,
    "matmul": plot_matmul,
    "loader": plot_loader,
    "width": plot_width,
    "io": plot_io,
    "link": plot_link,
}
