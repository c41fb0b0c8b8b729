"""`bench link`'s plot: time against message size between two hosts, measured and fitted."""

from __future__ import annotations

from matplotlib.figure import Figure


def plot_link(figure: Figure, result: dict) -> None:
    axes = figure.add_subplot(1, 1, 1)
    for key, label, color in (
        ("allreduce", "all-reduce", "tab:blue"),
        ("p2p", "one way", "tab:orange"),
    ):
        fit = result[key]
        sizes = sorted(int(size) for size in fit["timed"])
        timed = [fit["timed"][str(size)] * 1e3 for size in sizes]
        axes.plot(sizes, timed, "o", color=color, label=f"{label}, measured")
        hops = 2 if key == "allreduce" else 1  # two ranks' ring: 2 steps of half the tensor
        modelled = [(hops * fit["latency_s"] + size / fit["bytes_per_s"]) * 1e3 for size in sizes]
        rate = fit["bytes_per_s"] / 1e6
        axes.plot(
            sizes,
            modelled,
            "-",
            color=color,
            alpha=0.6,
            label=f"{label}, fitted: {rate:,.1f} MB/s, {fit['latency_s'] * 1e6:,.0f} µs",
        )
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("bytes per message")
    axes.set_ylabel("ms")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    first, second = result["hosts"]
    figure.suptitle(f"the link between {first} and {second} (gloo)")
