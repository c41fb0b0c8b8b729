"""A closed standard output (`dlscale train ... | head -1`): the command goes on without it.

The first write after the reader left raises BrokenPipeError, and Rich turns that into
SystemExit(1) inside whatever was printing: a run of hours ended because `head` had read its
line, its record never finished, and not a word said. Guarded, the command's streams instead
point their file descriptor at /dev/null on the first broken write (what is still buffered, and
Python's flush at exit, then go nowhere rather than fail again), say so once on stderr, and let
the work go on: the run trains to its end and writes its record, and the exit code is the run's.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

CLOSED_NOTE = (
    "warning: standard output was closed (the command reading it ended): dlscale goes on "
    "without printing there, and finishes its work (what it writes to files, it writes)\n"
)


class _Guarded:
    """A text stream whose writes survive its reader leaving; everything else is the stream's."""

    def __init__(self, stream: TextIO, note: str | None):
        self._stream = stream
        self._note = note  # said on stderr when this stream's reader leaves
        self.reader_left = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._lost()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._lost()

    def _lost(self) -> None:
        if self.reader_left:
            return
        self.reader_left = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)
        if self._note is not None:
            sys.stderr.write(self._note)
            sys.stderr.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding: the stream's own
        return getattr(self._stream, name)


def guard_streams() -> None:
    """Guard stdout and stderr of this process (the `dlscale` command, before any output)."""
    if not isinstance(sys.stderr, _Guarded) and sys.stderr is not None:
        sys.stderr = _Guarded(sys.stderr, None)  # type: ignore[assignment]
    if not isinstance(sys.stdout, _Guarded) and sys.stdout is not None:
        sys.stdout = _Guarded(sys.stdout, CLOSED_NOTE)  # type: ignore[assignment]


def stdout_closed() -> bool:
    """Whether this process's standard output lost its reader (and went to /dev/null)."""
    return isinstance(sys.stdout, _Guarded) and sys.stdout.reader_left
