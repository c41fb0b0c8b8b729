"""The plots of the benches that train runs: scale (and convergence), compare, precision,
sparsity and levels; and the finish every bench plot's axes share."""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def finish_axes(axes: Axes) -> None:
    """A light grid, and a legend when anything is labelled."""
    axes.grid(True, which="both", alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=8)


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
        finish_axes(axes)
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
        axes.plot(
            [p["samples"] for p in curve],
            [100 * p["val_accuracy"] for p in curve],
            marker="o",
            markersize=3,
            label=label,
        )
    if result.get("target_accuracy") is not None:
        axes.axhline(100 * result["target_accuracy"], linestyle="--", color="grey", label="target")
    axes.set_xlabel("training samples seen")
    axes.set_ylabel("validation accuracy (%)")
    axes.set_title(f"learning rate scaled '{result.get('lr_scaling') or 'none'}'")
    finish_axes(axes)


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
            axes.axhline(
                100 * target, color="grey", linestyle=":", label=f"target {100 * target:.1f}%"
            )
        axes.set_ylabel("validation accuracy (%)")
    for axes in (loss_time, loss_epoch):
        axes.set_ylabel("loss (validation solid, training dashed)")
    for axes in (acc_time, loss_time):
        axes.set_xlabel("wall time since the run's start (s)")
    for axes in (acc_epoch, loss_epoch):
        axes.set_xlabel("epoch")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    for axes in panels.flat:
        finish_axes(axes)
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
        (panels[1], "latency_s", f"inference, batch {result['latency_batch']} (ms, median)", 1e3),
        (panels[2], "model_bytes", "model (KiB)", 1 / 1024),
    ):
        colours = ["#4c72b0" if r["kind"] == "trained" else "#dd8452" for r in rows]
        axes.bar(names, [row[key] * scale for row in rows], color=colours)
        axes.set_ylabel(label)
        axes.tick_params(axis="x", labelrotation=20)
        finish_axes(axes)
    noisy = [row["format"] for row in rows if row["latency_noisy"]]
    figure.suptitle(
        f"{result['model']}: formats on {result['device']} (blue: trained, orange: "
        "quantized after training)" + (f"; latency noisy: {', '.join(noisy)}" if noisy else "")
    )


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
    size.plot(
        levels,
        [r["dense_weight_bytes"] / 1024 for r in rows],
        linestyle="--",
        color="grey",
        label="dense",
    )
    size.plot(
        levels,
        [r["sparse_weight_bytes"] / 1024 for r in rows],
        marker="o",
        label=f"stored sparse ({'CSR' if result['pattern'] == 'unstructured' else '2:4'})",
    )
    size.set_ylabel("weight bytes (KiB)")
    for axes in (accuracy, latency, size):
        axes.set_xlabel("weights pruned (%)")
        finish_axes(axes)
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
    for axes, key, label in (
        (threads, "threads", "intra-op threads"),
        (processes, "processes", "ddp processes"),
    ):
        rows = result[key]
        counts = [r[key] for r in rows]
        axes.plot(counts, [r["speedup"] for r in rows], marker="o", label="measured")
        axes.plot(counts, counts, linestyle="--", color="grey", label="linear")
        axes.set_xlabel(label)
        axes.set_xticks(counts)
        axes.set_ylabel("speed-up over 1")
    for axes in (simd, threads, processes):
        finish_axes(axes)
    facts = result["machine"]
    figure.suptitle(
        f"{result['model']}: levels of parallelism on {facts['cores']} cores, "
        f"{facts['numa_nodes']} NUMA node(s)"
    )
