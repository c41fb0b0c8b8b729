"""The `bench io` plot: storage, decoding and the model in samples/s, the bound highlighted."""

from __future__ import annotations

import textwrap

from matplotlib.figure import Figure

MEGA = 1e6


def io_bars(result: dict) -> list[tuple[str, float, bool]]:
    """(label, samples/s, whether it is the bound) for each measurement, top to bottom: the
    bound is the better storage figure, the workers' decoding together, or the model."""
    per_sample = result["disk_bytes_per_sample"]
    one, many = result["storage_one_reader"], result["storage_readers"]
    worker = result["decode_one_worker"]["samples_per_s"]
    workers = result["loader_workers"]
    storage = [one["read_bytes_per_s"] / per_sample, many["read_bytes_per_s"] / per_sample]
    bound = result["bound"]
    best = storage.index(max(storage)) if bound == "storage" else None
    bars = [
        ("storage, 1 reader", storage[0], best == 0),
        (f"storage, {many['readers']} readers", storage[1], best == 1),
        ("decode, 1 loader worker", worker, bound == "decode" and workers <= 1),
    ]
    if workers > 1:
        bars.append((f"decode, {workers} loader workers", worker * workers, bound == "decode"))
    model = result["model_step"]["samples_per_s"]
    return [*bars, (f"model step ({result['device']})", model, bound == "model")]


def plot_io(figure: Figure, result: dict) -> None:
    """Horizontal bars in samples/s (MB/s of the files on the top axis); the bound in red."""
    axes = figure.add_subplot()
    bars = io_bars(result)[::-1]  # barh draws bottom-up
    colours = ["tab:red" if is_bound else "tab:blue" for _, _, is_bound in bars]
    rates = [rate for _, rate, _ in bars]
    # Storage, decoding and the model often differ by orders of magnitude: a log axis.
    axes.barh([label for label, _, _ in bars], rates, color=colours, log=True)
    for index, (_, rate, _) in enumerate(bars):
        axes.annotate(f" {rate:,.0f}", (rate, index), va="center", fontsize=8)
    axes.set_xlim(min(rates) / 3, max(rates) * 4)  # room for the labels
    axes.set_xlabel("samples/s (the bound in red)")
    per_sample = result["disk_bytes_per_sample"]
    top = axes.secondary_xaxis(
        "top", functions=(lambda s: s * per_sample / MEGA, lambda mb: mb * MEGA / per_sample)
    )
    top.set_xlabel(f"MB/s of the data's files ({per_sample / 1e3:,.1f} kB a sample)")
    axes.grid(True, axis="x", which="both", alpha=0.3)
    cache = "page cache dropped" if result["page_cache_dropped"] else "page cache NOT dropped"
    title = (
        f"{result['spec']}: {result['data']} data, {result['model']}, batch "
        f"{result['batch_size']} ({cache}). {result['verdict']}"
    )
    axes.set_title("\n".join(textwrap.wrap(title, 110)), fontsize=9)
