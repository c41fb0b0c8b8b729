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


def _takes_path(param) -> bool:
    """A parameter annotated Path (or a list of them): Typer's descriptor, else click's type."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if annotation is not None:
        return annotation is Path or Path in typing.get_args(annotation)
    return type(getattr(param, "type", None)).__name__ == "Path"


def path_options(command) -> frozenset[str]:
    """Every option of `command` and its subcommands whose value is a path."""
    found: set[str] = set()
    for param in command.params:
        if param.param_type_name == "option" and _takes_path(param):
            found.update(param.opts)
    for sub in getattr(command, "commands", {}).values():
        found |= path_options(sub)
    return frozenset(found)


def positional_takes_path(group, args: list[str]) -> bool:
    """Whether the command `args` name (their leading subcommand names) takes a path as a
    positional argument."""
    command = group
    for arg in args:
        sub = getattr(command, "commands", {}).get(arg)
        if sub is None:
            break
        command = sub
    return any(p.param_type_name == "argument" and _takes_path(p) for p in command.params)


class FlagHelpGroup(TyperGroup):
    """A command group whose own flags, and its commands' flags, show no type in help, and
    which refuses an empty argument before any command sees it."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        # The root group parses every argument first, its commands' included.
        problem = empty_argument(args, path_options(self), positional_takes_path(self, args))
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
