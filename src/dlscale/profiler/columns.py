"""Tables that fit where they are printed: columns dropped by priority, never a cut number.

Rich squeezes a table wider than the console by cutting every cell to "…", so a 12-column
per-layer table at 80 columns showed no figure at all. Here every cell keeps its whole text; at
a terminal the least needed columns are left out until the rest fit, and the caption names
them. Piped to a file or another program, nothing is left out and nothing is cut: the table is
as wide as its widest row.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from dlscale.tables import natural_width


@dataclass(frozen=True)
class Column:
    header: str
    keep: int  # priority: columns with the largest `keep` are left out first
    justify: str = "right"


def print_fitted(
    console: Console,
    title: str,
    columns: list[Column],
    rows: list[list[str]],
    column_notes: dict[str, str] | None = None,
) -> None:
    """Print a table of `rows` (one string per column), fitted to `console` as described above;
    `column_notes` explain columns in the caption (those of columns left out are left out)."""
    shown = list(columns)
    if console.is_terminal:
        by_priority = sorted(columns, key=lambda column: column.keep)
        while (
            len(shown) > 1
            and natural_width(console, _table(title, shown, columns, rows)) > console.width
        ):
            shown.remove(by_priority.pop())
    table = _table(title, shown, columns, rows)
    left_out = [column.header for column in columns if column not in shown]
    notes = [text for header, text in (column_notes or {}).items() if header not in left_out]
    if left_out:
        wider = "a wider terminal, --json, or output to a file shows them"
        notes.append(f"not shown at {console.width} columns: {', '.join(left_out)} ({wider})")
    if notes:
        table.caption = "; ".join(notes)
        table.caption_justify = "left"
    if not console.is_terminal:
        # As wide as the table needs: a file or a pipe has no edge to fold at.
        width = max(console.width, natural_width(console, table))
        console = Console(file=console.file, width=width, highlight=False, color_system=None)
    console.print(table)


def _table(title: str, shown: list[Column], columns: list[Column], rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in shown:
        # No wrapping: a number split over two lines ("5.53" above "M") reads as two figures.
        table.add_column(column.header, justify=column.justify, no_wrap=True)
    indices = [columns.index(column) for column in shown]
    for row in rows:
        table.add_row(*(row[i] for i in indices))
    return table
