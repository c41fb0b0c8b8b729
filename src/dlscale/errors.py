"""The kinds of failure: UserError (bad input, one line, exit 2), RunFailed (a run that went
wrong on its own: one line, exit 1) and everything else (dlscale's defects: a traceback)."""

import errno


class UserError(Exception):
    """A problem with what the user gave us: a spec, a path, a name, a shape.

    Front doors print ``str(error)`` on one line and exit with ``exit_code``; no traceback.
    """

    exit_code = 2

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


class CannotTrace(UserError):
    """A strategy that must trace the model on the meta device to plan its work (a pipeline's
    stages) cannot: its forward reads tensor values, or uses an op with no meta kernel. Unlike
    other meta-device failures, `train` would stop on it too, so `validate` reports it."""


class RunFailed(UserError):
    """A run that failed through no defect of dlscale's: its loss turned NaN, or the user's
    model raised at some step. One line, exit 1; the whole job stops, even where a strategy
    could train on without the worker that met it (every other worker would meet it too)."""

    def __init__(self, message: str):
        super().__init__(message, exit_code=1)


def once_each(option: str, values) -> None:
    """A list option's values, each at most once: a value given twice would be run, measured
    or predicted twice (or once, silently, where it was deduplicated): refused, naming it."""
    seen = []
    for value in values:
        if value in seen:
            raise UserError(f"{option}: {value} is given twice")
        seen.append(value)


def a_or_an(word: str) -> str:
    """'an int', 'a str': the article a type's name takes (by its first letter)."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def one_line(text: str, limit: int = 300) -> str:
    """First non-empty line of an exception message, trimmed, for one-line error reports."""
    for line in str(text).splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return str(text).strip()[:limit]


def os_reason(exc: OSError) -> str:
    """The operating system's words for a failed call, as a line reads them: 'no space left on
    device (ENOSPC)'."""
    words = exc.strerror or str(exc)
    code = errno.errorcode.get(exc.errno or 0)
    return words[:1].lower() + words[1:] + (f" ({code})" if code else "")


LOST_PEER = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "EOF")


def lost_peer(failure: str) -> bool:
    """Does a worker's failure say a peer's connection broke (rather than its own error)?"""
    return any(sign in failure for sign in LOST_PEER)
