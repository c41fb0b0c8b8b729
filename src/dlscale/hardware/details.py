"""An entry's optional details, checked: its cores and caches, and the figures another source
gives differently (each with both sources)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from dlscale.errors import UserError

# TOML key -> whether it must be a whole number. CPUs (one socket): cores, hardware threads,
# L1 data and L2 per core, L3 per socket. GPUs: sm_count (NVIDIA SMs, AMD compute units), L2.
CORE_KEYS = {
    "cores": True,
    "threads": True,
    "sm_count": True,
    "l1d_kib_per_core": False,
    "l2_kib_per_core": False,
    "l2_mib": False,
    "l3_mib": False,
}
# A [[device.differs]] table: which figure, ours, the other source's, that source, and why.
DIFFERS_KEYS = ("figure", "ours", "theirs", "source", "why")


def cores_and_caches(entry: dict[str, Any], where: str) -> dict[str, int | float]:
    """The CORE_KEYS an entry gives, as ints or floats; threads need cores and are at least as
    many (one or more hardware threads a core)."""
    found: dict[str, int | float] = {}
    for key, whole in CORE_KEYS.items():
        if key not in entry:
            continue
        value = entry[key]
        number = value if isinstance(value, int | Decimal) and not isinstance(value, bool) else None
        if number is None or number <= 0 or (whole and Decimal(number) % 1):
            kind = "a whole number > 0" if whole else "a number > 0"
            raise UserError(f"{where}: {key} must be {kind}, not {value!r}")
        found[key] = int(number) if whole else float(number)
    if "threads" in found and found["threads"] < found.get("cores", found["threads"] + 1):
        raise UserError(f"{where}: threads needs cores, and at least as many threads as cores")
    return found


def differs(value: Any, where: str) -> tuple[dict[str, str], ...]:
    """[[device.differs]] tables: each names the figure, ours, theirs, the other source (a URL)
    and why they differ."""
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise UserError(f"{where}: differs must be an array of tables, written [[device.differs]]")
    rows = []
    for item in value:
        unknown = [key for key in item if key not in DIFFERS_KEYS]
        missing = [key for key in DIFFERS_KEYS if key not in item]
        if unknown or missing:
            bad = f"unknown key '{unknown[0]}'" if unknown else f"no '{missing[0]}'"
            raise UserError(f"{where}: a differs table has {bad} (keys: {', '.join(DIFFERS_KEYS)})")
        if not all(isinstance(item[key], str) and item[key].strip() for key in DIFFERS_KEYS):
            raise UserError(f"{where}: every differs key must be a non-empty string")
        if not item["source"].startswith("https://"):
            raise UserError(f"{where}: a differs source must be a https:// URL")
        rows.append({key: item[key] for key in DIFFERS_KEYS})
    return tuple(rows)
