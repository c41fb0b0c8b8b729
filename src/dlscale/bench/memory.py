"""How much memory a bench may take: what is free on a device, and the share one measurement uses.

A bench that allocated past the free memory would end in an allocator traceback (or, on a host
with overcommit, be killed by the kernel); a size over the share is skipped with a note instead.
"""

from __future__ import annotations

import os

from dlscale.units import binary_bytes

# Half the free memory: the rest is left to the allocator's slack, torch's workspaces and
# whatever else the machine runs meanwhile.
MEMORY_SHARE = 0.5


def over_share(need_bytes: int, free_bytes: int, where: str = "") -> str | None:
    """Why a measurement needing `need_bytes` is skipped, or None when it fits in the share."""
    if need_bytes <= MEMORY_SHARE * free_bytes:
        return None
    place = f" on {where}" if where else ""
    return (
        f"needs ~{binary_bytes(need_bytes)}, over {MEMORY_SHARE:.0%} of the "
        f"{binary_bytes(free_bytes)} free{place}"
    )


def load_averages() -> list[float] | None:
    """Runnable processes averaged over 1, 5 and 15 minutes (None where the system does not
    say): recorded with measurements, since a busy machine slows every figure."""
    try:
        return list(os.getloadavg())
    except (OSError, AttributeError):
        return None
