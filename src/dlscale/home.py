"""Where dlscale keeps per-user state ($DLSCALE_HOME, else ~/.dlscale), for every layer."""

from __future__ import annotations

import os
from pathlib import Path


def dlscale_home() -> Path:
    """Where dlscale keeps per-user state: $DLSCALE_HOME, else ~/.dlscale."""
    home = os.environ.get("DLSCALE_HOME", "").strip()
    return Path(home).expanduser() if home else Path.home() / ".dlscale"
