"""The CLI's standard output: a rich Console whose tables are never cut where no one is looking.

At a terminal, rich fits a table to the window (cutting cells to "…" when it must; the wide
per-layer and scaling tables pick their columns instead: profiler/columns.py). Piped or
redirected to a file there is no window: rich still folds at 80 columns and cut device names and
figures ("h100-s…", "5.57" above "MiB"). Here, printed to anything but a terminal, a table is
printed as wide as it needs, so every figure in a file or a pipe is whole.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

UNBOUNDED_WIDTH = 1_000_000  # columns, for measuring a table's natural width


class OutputConsole(Console):
    def print(self, *objects: Any, **kwargs: Any) -> None:
        tables = [each for each in objects if isinstance(each, Table)]
        if self.is_terminal or not tables:
            return super().print(*objects, **kwargs)
        options = self.options.update_width(UNBOUNDED_WIDTH)
        natural = max(Measurement.get(self, options, table).maximum for table in tables)
        if natural <= self.width:
            return super().print(*objects, **kwargs)
        saved = self._width
        self.width = natural
        try:
            return super().print(*objects, **kwargs)
        finally:
            self._width = saved


def output_console(**options: Any) -> Console:
    """A console for a command's output (highlighting off, as every command prints)."""
    return OutputConsole(highlight=False, **options)
