"""The inference prediction (`profile --inference`) as a table."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from dlscale.units import binary_bytes, duration


def render(rows: list, console: Console) -> None:
    precision = rows[0].precision
    table = Table(title=f"inference (forward only) at {precision}", title_justify="left")
    for column in (
        "device",
        "peak used",
        "forward",
        "samples/s",
        "weights",
        "live activations",
        "fits",
        "bound",
    ):
        table.add_column(column, justify="left" if column in ("device", "bound") else "right")
    for row in rows:
        table.add_row(
            row.hardware,
            row.precision_used,
            duration(row.forward_s),
            f"{row.samples_per_s:,.0f}",
            binary_bytes(row.weights_bytes),
            binary_bytes(row.activation_bytes),
            "yes" if row.fits else "[red]no[/]",
            row.bound,
        )
    fallbacks = [r.hardware for r in rows if r.precision_used != r.precision]
    if fallbacks:
        table.caption = (
            f"{', '.join(fallbacks)}: no {precision} peak in the catalogue; "
            "their matrix products are timed at the precision shown"
        )
    console.print(table)
