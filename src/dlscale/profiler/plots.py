"""Profile plots (PNG, matplotlib Agg): working set, memory pie, roofline, step time."""

from __future__ import annotations

import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from dlscale.atomic import write_atomic
from dlscale.errors import UserError, os_reason
from dlscale.profiler import ProfileResult
from dlscale.profiler.report import layer_kind

MIB = 2**20
PLOT_NAMES = (
    "working_set.png",
    "memory.png",
    "compute.png",
    "roofline.png",
    "step_time.png",
    "scaling.png",
)
# Written into every plot's PNG (its Software text): a plot a profile wrote may be replaced by
# the next; any other file of a plot's name is the user's, and refused.
SOFTWARE = "dlscale profile"


def check_plot_folder(folder: Path, names: tuple[str, ...] = PLOT_NAMES) -> None:
    """One line, before anything is profiled, when `folder` cannot take the plots `names`: it
    (or a folder above it) is a file, it cannot be made or written (read-only, forbidden), or it
    holds a file of a plot's name that no profile wrote."""
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise UserError(f"--plot: {blocker} is a file, not a folder: give a folder for the plots")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # read-only, forbidden, or a full disk
        raise UserError(f"--plot: cannot create the folder {folder}: {os_reason(exc)}") from None
    try:
        tempfile.TemporaryFile(dir=folder).close()  # a file can be made there
    except OSError as exc:
        raise UserError(f"--plot: cannot write into {folder}: {os_reason(exc)}") from None
    theirs = [name for name in names if (folder / name).exists() and not _ours(folder / name)]
    if theirs:
        raise UserError(
            f"--plot: {folder} holds {', '.join(theirs)}, not a plot a profile wrote: the plots "
            "would replace it; choose another folder or move it"
        )


def _ours(path: Path) -> bool:
    """A PNG a profile wrote (its Software text; one written before the text was set carries
    matplotlib's own)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            software = str(image.info.get("Software", ""))
            return image.format == "PNG" and software.startswith((SOFTWARE, "Matplotlib"))
    except (OSError, ValueError, Image.DecompressionBombError):
        return False


def plot_names(devices: bool, scaling: bool) -> tuple[str, ...]:
    """The plots a profile writes: the per-layer three, the roofline and step time where it was
    predicted on devices, the scaling plot with --devices."""
    names = PLOT_NAMES[:3] + (PLOT_NAMES[3:5] if devices else ())
    return names + (PLOT_NAMES[5:] if scaling else ())


def write_plots(result: ProfileResult, folder: Path) -> list[Path]:
    folder = Path(folder)
    names = plot_names(bool(result.reports), bool(result.scaling))
    check_plot_folder(folder, names)
    return [WRITERS[name](result, folder / name) for name in names]


def _compute(result: ProfileResult, path: Path) -> Path:
    """The lecture's per-layer view: forward FLOPs and training (forward + backward) FLOPs of
    each layer, products and elementwise work together, on a log scale."""
    rows = [r for r in result.trace.layers if layer_kind(r) != "pseudo"]
    rows = [r for r in rows if r.forward.flops + r.backward.flops]  # views compute nothing
    names = [r.name for r in rows]
    forward = [r.forward.flops for r in rows]
    training = [r.forward.flops + r.backward.flops for r in rows]
    figure, axes = plt.subplots(figsize=(max(6, 0.3 * len(rows) + 2), 4.5))
    positions = list(range(len(rows)))
    axes.bar([p - 0.2 for p in positions], forward, width=0.4, label="forward")
    axes.bar([p + 0.2 for p in positions], training, width=0.4, label="training step")
    axes.set_yscale("log")
    axes.set_ylabel("FLOPs per batch (log scale)")
    axes.set_xticks(positions, names, rotation=90, fontsize=7)
    axes.set_title(
        f"{result.workload.model_name}: compute per layer, batch {result.trace.batch_size}"
    )
    axes.legend(fontsize=8)
    return _save(figure, path)


def _scaling(result: ProfileResult, path: Path) -> Path:
    """Predicted step time and efficiency against the device count: every strategy over the
    chosen link, and ddp over the device's other links (NVLink against PCIe)."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for report in result.scaling:
        lines: dict[str, list] = {}
        for row in report.rows:
            label = f"{report.hardware.name} {row.point.strategy} ({report.link.name})"
            lines.setdefault(label, []).append(row.point)
        for link_name, points in report.other_links.items():
            lines[f"{report.hardware.name} ddp ({link_name})"] = points
        for label, points in lines.items():
            counts = [p.devices for p in points]
            dashed = "--" if "ddp" not in label else "-"
            left.plot(counts, [p.step_s * 1e3 for p in points], dashed, marker="o", label=label)
            right.plot(counts, [100 * p.efficiency for p in points], dashed, marker="o")
    left.set_xscale("log", base=2)
    right.set_xscale("log", base=2)
    left.set_xlabel("devices")
    right.set_xlabel("devices")
    left.set_ylabel("predicted step time (ms)")
    right.set_ylabel("scaling efficiency (%)")
    right.set_ylim(0, 105)
    left.set_title(f"{result.workload.model_name}, batch {result.trace.batch_size} per device")
    right.set_title("throughput / (devices × one device's)")
    left.legend(fontsize=7)
    return _save(figure, path)


def _save(figure, path: Path) -> Path:
    """Written atomically: a full disk is one line naming the file, and no half a PNG."""
    try:
        figure.tight_layout()
        write_atomic(
            path,
            lambda handle: figure.savefig(
                handle, format="png", dpi=110, metadata={"Software": SOFTWARE}
            ),
        )
    finally:
        plt.close(figure)
    return path


def _working_set(result: ProfileResult, path: Path) -> Path:
    rows = [r for r in result.trace.layers if layer_kind(r) != "pseudo"]
    names = [r.name for r in rows]
    inputs = [r.input_bytes / MIB for r in rows]
    outputs = [r.output_bytes / MIB for r in rows]
    weights = [r.weight_bytes / MIB for r in rows]
    figure, axes = plt.subplots(figsize=(max(6, 0.25 * len(rows) + 2), 4.5))
    positions = range(len(rows))
    axes.bar(positions, inputs, label="inputs")
    axes.bar(positions, outputs, bottom=inputs, label="outputs")
    axes.bar(
        positions,
        weights,
        bottom=[a + b for a, b in zip(inputs, outputs, strict=True)],
        label="weights",
    )
    axes.set_xticks(list(positions), names, rotation=90, fontsize=7)
    axes.set_ylabel("MiB")
    axes.set_title(
        f"{result.workload.model_name}: working set per layer "
        f"(batch {result.trace.batch_size}, {result.trace.precision})"
    )
    axes.legend()
    return _save(figure, path)


def _memory_pie(result: ProfileResult, path: Path) -> Path:
    memory = result.memory
    parts = {
        "weights": memory.weights_bytes,
        "gradients": memory.gradients_bytes,
        "optimizer state": memory.optimizer_state_bytes,
        "activations": memory.activations_bytes,
        "input batch": memory.batch_bytes,
    }
    parts = {k: v for k, v in parts.items() if v > 0}
    figure, axes = plt.subplots(figsize=(6, 5))
    labels = [f"{k}\n{v / MIB:,.1f} MiB" for k, v in parts.items()]
    axes.pie(list(parts.values()), labels=labels, autopct="%1.0f%%", startangle=90)
    axes.set_title(f"training memory: {memory.total_bytes / MIB:,.1f} MiB")
    return _save(figure, path)


def _roofline(result: ProfileResult, path: Path) -> Path:
    """Each device's roof (min(peak, bandwidth × intensity)) and each layer placed under it."""
    figure, axes = plt.subplots(figsize=(8, 5.5))
    intensities = [t.intensity for t in result.reports[0].prediction.layers if t.intensity > 0]
    low = min(intensities, default=0.1) / 4
    high = max(intensities, default=100) * 4
    xs = [low * (high / low) ** (i / 100) for i in range(101)]
    for report in result.reports:
        hw = report.hardware
        peak = hw.peak(result.trace.precision)[0] * hw.efficiency_compute
        bandwidth = hw.memory_bandwidth_bytes_per_s * hw.efficiency_memory
        (line,) = axes.plot(xs, [min(peak, bandwidth * x) for x in xs], label=hw.name)
        points = [
            (t.intensity, layer.forward.flops / t.forward.seconds)
            for layer, t in zip(result.trace.layers, report.prediction.layers, strict=True)
            if t.intensity > 0 and t.forward.seconds > 0 and layer.forward.flops > 0
        ]
        if points:
            axes.scatter(*zip(*points, strict=True), s=12, color=line.get_color(), alpha=0.7)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    axes.set_ylabel("FLOP/s (roof: effective peak; dots: layers, forward)")
    axes.set_title(f"{result.workload.model_name}: roofline, batch {result.trace.batch_size}")
    axes.legend(fontsize=8)
    return _save(figure, path)


def _step_time(result: ProfileResult, path: Path) -> Path:
    """Total step time per device (log scale) beside where each step's time goes (shares)."""
    names = [r.hardware.name for r in result.reports]
    totals = [r.prediction.step_s for r in result.reports]
    parts = {
        "forward": [r.prediction.forward_s for r in result.reports],
        "backward": [r.prediction.backward_s for r in result.reports],
        "optimizer": [r.prediction.optimizer_s for r in result.reports],
        "host→device": [r.prediction.h2d_s for r in result.reports],
        "dlscale loop": [r.prediction.loop_s for r in result.reports],
    }
    width = max(8, 1.2 * len(names) + 4)
    figure, (left, right) = plt.subplots(1, 2, figsize=(width, 4.5))
    left.bar(names, [t * 1e3 for t in totals], color="tab:gray")
    left.set_yscale("log")
    left.set_ylabel("predicted step time (ms, log scale)")
    left.set_title(f"{result.workload.model_name}, batch {result.trace.batch_size}")
    bottom = [0.0] * len(names)
    for label, values in parts.items():
        shares = [100 * v / t for v, t in zip(values, totals, strict=True)]
        right.bar(names, shares, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, shares, strict=True)]
    right.set_ylabel("share of the step (%)")
    right.set_title("where the step goes")
    right.legend(fontsize=8)
    for axes in (left, right):
        axes.tick_params(axis="x", rotation=45)
    return _save(figure, path)


# Each plot's writer, by its file's name.
WRITERS = dict(
    zip(
        PLOT_NAMES,
        (_working_set, _memory_pie, _compute, _roofline, _step_time, _scaling),
        strict=True,
    )
)
