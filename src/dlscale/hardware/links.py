"""Links between devices (PCIe, NVLink, Infinity Fabric, ICI, InfiniBand, Ethernet): the catalogue
of links, and which one a device's copies talk over.

Links are read in this order, a later one with the same name replacing an earlier one: the
shipped `links.toml`, then the [[link]] tables in the user's hardware files
(`$DLSCALE_HOME/hardware/*.toml`, beside or instead of [[device]] tables), then the `extra_files`
a caller passes (the CLI's `--hardware-file`). One place holds a user's device and its link.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from dlscale.errors import UserError
from dlscale.hardware.catalogue import read_hardware_file, user_files
from dlscale.hardware.device import Hardware

KINDS = ("pcie", "nvlink", "infinity-fabric", "ici", "infiniband", "ethernet", "loopback")
SHIPPED_LABEL = "dlscale/hardware/links.toml"
KEYS = (
    "name",
    "display_name",
    "kind",
    "gbs",
    "latency_us",
    "efficiency",
    "launch_us",
    "overlap",
    "contention",
    "sources",
    "notes",
)
REQUIRED_KEYS = ("name", "kind", "gbs", "latency_us")
# A device whose interconnect names no catalogued link (a user's entry without
# `interconnect_link`) gets one built from its own figures, with these stated defaults.
DEFAULT_LATENCY_S = 3e-6
DEFAULT_EFFICIENCY = 0.8
# What a collective costs beyond bytes and hops, per kind where an entry does not say (links.toml
# cites each): launch_us, the fixed cost of one collective (one DDP bucket): NCCL's own model
# charges a ring all-reduce 8.4 µs before its first hop (baseLat, ring/Simple, NCCL
# src/graph/tuning.cc); overlap, the share of a collective that may run behind backward;
# contention, how much slower a collective runs inside training than alone. GPU collectives run
# on their own stream and SMs (overlap 1, contention 1); a CPU's (gloo on loopback) shares the
# cores with compute: 2.0 ms in training against 1.07 ms alone for the same 69 KB all-reduce
# on this project's 2-core machine (benchmarks/scale_prediction.py, docs/performance.md). A
# measured link carries its own contention (bench/link.py); loopback's is the fallback for a
# `local` entry measured before bench machine timed it.
NCCL_LAUNCH_US = 8.4
KIND_COSTS = {  # kind -> (launch_us, overlap, contention)
    "pcie": (NCCL_LAUNCH_US, 1.0, 1.0),
    "nvlink": (NCCL_LAUNCH_US, 1.0, 1.0),
    "infinity-fabric": (NCCL_LAUNCH_US, 1.0, 1.0),  # RCCL is NCCL's fork, same tuning model
    "ici": (NCCL_LAUNCH_US, 1.0, 1.0),  # no published per-collective cost: NCCL's as a stand-in
    "infiniband": (NCCL_LAUNCH_US, 1.0, 1.0),
    "ethernet": (NCCL_LAUNCH_US, 1.0, 1.0),
    "loopback": (0.0, 1.0, 2.0 / 1.07),
}
_NAME = re.compile(r"[a-z0-9][a-z0-9._+-]*")
# The words --interconnect takes besides a link's name.
CHOICES = ("nvlink", "pcie")


@dataclass(frozen=True)
class Link:
    """One link as a collective sees it: per device, one direction."""

    name: str  # the key users type: "pcie3-x16", "nvlink4", "ib-hdr", "eth-100g"
    display_name: str
    kind: str  # one of KINDS
    bytes_per_s: float  # per device, ONE direction (what one ring step can send)
    latency_s: float  # per message: one hop of a collective, software included
    efficiency: float  # share of bytes_per_s a large all-reduce reaches (busbw / link rate)
    sources: tuple[str, ...] = ()
    notes: str = ""
    launch_s: float = 0.0  # fixed cost of one collective (each DDP bucket pays it once)
    overlap: float = 1.0  # share of a collective's time that may hide behind backward
    contention: float = 1.0  # a collective's time inside training / its time alone (≥ 1)

    @property
    def effective_bytes_per_s(self) -> float:
        return self.bytes_per_s * self.efficiency


def load_links(extra_files: list[Path] | None = None) -> dict[str, Link]:
    """Every known link by name: shipped, then user hardware files, then `extra_files`."""
    shipped = resources.files("dlscale.hardware") / "links.toml"
    texts = [(SHIPPED_LABEL, shipped.read_text(encoding="utf-8"))]
    for path in [*user_files(), *(Path(p) for p in extra_files or [])]:
        texts.append((str(path), read_hardware_file(path)))
    links: dict[str, Link] = {}
    for label, text in texts:
        for link in parse_links(text, label):
            links[link.name] = link
    return links


def parse_links(text: str, label: str) -> list[Link]:
    """The [[link]] tables of one file's text (its [[device]] tables are the catalogue's)."""
    try:
        tables = tomllib.loads(text).get("link", [])
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{label}: not valid TOML: {exc}") from None
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise UserError(f"{label}: 'link' must be an array of tables, written [[link]]")
    links = [
        parse_link(t, f"{label}: link '{t.get('name', f'#{i}')}'")
        for i, t in enumerate(tables, start=1)
    ]
    names = [link.name for link in links]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise UserError(f"{label}: link '{twice[0]}' appears twice in this file")
    return links


def parse_link(table: dict[str, Any], where: str) -> Link:
    """One [[link]] table -> Link in SI units; UserError prefixed by `where` if bad."""
    unknown = [key for key in table if key not in KEYS]
    if unknown:
        raise UserError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(KEYS)})")
    missing = [key for key in REQUIRED_KEYS if key not in table]
    if missing:
        raise UserError(f"{where}: missing required key '{missing[0]}'")
    name, kind = table["name"], table["kind"]
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in CHOICES:
        raise UserError(
            f"{where}: name must be lowercase letters, digits and '.', '_', '-', '+' "
            f"(and not {' or '.join(CHOICES)})"
        )
    if kind not in KINDS:
        raise UserError(f"{where}: kind '{kind}' is not one of {', '.join(KINDS)}")
    gbs = _number(table, "gbs", where)
    latency_us = _number(table, "latency_us", where)
    efficiency = _number(table, "efficiency", where) if "efficiency" in table else None
    if gbs <= 0 or latency_us < 0 or (efficiency is not None and not 0 < efficiency <= 1):
        raise UserError(f"{where}: needs gbs > 0, latency_us ≥ 0 and 0 < efficiency ≤ 1")
    costs = dict(zip(("launch_us", "overlap", "contention"), KIND_COSTS[kind], strict=True))
    costs |= {key: _number(table, key, where) for key in costs if key in table}
    if costs["launch_us"] < 0 or not 0 <= costs["overlap"] <= 1 or costs["contention"] < 1:
        raise UserError(f"{where}: needs launch_us ≥ 0, 0 ≤ overlap ≤ 1 and contention ≥ 1")
    sources = table.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(s, str) and s for s in sources):
        raise UserError(f"{where}: sources must be a list of URLs (strings)")
    texts = {
        key: table.get(key, default) for key, default in (("display_name", name), ("notes", ""))
    }
    if not all(isinstance(value, str) for value in texts.values()):
        raise UserError(f"{where}: display_name and notes must be strings")
    return Link(
        name=name,
        display_name=texts["display_name"],
        kind=kind,
        bytes_per_s=gbs * 1e9,
        latency_s=latency_us / 1e6,
        efficiency=DEFAULT_EFFICIENCY if efficiency is None else efficiency,
        sources=tuple(sources),
        notes=texts["notes"],
        launch_s=costs["launch_us"] / 1e6,
        overlap=costs["overlap"],
        contention=costs["contention"],
    )


def kind_costs(kind: str) -> dict:
    """A kind's stated launch_s, overlap and contention (KIND_COSTS), as Link's fields."""
    launch_us, overlap, contention = KIND_COSTS[kind]
    return {"launch_s": launch_us / 1e6, "overlap": overlap, "contention": contention}


def _number(table: dict[str, Any], key: str, where: str) -> float:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UserError(f"{where}: {key} must be a finite number, not {value!r}")
    return float(value)


def lookup_link(links: dict[str, Link], name: str) -> Link:
    """One link by name, case-insensitively; UserError naming every choice if unknown."""
    key = name.strip().lower()
    if key in links:
        return links[key]
    raise UserError(
        f"unknown link '{name}'; known: {', '.join(CHOICES)} (the device's own), {', '.join(links)}"
    )


def pcie_link_name(host_link: str | None) -> str | None:
    """'PCIe 4.0 x16' -> 'pcie4-x16'; None for anything else."""
    found = re.fullmatch(r"\s*PCIe (\d)\.0 x(\d+)\s*", host_link or "")
    return f"pcie{found.group(1)}-x{found.group(2)}" if found else None


def own_interconnect(hardware: Hardware, links: dict[str, Link]) -> Link | None:
    """The device's peer link (NVLink, Infinity Fabric, ICI): the catalogue link its entry's
    `interconnect_link` names, else one built from the entry's own figures (its total both
    ways, halved to one direction), else None."""
    if hardware.interconnect_link is not None:
        if hardware.interconnect_link not in links:
            raise UserError(
                f"'{hardware.name}': interconnect_link '{hardware.interconnect_link}' is not a "
                f"known link; known: {', '.join(links)}"
            )
        return links[hardware.interconnect_link]
    if not hardware.interconnect or not hardware.interconnect_bytes_per_s:
        return None
    text = hardware.interconnect
    kind = "nvlink" if "NVLink" in text else "ici" if "ICI" in text else "infinity-fabric"
    return Link(
        name=f"{hardware.name}-interconnect",
        display_name=text,
        kind=kind,
        bytes_per_s=hardware.interconnect_bytes_per_s / 2,
        latency_s=DEFAULT_LATENCY_S,
        efficiency=DEFAULT_EFFICIENCY,
        sources=hardware.sources,
        notes="built from the device's entry: its interconnect total, halved to one direction; "
        "latency and efficiency are the stated defaults",
        **kind_costs(kind),
    )


def host_pcie(hardware: Hardware, links: dict[str, Link]) -> Link | None:
    """The PCIe link of the device's `host_link` ('PCIe 3.0 x16' -> pcie3-x16); a host link the
    catalogue lacks is built from the entry's own one-direction rate."""
    name = pcie_link_name(hardware.host_link)
    if name in links:
        return links[name]
    if not hardware.host_link or not hardware.host_link_bytes_per_s:
        return None
    typical = links.get("pcie4-x16")
    return Link(
        name=name or f"{hardware.name}-host-link",
        display_name=hardware.host_link,
        kind="pcie",
        bytes_per_s=hardware.host_link_bytes_per_s,
        latency_s=typical.latency_s if typical else DEFAULT_LATENCY_S,
        efficiency=typical.efficiency if typical else DEFAULT_EFFICIENCY,
        sources=hardware.sources,
        notes="built from the device's entry: its host-link rate, one direction",
        **kind_costs("pcie"),
    )


def device_link(hardware: Hardware, choice: str | None, links: dict[str, Link]) -> Link:
    """The link copies of `hardware` talk over. `choice` None: a measured link (`local`), else
    the device's own interconnect, else its PCIe host link; 'nvlink' and 'pcie' name those two;
    anything else is a catalogue link by name."""
    if choice is None:
        measured = hardware.measured.get("link") if isinstance(hardware.measured, dict) else None
        if measured:  # `local`: the link measured between this machine's processes
            return measured_link(measured)
        found = own_interconnect(hardware, links) or host_pcie(hardware, links)
        if found is None:
            raise UserError(
                f"'{hardware.name}' has no interconnect or host link in its entry: name one "
                f"with --interconnect (known: {', '.join(links)})"
            )
        return found
    key = choice.strip().lower()
    if key == "nvlink":
        own = own_interconnect(hardware, links)
        if own is None or own.kind != "nvlink":
            other = f" (its interconnect is {own.name})" if own else ""
            raise UserError(f"'{hardware.name}' has no NVLink{other}; try --interconnect pcie")
        return own
    if key == "pcie":
        pcie = host_pcie(hardware, links)
        if pcie is None:
            raise UserError(f"'{hardware.name}' has no PCIe host link in its entry")
        return pcie
    return lookup_link(links, key)


def measured_link(measured: dict) -> Link:
    """The link `dlscale bench machine` measured between two local processes (gloo), with the
    contention it measured; an entry saved before it measured contention gets loopback's stated
    one (KIND_COSTS)."""
    costs = kind_costs("loopback")  # its launch is inside the fitted latency
    if "contention" in measured:
        costs["contention"] = _contention(measured, "the local entry's measured link")
    return Link(
        name="local-gloo",
        display_name="this machine's processes (gloo, measured)",
        kind="loopback",
        bytes_per_s=float(measured["bytes_per_s"]),
        latency_s=float(measured["latency_s"]),
        efficiency=1.0,  # the measurement is already what an all-reduce reaches
        notes="fitted to timed all-reduces between two local processes"
        + ("; contention measured beside compute" if "contention" in measured else ""),
        **costs,
    )


def _contention(measured: dict, where: str) -> float:
    """A measured contention, checked as a [[link]] table's is."""
    contention = _number(measured, "contention", where)
    if contention < 1:
        raise UserError(f"{where}: needs contention ≥ 1, not {contention!r}")
    return contention


MEASURED_BY = "measured by dlscale bench link"


def link_to_toml(measured: dict) -> str:
    """`dlscale bench link`'s measurement as one [[link]] table: the all-reduce's fit (what the
    scaling model prices a data-parallel step with); the point-to-point fit in its notes."""
    allreduce, p2p = measured["allreduce"], measured["p2p"]
    first, second = measured["hosts"]
    notes = (
        f"{MEASURED_BY} between {first} and {second} (gloo): all-reduce "
        f"{allreduce['bytes_per_s'] / 1e6:.1f} MB/s, point-to-point {p2p['bytes_per_s'] / 1e6:.1f}"
        f" MB/s and {p2p['latency_s'] * 1e6:.0f} µs a message"
    )
    return (
        "# A link as measured by 'dlscale bench link'; run it again to refresh.\n"
        "[[link]]\n"
        f'name = "{measured["name"]}"\n'
        f'display_name = "{first} ↔ {second} (gloo, measured)"\n'
        'kind = "ethernet"\n'
        f"gbs = {allreduce['bytes_per_s'] / 1e9!r}\n"
        f"latency_us = {allreduce['latency_s'] * 1e6!r}\n"
        "efficiency = 1.0\n"
        "launch_us = 0.0\n"  # the fitted latency already holds each call's fixed cost
        + (
            f"contention = {_contention(allreduce, 'the measured all-reduce')!r}\n"
            if "contention" in allreduce
            else ""  # measured before contention was: the kind's stated one
        )
        + f'notes = "{notes}"\n'
    )
