"""The inference prediction (`profile --inference`) as a table, fitted where it is printed
(profiler/columns.py: never a cut figure)."""

from __future__ import annotations

from rich.console import Console

from dlscale.profiler.columns import Column, print_fitted
from dlscale.units import binary_bytes, duration

# Left out first at a narrow terminal: the largest `keep`.
INFERENCE_COLUMNS = [
    Column("device", 0, "left"),
    Column("peak used", 4),
    Column("forward", 1),
    Column("samples/s", 2),
    Column("weights", 5),
    Column("live activations", 6),
    Column("fits", 3),
    Column("bound", 7, "left"),
]


def render(rows: list, console: Console) -> None:
    precision = rows[0].precision
    cells = [
        [
            row.hardware,
            row.precision_used,
            duration(row.forward_s),
            f"{row.samples_per_s:,.0f}",
            binary_bytes(row.weights_bytes),
            binary_bytes(row.activation_bytes),
            "yes" if row.fits else "[red]no[/]",
            row.bound,
        ]
        for row in rows
    ]
    fallbacks = [r.hardware for r in rows if r.precision_used != r.precision]
    notes = (
        {
            "peak used": f"{', '.join(fallbacks)}: no {precision} peak in the catalogue; "
            "their matrix products are timed at the precision shown"
        }
        if fallbacks
        else None
    )
    title = f"inference (forward only) at {precision}"
    print_fitted(console, title, INFERENCE_COLUMNS, cells, notes)
