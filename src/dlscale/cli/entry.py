"""The `dlscale` command's entry point: the command's own imports (torch's among them, seconds
on a busy machine) done first, so that Ctrl-C while they run ends the command with one line and
exit code 130 instead of the interrupted import's 40-line traceback (found by trying it); from
then on cli/main.py and signals.py decide what a stop does."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from dlscale.cli.main import main as run
    except KeyboardInterrupt:
        sys.stderr.write("dlscale: interrupted while starting\n")
        raise SystemExit(130) from None
    run()
