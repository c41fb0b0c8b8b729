"""Tables printed whole where no one is looking: the width a rich table needs with no cell cut
(`natural_width`, which profiler/columns.py fits its tables with too), and the CLI's standard
output, a Console whose tables are never cut when it is not a terminal.

At a terminal, rich fits a table to the window (cutting cells to "…" when it must; the wide
per-layer and scaling tables pick their columns instead: profiler/columns.py). Piped or
redirected to a file there is no window: rich still folds at 80 columns and cut device names and
figures ("h100-s…", "5.57" above "MiB"). Here, printed to anything but a terminal, a table of
figures is printed as wide as it needs; one with prose in it (a device's notes) as wide as its
longest word needs, its prose wrapped, so no line runs to a thousand columns. A width the user
set (COLUMNS) is kept.
"""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

UNBOUNDED_WIDTH = 1_000_000  # columns, for measuring a table's natural width
# A table whose every cell on one line fits in this many columns prints so in a file; a wider
# one (prose in its cells) wraps that prose, never cutting a word.
WHOLE_LINE_COLUMNS = 200


def measure(console: Console, table: Table) -> Measurement:
    """The table's widths unbounded: `maximum` with every cell on one line, `minimum` with its
    text wrapped at word boundaries, no word cut."""
    return Measurement.get(console, console.options.update_width(UNBOUNDED_WIDTH), table)


def natural_width(console: Console, table: Table) -> int:
    """The table's width with every cell whole, on one line."""
    return measure(console, table).maximum


class OutputConsole(Console):
    def print(self, *objects: Any, **kwargs: Any) -> None:
        tables = [each for each in objects if isinstance(each, Table)]
        if self.is_terminal or not tables or "COLUMNS" in os.environ:
            return super().print(*objects, **kwargs)
        sizes = [measure(self, table) for table in tables]
        natural = max(size.maximum for size in sizes)
        needed = natural if natural <= WHOLE_LINE_COLUMNS else max(size.minimum for size in sizes)
        if needed <= self.width:
            return super().print(*objects, **kwargs)
        saved = self._width
        self.width = needed
        try:
            return super().print(*objects, **kwargs)
        finally:
            self._width = saved


def output_console(**options: Any) -> Console:
    """A console for a command's output (highlighting off, as every command prints)."""
    return OutputConsole(highlight=False, **options)
