"""How the CLI fails: one red line on stderr and a non-zero exit, never a traceback for users."""

from __future__ import annotations

import functools
from collections.abc import Callable
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
    """Turn UserError into 'error: ...' + exit 2, and Ctrl-C into a hint + exit 130 (SIGTERM,
    raised as Terminated: the same hint, exit 143)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UserError as exc:
            raise fail(str(exc), exc.exit_code) from None
        except Terminated:
            stderr.print("[yellow]terminated (SIGTERM)[/]: continue later with --resume")
            raise typer.Exit(Terminated.exit_code) from None
        except KeyboardInterrupt:
            stderr.print("[yellow]interrupted[/]: continue later with --resume", markup=True)
            raise typer.Exit(130) from None

    return wrapper
