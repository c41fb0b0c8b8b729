"""The CLI's command groups: help screens without a type label on on/off flags (Typer 0.29
prints `<bool>` beside each), and no empty argument.

A flag takes no value, so a label there reads as if `--resume <bool>` wanted one. Rich help
prints an option's metavar in place of its type when one is set: an empty one for every flag
(`--help` and `--version` included) leaves the column blank.
"""

from __future__ import annotations

import typing
from pathlib import Path

from typer.core import TyperGroup

from dlscale.cli.errors import fail
from dlscale.cli.options import empty_argument


def _unlabel_flags(params: list) -> list:
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


def path_options(command) -> frozenset[str]:
    """Every option of `command` and its subcommands whose value is a path (a Typer option
    annotated Path, or a list of them)."""
    found: set[str] = set()
    for param in command.params:
        annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
        takes_path = annotation is Path or Path in typing.get_args(annotation)
        if param.param_type_name == "option" and takes_path:
            found.update(param.opts)
    for sub in getattr(command, "commands", {}).values():
        found |= path_options(sub)
    return frozenset(found)


class FlagHelpGroup(TyperGroup):
    """A command group whose own flags, and its commands' flags, show no type in help, and
    which refuses an empty argument before any command sees it."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        # The root group parses every argument first, its commands' included.
        problem = empty_argument(args, path_options(self))
        if problem is not None:
            raise fail(problem)
        return super().parse_args(ctx, args)

    def get_params(self, ctx):
        return _unlabel_flags(super().get_params(ctx))

    def get_command(self, ctx, cmd_name: str):
        command = super().get_command(ctx, cmd_name)
        if command is not None and not isinstance(command, TyperGroup):
            _unlabel_flags(command.get_params(ctx))  # the same objects its help then prints
        return command
