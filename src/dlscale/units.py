"""Human-readable numbers: bytes in binary units, counts with SI prefixes, durations."""

from __future__ import annotations

import re

_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(value: object) -> object:
    """'512MiB', '1.5 GB' or 2048 -> bytes as an int; anything else is returned for the caller's
    validation to reject."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if not match or match.group(2).lower() not in _BYTE_UNITS:
            raise ValueError(f"'{value}' is not a size: use bytes or e.g. 512MiB, 1.5GB")
        return int(float(match.group(1)) * _BYTE_UNITS[match.group(2).lower()])
    return value


SECONDS_PER = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds in "30d", "12h", "90m" or "3600s" (a whole or decimal number > 0, then a unit);
    ValueError otherwise, for the caller to name its option."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", str(text))
    if not found or float(found.group(1)) <= 0:
        raise ValueError(f"'{text}': expected a number > 0 and a unit s, m, h or d (e.g. 30m, 2h)")
    return float(found.group(1)) * SECONDS_PER[found.group(2)]


def binary_bytes(count: float) -> str:
    """3 * 2**20 -> '3 MiB'."""
    for factor, prefix in (
        (2**60, "Ei"),
        (2**50, "Pi"),
        (2**40, "Ti"),
        (2**30, "Gi"),
        (2**20, "Mi"),
        (2**10, "Ki"),
    ):
        if abs(count) >= factor:
            return f"{count / factor:.3g} {prefix}B"
    return f"{int(count)} B"


def si(value: float, unit: str = "") -> str:
    """1234567 -> '1.23 M'."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}".rstrip()


def duration(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 2 * 86400:  # "1,000 epochs would take 90 days", not "2160 h"
        return f"{value / 86400:,.1f} days"
    if value >= 3600:
        return f"{value / 3600:.2f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} µs"
