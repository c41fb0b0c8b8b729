"""Option values shared by the CLI's commands, parsed into Python with one-line errors."""

from __future__ import annotations

import json

from dlscale.errors import UserError, once_each


def parse_int_list(text: str, option: str, minimum: int = 1, once: bool = False) -> list[int]:
    """'64,128,256' -> [64, 128, 256]; anything else is a one-line UserError naming the option.
    `once`: a list of counts to run or predict one each (not a shape), where a value given twice
    would be run twice: refused."""
    values = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = int(part)
        except ValueError:
            raise UserError(
                f"{option}: '{part}' is not an integer (give a comma-separated list, e.g. 64,128)"
            ) from None
        if value < minimum:
            raise UserError(f"{option}: {value} is below the minimum of {minimum}")
        values.append(value)
    if once:
        once_each(option, values)
    return values


HERE = " (for the current folder, give .)"


def empty_argument(
    args: list[str], path_options: frozenset[str] = frozenset(), positional_path: bool = False
) -> str | None:
    """What is wrong with the first empty argument (`--out ""`, `--out=`), or None.

    A path given as "" becomes Path(""), the current folder, so an empty name quietly meant
    "here" (a run trained into the folder it was started from); no option takes an empty value.
    For an option in `path_options`, or a positional argument where the command takes a path
    (`positional_path`), the message says how to name the current folder.
    """

    def empty(option: str) -> str:
        return f"{option}: an empty value names nothing{HERE if option in path_options else ''}"

    for index, arg in enumerate(args):
        if arg.startswith("--") and arg.endswith("="):
            return empty(arg[:-1])
        if not arg.strip():
            option = args[index - 1] if index and args[index - 1].startswith("-") else None
            if option is not None:
                return empty(option)
            return "an empty argument names nothing" + (HERE if positional_path else "")
    return None


def parse_kwargs(text: str | None) -> dict | None:
    """`--kwargs '{"hidden": [64]}'`: a JSON object; one given a key twice is refused, since
    json.loads keeps the last value silently and the model would be built from a setting its
    writer may not have meant (as a spec's duplicate YAML keys are refused)."""
    if not text:
        return None

    def unique(pairs: list[tuple[str, object]]) -> dict:
        found: dict = {}
        for key, value in pairs:
            if key in found:
                raise UserError(f"--kwargs: the key '{key}' is given twice")
            found[key] = value
        return found

    try:
        value = json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as exc:
        raise UserError(f"--kwargs is not valid JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise UserError("--kwargs must be a JSON object, e.g. '{\"hidden\": [64]}'")
    return value
