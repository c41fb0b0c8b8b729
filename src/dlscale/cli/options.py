"""Option values shared by the CLI's commands, parsed into Python with one-line errors."""

from __future__ import annotations

from dlscale.errors import UserError


def parse_int_list(text: str, option: str, minimum: int = 1) -> list[int]:
    """'64,128,256' -> [64, 128, 256]; anything else is a one-line UserError naming the option."""
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
    return values
