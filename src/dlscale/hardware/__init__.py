"""Hardware: what a device can do (device), and the catalogue of known devices (catalogue)."""

from dlscale.hardware.catalogue import (
    get_hardware,
    load_catalogue,
    local_entry_path,
    lookup,
    parse_hardware_list,
    save_local,
)
from dlscale.hardware.device import PRECISIONS, Hardware

__all__ = [
    "PRECISIONS",
    "Hardware",
    "get_hardware",
    "load_catalogue",
    "local_entry_path",
    "lookup",
    "parse_hardware_list",
    "save_local",
]
