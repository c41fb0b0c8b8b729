"""The hardware catalogue: the shipped TOML plus the user's own files, checked and turned to SI.

Entries are read in this order, and a later entry with the same name replaces an earlier one:
the shipped `catalogue.toml`, then every `*.toml` in `$DLSCALE_HOME/hardware/` (default
`~/.dlscale/hardware/`, sorted by file name; `dlscale bench machine` saves `local.toml` there),
then the `extra_files` a caller passes (the CLI's `--hardware-file`), in the order given.
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

from dlscale.atomic import write_atomic
from dlscale.errors import UserError
from dlscale.hardware.details import CORE_KEYS, cores_and_caches, differs
from dlscale.hardware.device import PRECISIONS, Hardware
from dlscale.hardware.mig import mig_slice, parse_mig, split_name
from dlscale.home import dlscale_home

KINDS = ("cpu", "gpu", "tpu")
GIB = 2**30
SHIPPED_LABEL = "dlscale/hardware/catalogue.toml"

# TOML key -> Hardware field, for the keys copied as they are.
_PLAIN_TEXT = {
    "display_name": "display_name",
    "vendor": "vendor",
    "notes": "notes",
    "price_source": "price_source",
    "price_date": "price_date",
    "efficiency_source": "efficiency_source",
    "interconnect_link": "interconnect_link",
}
_PLAIN_NUMBERS = ("tdp_w", "compute_efficiency", "memory_efficiency", "price_per_hour")
# TOML key in human units -> (Hardware field, power of ten from the file's unit to SI).
_SCALED = {
    "memory_bandwidth_gbs": ("memory_bandwidth_bytes_per_s", 9),
    "host_link_gbs": ("host_link_bytes_per_s", 9),
    "interconnect_gbs": ("interconnect_bytes_per_s", 9),
    "op_overhead_us": ("op_overhead_s", -6),
}
_PEAK_EXPONENT = 12  # TFLOP/s (int8, int4: TOPS) -> FLOP/s
REQUIRED_KEYS = (
    "name",
    "display_name",
    "kind",
    "vendor",
    "peak_tflops",
    "memory_gib",
    "memory_bandwidth_gbs",
)
KEYS = (
    *REQUIRED_KEYS,
    "host_link",
    "host_link_gbs",
    "interconnect",
    "interconnect_gbs",
    "interconnect_link",
    "tdp_w",
    "price_per_hour",
    "price_source",
    "price_date",
    "compute_efficiency",
    "compute_efficiency_by_precision",
    "efficiency_source",
    "winograd_convs",
    "memory_efficiency",
    "op_overhead_us",
    "sources",
    "notes",
    "measured",
    "systolic",
    *CORE_KEYS,
    "differs",
    "mig",
)
# A systolic array description: its keys, and whether each must be a whole number.
SYSTOLIC_KEYS = {"rows": True, "cols": True, "arrays": True, "clock_mhz": False, "sram_kib": False}
_NAME = re.compile(r"[a-z0-9][a-z0-9._+-]*")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def local_entry_path() -> Path:
    """The `local` entry that `dlscale bench machine` writes after measuring this machine."""
    return dlscale_home() / "hardware" / "local.toml"


def user_files() -> list[Path]:
    """The user's catalogue files: every *.toml in $DLSCALE_HOME/hardware/, by name."""
    folder = dlscale_home() / "hardware"
    return sorted(folder.glob("*.toml")) if folder.is_dir() else []


def load_catalogue(extra_files: list[Path] | None = None) -> dict[str, Hardware]:
    """Every known device by name: shipped, then user files, then `extra_files` (later wins)."""
    shipped = resources.files("dlscale.hardware") / "catalogue.toml"
    sources = [(SHIPPED_LABEL, shipped.read_text(encoding="utf-8"))]
    for path in [*user_files(), *(Path(p) for p in extra_files or [])]:
        sources.append((str(path), read_hardware_file(path)))
    catalogue: dict[str, Hardware] = {}
    for label, text in sources:
        for hardware in parse_catalogue(text, label):
            catalogue[hardware.name] = hardware
    return catalogue


def lookup(catalogue: dict[str, Hardware], name: str) -> Hardware:
    """One device of a loaded catalogue by name, case-insensitively; UserError if unknown.
    'PARENT:PROFILE' ('a100-40gb:1g.5gb') is a MIG slice of a catalogue GPU (hardware/mig.py)."""
    key = name.strip().lower()
    if key in catalogue:
        return catalogue[key]
    parts = split_name(key)
    if parts is not None:
        return mig_slice(lookup(catalogue, parts[0]), parts[1])
    if key == "local":
        raise UserError(
            f"no 'local' hardware entry in {local_entry_path()}: "
            "run 'dlscale bench machine' first to measure this machine"
        )
    near = [known for known in catalogue if known.startswith(key)]
    near = near or difflib.get_close_matches(key, list(catalogue), n=3)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise UserError(f"unknown hardware '{name}'{hint} (known: {', '.join(catalogue)})")


def get_hardware(name: str, extra_files: list[Path] | None = None) -> Hardware:
    """One device by name (case-insensitive), from the full catalogue."""
    return lookup(load_catalogue(extra_files), name)


def parse_hardware_list(text: str, extra_files: list[Path] | None = None) -> list[Hardware]:
    """A comma-separated list of names ("a100-40gb,h100-sxm") -> the devices, in that order."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise UserError("no hardware named: give names separated by commas, e.g. 'a100-40gb,l4'")
    catalogue = load_catalogue(extra_files)
    return [lookup(catalogue, name) for name in names]


def read_hardware_file(path: Path) -> str:
    """A user's hardware file's text; one line where it is missing, no regular file, or
    unreadable."""
    if not path.exists():
        raise UserError(f"{path}: hardware file not found")
    if not path.is_file():
        raise UserError(f"{path}: not a regular file: give a hardware file (TOML)")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read hardware file: {exc}") from None


# ----------------------------------------------------------------------------- reading and checks


def parse_catalogue(text: str, label: str) -> list[Hardware]:
    """The devices of one catalogue file's text; `label` names the file in every error."""
    # Floats are read as Decimal so that unit conversion is exact: 19.5 TFLOP/s becomes exactly
    # 1.95e13, and what save_local writes reads back bit for bit.
    try:
        document = tomllib.loads(text, parse_float=Decimal)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{label}: not valid TOML: {exc}") from None
    # [[link]] tables may sit beside the devices; dlscale.hardware.links reads them.
    extra = sorted(set(document) - {"device", "link"})
    if extra:
        raise UserError(
            f"{label}: unknown top-level key '{extra[0]}' (expected [[device]] or [[link]] tables)"
        )
    entries = document.get("device", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UserError(f"{label}: 'device' must be an array of tables, written [[device]]")
    devices: list[Hardware] = []
    for index, entry in enumerate(entries, start=1):
        hardware = parse_entry(entry, f"{label}: device '{entry.get('name', f'#{index}')}'")
        if any(d.name == hardware.name for d in devices):
            raise UserError(f"{label}: device '{hardware.name}' appears twice in this file")
        devices.append(hardware)
    return devices


def parse_entry(entry: dict[str, Any], where: str) -> Hardware:
    """One [[device]] table -> Hardware in SI units; UserError prefixed by `where` if bad."""
    unknown = [key for key in entry if key not in KEYS]
    if unknown:
        raise UserError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(KEYS)})")
    missing = [key for key in REQUIRED_KEYS if key not in entry]
    if missing:
        raise UserError(f"{where}: missing required key '{missing[0]}'")
    name = _text(entry, "name", where)
    if not _NAME.fullmatch(name):
        raise UserError(f"{where}: name must be lowercase letters, digits and '.', '_', '-', '+'")
    kind = _text(entry, "kind", where)
    if kind not in KINDS:
        raise UserError(f"{where}: kind '{kind}' is not one of {', '.join(KINDS)}")
    fields: dict[str, Any] = {"name": name, "kind": kind}
    for key, field_name in _PLAIN_TEXT.items():
        if key in entry:
            fields[field_name] = _text(entry, key, where)
    for key in _PLAIN_NUMBERS:
        if key in entry:
            fields[key] = float(_number(entry, key, where))
    for key, (field_name, exponent) in _SCALED.items():
        if key in entry:
            fields[field_name] = float(_number(entry, key, where).scaleb(exponent))
    fields["memory_bytes"] = int((_number(entry, "memory_gib", where) * GIB).to_integral_value())
    fields["peak_flops"] = _peaks(entry["peak_tflops"], where)
    if "compute_efficiency_by_precision" in entry:
        fields["compute_efficiency_by_precision"] = _efficiencies(
            entry["compute_efficiency_by_precision"], fields["peak_flops"], where
        )
    if "winograd_convs" in entry:
        if not isinstance(entry["winograd_convs"], bool):
            raise UserError(f"{where}: winograd_convs must be true or false")
        fields["winograd_convs"] = entry["winograd_convs"]
    fields.update(_links(entry, where))
    if "price_per_hour" in entry and not {"price_source", "price_date"} <= set(entry):
        raise UserError(f"{where}: a price_per_hour needs its price_source and price_date")
    fields["sources"] = tuple(_sources(entry.get("sources", []), where))
    fields["measured"] = (
        _plain_values(_table(entry, "measured", where)) if "measured" in entry else {}
    )
    if "systolic" in entry:
        fields["systolic"] = _systolic(_table(entry, "systolic", where), where)
    fields.update(cores_and_caches(entry, where))
    if "differs" in entry:
        fields["differs"] = differs(entry["differs"], where)
    if "mig" in entry:
        if "sm_count" not in entry:
            raise UserError(f"{where}: a mig table needs the GPU's sm_count")
        fields["mig"] = parse_mig(entry["mig"], where)
    return Hardware(**fields)


def _systolic(table: dict[str, Any], where: str) -> dict[str, float]:
    """rows × cols PEs per array, arrays per chip (default 1), clock, on-chip SRAM."""
    unknown = [key for key in table if key not in SYSTOLIC_KEYS]
    if unknown:
        raise UserError(
            f"{where}: systolic has unknown key '{unknown[0]}' (known: {', '.join(SYSTOLIC_KEYS)})"
        )
    found: dict[str, float] = {"arrays": 1}
    for key, whole in SYSTOLIC_KEYS.items():
        if key not in table:
            if key == "arrays":
                continue
            raise UserError(f"{where}: systolic needs {key}")
        value = table[key]
        number = value if isinstance(value, int | Decimal) and not isinstance(value, bool) else None
        if number is None or number < 1 or (whole and Decimal(number) % 1):
            kind = "a whole number ≥ 1" if whole else "a number ≥ 1"
            raise UserError(f"{where}: systolic.{key} must be {kind}, not {value!r}")
        found[key] = int(number) if whole else float(number)
    return found


def _text(entry: dict[str, Any], key: str, where: str) -> str:
    value = entry[key]
    if not isinstance(value, str) or (key != "notes" and not value.strip()):
        raise UserError(f"{where}: {key} must be a non-empty string")
    return value


def _number(entry: dict[str, Any], key: str, where: str, at_most: int | None = None) -> Decimal:
    """A positive finite number (efficiencies, and any number given `at_most`, at most that or
    1; the op overhead may be 0)."""
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, int | Decimal):
        raise UserError(f"{where}: {key} must be a number, not {value!r}")
    number = Decimal(value)
    allow_zero = key == "op_overhead_us"
    if not number.is_finite() or number < 0 or (number == 0 and not allow_zero):
        bound = "≥ 0" if allow_zero else "> 0"
        raise UserError(f"{where}: {key} must be a finite number {bound}, not {value}")
    if key.endswith("_efficiency"):
        at_most = 1
    if at_most is not None and number > at_most:
        raise UserError(f"{where}: {key} is a fraction of peak and must be ≤ 1, not {value}")
    return number


def _table(entry: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    if not isinstance(entry[key], dict):
        raise UserError(f"{where}: {key} must be a table, e.g. {key} = {{ ... }}")
    return entry[key]


def _peaks(table: Any, where: str) -> dict[str, float]:
    if not isinstance(table, dict):
        raise UserError(f"{where}: peak_tflops must be a table, e.g. {{ fp32 = 19.5 }}")
    unknown = [key for key in table if key not in PRECISIONS]
    if unknown:
        raise UserError(
            f"{where}: peak_tflops has unknown precision '{unknown[0]}' "
            f"(known: {', '.join(PRECISIONS)})"
        )
    if "fp32" not in table:
        raise UserError(f"{where}: peak_tflops needs an fp32 figure")
    return {
        precision: float(_number(table, precision, f"{where}: peak_tflops").scaleb(_PEAK_EXPONENT))
        for precision in PRECISIONS
        if precision in table
    }


def _efficiencies(table: Any, peaks: dict[str, float], where: str) -> dict[str, float]:
    """precision -> share of that precision's peak (0 < share ≤ 1), for precisions with a peak."""
    key = "compute_efficiency_by_precision"
    if not isinstance(table, dict):
        raise UserError(f"{where}: {key} must be a table, e.g. {{ fp32 = 0.8, bf16 = 0.6 }}")
    missing = [precision for precision in table if precision not in peaks]
    if missing:
        raise UserError(
            f"{where}: {key} has '{missing[0]}', which peak_tflops does not list "
            f"(listed: {', '.join(peaks)})"
        )
    label = f"{where}: {key}"
    return {precision: float(_number(table, precision, label, 1)) for precision in table}


def _links(entry: dict[str, Any], where: str) -> dict[str, Any]:
    """host_link/interconnect: a name and a rate, given together or not at all."""
    fields: dict[str, Any] = {}
    for key in ("host_link", "interconnect"):
        rate_key = f"{key}_gbs"
        if (key in entry) != (rate_key in entry):
            raise UserError(f"{where}: give {key} and {rate_key} together, or neither")
        if key in entry:
            fields[key] = _text(entry, key, where)
    return fields


def _sources(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(s, str) and s.strip() for s in value):
        raise UserError(f"{where}: sources must be a list of URLs (strings)")
    return value


def _plain_values(value: Any) -> Any:
    """Decimals (how floats are read) back to floats, through tables and arrays."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dict):
        return {key: _plain_values(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain_values(item) for item in value]
    return value


# ----------------------------------------------------------------------------- writing


def save_local(hardware: Hardware) -> Path:
    """Write the measured `local` entry to local_entry_path(), atomically; returns the path."""
    assert hardware.name == "local", f"save_local writes the 'local' entry, got {hardware.name!r}"
    path = local_entry_path()
    text = (
        "# This machine as measured by 'dlscale bench machine'; run it again to refresh.\n"
        + entry_to_toml(hardware)
    )
    parse_catalogue(text, str(path))  # what we write must read back
    write_atomic(path, lambda handle: handle.write(text.encode("utf-8")))
    return path


def entry_to_toml(hardware: Hardware) -> str:
    """One [[device]] table in the catalogue's schema and human units; reads back equal."""
    lines = ["[[device]]"]
    scalars: dict[str, Any] = {
        "name": hardware.name,
        "display_name": hardware.display_name,
        "kind": hardware.kind,
        "vendor": hardware.vendor,
        # bytes / 2**30 is exact in binary floating point, and its repr is within a
        # millionth of a byte of it once scaled back, so rounding recovers the byte count.
        "memory_gib": _Raw(repr(hardware.memory_bytes / GIB)),
        "host_link": hardware.host_link,
        "interconnect": hardware.interconnect,
        "interconnect_link": hardware.interconnect_link,
        "tdp_w": hardware.tdp_w,
        "price_per_hour": hardware.price_per_hour,
        "price_source": hardware.price_source,
        "price_date": hardware.price_date,
        "compute_efficiency": hardware.compute_efficiency,
        "efficiency_source": hardware.efficiency_source,
        "winograd_convs": hardware.winograd_convs or None,
        "memory_efficiency": hardware.memory_efficiency,
        "sources": list(hardware.sources),
        "notes": hardware.notes,
        **{key: getattr(hardware, key) for key in CORE_KEYS},
    }
    for key, (field_name, exponent) in _SCALED.items():
        scalars[key] = _shifted(getattr(hardware, field_name), -exponent)
    for key in KEYS:
        if scalars.get(key) is not None:
            lines.append(f"{key} = {_toml_value(scalars[key])}")
    lines.append("")
    lines.append("[device.peak_tflops]")
    for precision, flops in hardware.peak_flops.items():
        lines.append(f"{precision} = {_toml_value(_shifted(flops, -_PEAK_EXPONENT))}")
    if hardware.compute_efficiency_by_precision:
        lines.extend(
            _toml_table(
                "device.compute_efficiency_by_precision", hardware.compute_efficiency_by_precision
            )
        )
    if hardware.measured:
        lines.extend(_toml_table("device.measured", hardware.measured))
    if hardware.mig:
        lines.extend(_toml_table("device.mig", hardware.mig))
    for row in hardware.differs:
        lines.extend(["", "[[device.differs]]"])
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in row.items())
    return "\n".join(lines) + "\n"


class _Raw(str):
    """Text already in TOML form (a number), written as it is."""


def _shifted(value: float | None, exponent: int) -> _Raw | None:
    """An SI value in the file's unit, as exact decimal text (a power-of-ten shift of its repr)."""
    if value is None:
        return None
    return _Raw(format(Decimal(repr(float(value))).scaleb(exponent), "f"))


def _toml_table(header: str, table: dict[str, Any]) -> list[str]:
    lines = ["", f"[{header}]"]
    nested = {key: value for key, value in table.items() if isinstance(value, dict)}
    for key, value in table.items():
        if key not in nested:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in nested.items():
        lines.extend(_toml_table(f"{header}.{_toml_key(key)}", value))
    return lines


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, _Raw):
        return str(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)  # Python's repr of a float (1e-05, inf, nan) is valid TOML
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} to TOML")


def _toml_string(text: str) -> str:
    # JSON's escapes are a subset of TOML basic strings', except that TOML also forbids DEL.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")
