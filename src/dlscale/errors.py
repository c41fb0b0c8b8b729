"""The two kinds of failure: UserError (bad input, one line, exit 2) and everything else."""

import errno


class UserError(Exception):
    """A problem with what the user gave us: a spec, a path, a name, a shape.

    Front doors print ``str(error)`` on one line and exit with ``exit_code``; no traceback.
    """

    exit_code = 2

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


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
