"""`dlscale bench link`: the link between two hosts of a Ray cluster, measured and saved."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from dlscale.api import bench
from dlscale.cli.errors import user_errors
from dlscale.tables import output_console
from dlscale.units import duration

console = output_console()


@user_errors
def link_command(
    cluster: str = typer.Option("ray", "--cluster", help="ray: two hosts of a Ray cluster."),
    address: str | None = typer.Option(None, "--address", help="Ray cluster address (HEAD:PORT)."),
    hosts: str | None = typer.Option(
        None, "--hosts", help="The two node addresses A,B (default: this node and another)."
    ),
    name: str | None = typer.Option(
        None, "--name", help="Save the link under this name (default link-A-B)."
    ),
    quick: bool = typer.Option(False, "--quick", help="Two sizes, fewer rounds (seconds)."),
    out: Path | None = typer.Option(
        None, "--out", help="Output folder for the JSON and PNG (default runs/bench-link-<time>)."
    ),
    no_save: bool = typer.Option(False, "--no-save", help="Do not save it as a named link."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
) -> None:
    """Measure all-reduce and point-to-point rates between two hosts; save as a named link."""
    bench.check_out_dir(out, "link")
    pair = [part.strip() for part in hosts.split(",")] if hosts else None
    bench.check_link_cluster(cluster)
    if not as_json:
        console.print("measuring the link (a minute; --quick: seconds) ...")
    result = bench.bench_link(cluster, address, pair, name, quick)
    json_path, png_path = bench.write_outputs("link", result, out)
    saved = None if no_save else bench.save_link(result)
    result["saved"] = str(saved) if saved else None
    if as_json:
        print(json.dumps(result, indent=2))
        return
    console.print(link_table(result))
    console.print(f"wrote {json_path} and {png_path}")
    if saved:
        console.print(f"saved as link '{result['name']}': {saved}")


def link_table(result: dict) -> Table:
    first, second = result["hosts"]
    table = Table(title=f"the link between {first} and {second} (gloo)")
    for column in ("what", "bandwidth", "latency", "worst fit error"):
        table.add_column(column, justify="left" if column == "what" else "right")
    for key, label in (("allreduce", "all-reduce (2 ranks)"), ("p2p", "point-to-point, one way")):
        fit = result[key]
        table.add_row(
            label,
            f"{fit['bytes_per_s'] / 1e6:,.1f} MB/s ({fit['bytes_per_s'] * 8 / 1e6:,.0f} Mbit/s)",
            duration(fit["latency_s"]),
            f"{fit['fit_max_error']:.0%}",
        )
    if "contention" in result["allreduce"]:  # what the scaling model multiplies it by in training
        allreduce = result["allreduce"]
        low, high = allreduce["contention_quartiles"]
        table.caption = (
            f"the all-reduce beside compute: ×{allreduce['contention']:.2f} its time alone "
            f"(quartiles ×{low:.2f}–{high:.2f})"
        )
    return table
