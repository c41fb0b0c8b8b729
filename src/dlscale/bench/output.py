"""Bench results on disk: one JSON record and one PNG plot per bench, in one output folder.

Plots are drawn on a bare matplotlib Figure with the Agg canvas: no pyplot, no global backend
switch, no display needed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from dlscale.bench.io_plot import plot_io
from dlscale.train.files import new_run_dir, write_atomic, write_json_atomic
from dlscale.train.ownership import check_folder, claim

GIGA = 1e9


def output_dir(bench: str, out: str | Path | None = None) -> Path:
    """`out`, or runs/bench-<bench>-<UTC timestamp>/; created (one line if it cannot be)."""
    folder = Path(out) if out is not None else new_run_dir(f"bench-{bench}")
    check_folder(folder)
    return folder


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
    _finish(axes)


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
    _finish(axes)


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
        _finish(axes)
    figure.suptitle(
        f"{result['spec']}: {result['model']}, batch {result['batch_size']}, {result['device']}"
    )


def plot_width(figure: Figure, result: dict) -> None:
    """Step time and time per parameter vs width (log-log), with the cache crossings marked."""
    rows = [row for row in result["rows"] if row["step_time_s"] is not None]
    widths = [row["width"] for row in rows]
    step = figure.add_subplot(1, 2, 1)
    per_param = figure.add_subplot(1, 2, 2)
    step.plot(widths, [row["step_time_s"] for row in rows], marker="o")
    step.set_ylabel("training step time (s)")
    per_param.plot(widths, [row["time_per_parameter_s"] * 1e9 for row in rows], marker="o")
    per_param.set_ylabel("step time per parameter (ns)")
    marks = (
        ("state_exceeds_cache_from_width", "--", "weights+grads+Adam > cache"),
        ("weight_matrix_exceeds_cache_from_width", ":", "one w×w weight > cache"),
    )
    for axes in (step, per_param):
        _vertical_marks(axes, result, marks, "{label} ({value})")
        _log2_ticks(axes, widths)
        axes.set_yscale("log")
        axes.set_xlabel("hidden width w (mlp hidden=[w, w])")
        _finish(axes)
    skipped = [row["width"] for row in result["rows"] if row["skipped"]]
    note = f"; skipped (memory): {skipped}" if skipped else ""
    figure.suptitle(f"MLP width sweep, batch {result['batch_size']}, {result['device']}{note}")


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


def _finish(axes: Axes) -> None:
    axes.grid(True, which="both", alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=8)


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
    memory.plot(batches, [row["predicted_memory_bytes"] / GIGA for row in rows], marker="o",
                label="predicted training memory")  # fmt: skip
    memory.axhline(result["memory_budget_bytes"] / GIGA, color="red", linestyle="--",
                   label="memory budget")  # fmt: skip
    memory.set_ylabel("GB")
    memory.set_yscale("log")
    for axes in (throughput, memory):
        _log2_ticks(axes, batches)
        axes.set_xlabel("batch size")
        _finish(axes)
    figure.suptitle(f"{result['model']}: throughput vs batch size, {result['device']}")


def plot_scale(figure: Figure, result: dict) -> None:
    """Throughput vs workers (with perfect scaling as a line) and scaling efficiency."""
    rows = result["rows"]
    workers = [row["workers"] for row in rows]
    panels = 3 if result.get("convergence") else 2
    if panels == 3:
        figure.set_size_inches(15, 4.5)
    throughput = figure.add_subplot(1, panels, 1)
    efficiency = figure.add_subplot(1, panels, 2)
    if panels == 3:
        _plot_convergence(figure.add_subplot(1, 3, 3), result)
    base = rows[0]
    ideal = [base["samples_per_s"] * n / base["workers"] for n in workers]
    throughput.plot(workers, [row["samples_per_s"] for row in rows], marker="o", label="measured")
    throughput.plot(workers, ideal, linestyle="--", color="grey", label="perfect scaling")
    throughput.set_ylabel("training samples/s (all workers)")
    efficiency.plot(workers, [100 * row["efficiency"] for row in rows], marker="o")
    efficiency.axhline(100, linestyle="--", color="grey")
    efficiency.set_ylabel(f"scaling efficiency vs {result['baseline_workers']} worker(s) (%)")
    efficiency.set_ylim(bottom=0)
    for axes in (throughput, efficiency):
        axes.set_xlabel("workers")
        axes.set_xticks(workers)
        _finish(axes)
    figure.suptitle(
        f"{result['model']}: data parallel ({result['cluster']}), batch "
        f"{result['per_worker_batch_size']} per worker"
    )


def _plot_convergence(axes, result: dict) -> None:
    """Validation accuracy against training samples seen, a line per worker count: a larger
    global batch takes fewer, larger steps over the same samples."""
    for row in result["rows"]:
        curve = row["curve"]
        label = f"{row['workers']} × (batch {row['global_batch_size']}, lr {row['lr']:.3g})"
        axes.plot([p["samples"] for p in curve], [100 * p["val_accuracy"] for p in curve],
                  marker="o", markersize=3, label=label)  # fmt: skip
    if result.get("target_accuracy") is not None:
        axes.axhline(100 * result["target_accuracy"], linestyle="--", color="grey",
                     label="target")  # fmt: skip
    axes.set_xlabel("training samples seen")
    axes.set_ylabel("validation accuracy (%)")
    axes.set_title(f"learning rate scaled '{result.get('lr_scaling') or 'none'}'")
    _finish(axes)


def plot_compare(figure: Figure, result: dict) -> None:
    """Validation accuracy and loss against wall time and against epochs, one line per strategy."""
    figure.set_size_inches(11, 8)
    panels = figure.subplots(2, 2)
    (acc_time, acc_epoch), (loss_time, loss_epoch) = panels
    target = result["target_accuracy"]
    for name, curve in result["curves"].items():
        color = None
        for axes, x_key, y_key, style, label in (
            (acc_time, "elapsed_s", "val_accuracy", "-", name),
            (acc_epoch, "epoch", "val_accuracy", "-", name),
            (loss_time, "elapsed_s", "val_loss", "-", name),
            (loss_epoch, "epoch", "val_loss", "-", name),
            (loss_time, "elapsed_s", "train_loss", "--", "_nolegend_"),
            (loss_epoch, "epoch", "train_loss", "--", "_nolegend_"),
        ):
            points = [(p[x_key], p[y_key]) for p in curve if p[y_key] is not None]
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            if y_key == "val_accuracy":
                ys = [100 * y for y in ys]
            (line,) = axes.plot(xs, ys, style, marker="o", markersize=3, color=color, label=label)
            color = line.get_color()
    for axes in (acc_time, acc_epoch):
        if target is not None:
            axes.axhline(100 * target, color="grey", linestyle=":",
                         label=f"target {100 * target:.1f}%")  # fmt: skip
        axes.set_ylabel("validation accuracy (%)")
    for axes in (loss_time, loss_epoch):
        axes.set_ylabel("loss (validation solid, training dashed)")
    for axes in (acc_time, loss_time):
        axes.set_xlabel("wall time since the run's start (s)")
    for axes in (acc_epoch, loss_epoch):
        axes.set_xlabel("epoch")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    for axes in panels.flat:
        _finish(axes)
    figure.suptitle(
        f"{result['model']} on {result['data']}: {result['workers']} workers "
        f"({result['cluster']}), batch {result['per_worker_batch_size']} per worker; "
        f"target = {result['target_rule']}",
        fontsize=10,
    )


def plot_precision(figure: Figure, result: dict) -> None:
    """Accuracy, inference latency and model bytes per format, side by side."""
    rows = [row for row in result["rows"] if "latency_s" in row]
    names = [row["format"] for row in rows]
    figure.set_size_inches(12, 4)
    panels = figure.subplots(1, 3)
    for axes, key, label, scale in (
        (panels[0], "val_accuracy", "validation accuracy (%)", 100),
        (panels[1], "latency_s", "inference latency of one batch (ms)", 1e3),
        (panels[2], "model_bytes", "model (KiB)", 1 / 1024),
    ):
        colours = ["#4c72b0" if r["kind"] == "trained" else "#dd8452" for r in rows]
        axes.bar(names, [row[key] * scale for row in rows], color=colours)
        axes.set_ylabel(label)
        axes.tick_params(axis="x", labelrotation=20)
        _finish(axes)
    figure.suptitle(f"{result['model']}: formats on {result['device']} (blue: trained, orange: "
                    "quantized after training)")  # fmt: skip


def plot_sparsity(figure: Figure, result: dict) -> None:
    """Accuracy, latency and stored weight bytes against the pruned fraction."""
    rows = result["rows"]
    levels = [100 * row["measured_sparsity"] for row in rows]
    figure.set_size_inches(12, 4)
    accuracy, latency, size = figure.subplots(1, 3)
    accuracy.plot(levels, [100 * r["val_accuracy"] for r in rows], marker="o")
    accuracy.set_ylabel("validation accuracy after fine-tuning (%)")
    latency.plot(levels, [1e3 * r["latency_s"] for r in rows], marker="o")
    latency.set_ylim(bottom=0)
    latency.set_ylabel("inference latency, dense kernels (ms)")
    size.plot(levels, [r["dense_weight_bytes"] / 1024 for r in rows], linestyle="--",
              color="grey", label="dense")  # fmt: skip
    size.plot(
        levels,
        [r["sparse_weight_bytes"] / 1024 for r in rows],
        marker="o",
        label=f"stored sparse ({'CSR' if result['pattern'] == 'unstructured' else '2:4'})",
    )
    size.set_ylabel("weight bytes (KiB)")
    for axes in (accuracy, latency, size):
        axes.set_xlabel("weights pruned (%)")
        _finish(axes)
    figure.suptitle(
        f"{result['model']}: {result['pattern']} magnitude pruning, "
        f"{result['finetune_steps']} fine-tuning steps at each level"
    )


def plot_levels(figure: Figure, result: dict) -> None:
    """Speed-up at each level: SIMD instruction sets, threads, processes."""
    figure.set_size_inches(12, 4)
    simd, threads, processes = figure.subplots(1, 3)
    simd.bar([r["level"] for r in result["simd"]], [r["speedup"] for r in result["simd"]])
    simd.set_ylabel("speed-up over the SSE baseline (1 thread)")
    for axes, key, label in ((threads, "threads", "intra-op threads"),
                             (processes, "processes", "ddp processes")):  # fmt: skip
        rows = result[key]
        counts = [r[key] for r in rows]
        axes.plot(counts, [r["speedup"] for r in rows], marker="o", label="measured")
        axes.plot(counts, counts, linestyle="--", color="grey", label="linear")
        axes.set_xlabel(label)
        axes.set_xticks(counts)
        axes.set_ylabel("speed-up over 1")
    for axes in (simd, threads, processes):
        _finish(axes)
    facts = result["machine"]
    figure.suptitle(f"{result['model']}: levels of parallelism on {facts['cores']} cores, "
                    f"{facts['numa_nodes']} NUMA node(s)")  # fmt: skip


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
}
