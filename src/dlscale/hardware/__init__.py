"""Hardware: what a device can do (spec), and the catalogue of known devices (catalogue)."""

from dlscale.hardware.catalogue import (
    dlscale_home,
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
    "dlscale_home",
    "get_hardware",
    "load_catalogue",
    "local_entry_path",
    "lookup",
    "parse_hardware_list",
    "save_local",
]
