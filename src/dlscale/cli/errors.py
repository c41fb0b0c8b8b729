"""How the CLI fails: one red line on stderr and a non-zero exit, never a traceback for users."""

from __future__ import annotations

import functools
from collections.abc import Callable
from inspect import signature
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from dlscale.errors import UserError
from dlscale.signals import Terminated

stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, exit_code: int = 2) -> typer.Exit:
    # Escaped: messages quote paths and library errors, and "[...]" in them is not markup.
    stderr.print(f"[bold red]error:[/] {escape(message)}", markup=True)
    return typer.Exit(exit_code)


def user_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn UserError into 'error: ...' + exit 2, and Ctrl-C into exit 130 (SIGTERM, raised
    as Terminated: exit 143), with the hint to continue with --resume where the command has it."""
    resumes = "resume" in signature(command).parameters

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UserError as exc:
            raise fail(str(exc), exc.exit_code) from None
        except Terminated as stop:
            stderr.print(f"[yellow]terminated (SIGTERM)[/]{_hint(stop, resumes)}", markup=True)
            raise typer.Exit(Terminated.exit_code) from None
        except KeyboardInterrupt as stop:
            stderr.print(f"[yellow]interrupted[/]{_hint(stop, resumes)}", markup=True)
            raise typer.Exit(130) from None

    return wrapper


def _hint(stop: KeyboardInterrupt, resumes: bool) -> str:
    """': ' and what to do next: the stop's own word (signals.say_on_stop; "" for nothing to
    say), else --resume where the command has it; escaped (it may name a path)."""
    hint = getattr(stop, "hint", None)
    if hint is None:  # the stop said nothing of itself (an empty hint says there is nothing)
        hint = "continue later with --resume" if resumes else ""
    return f": {escape(hint)}" if hint else ""
