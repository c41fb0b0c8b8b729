"""Links between devices (PCIe, NVLink, InfiniBand, Ethernet): the catalogue and a device's own."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from dlscale.errors import UserError
from dlscale.hardware.spec import Hardware
from dlscale.home import dlscale_home

KINDS = ("pcie", "nvlink", "infinity-fabric", "ici", "infiniband", "ethernet", "loopback")
# A device whose interconnect has no catalogue entry (Infinity Fabric, TPU ICI) gets a link built
# from its own entry: these per-kind defaults fill what the entry does not say.
DEFAULT_LATENCY_S = {"infinity-fabric": 3e-6, "ici": 3e-6, "nvlink": 3e-6}
DEFAULT_EFFICIENCY = 0.8


@dataclass(frozen=True)
class Link:
    """One link as a collective sees it: per device, one direction."""

    name: str
    display_name: str
    kind: str
    bytes_per_s: float  # per device, one direction
    latency_s: float  # per message: one hop of a collective
    efficiency: float  # share of bytes_per_s a large all-reduce reaches
    sources: tuple[str, ...] = ()
    notes: str = ""

    @property
    def effective_bytes_per_s(self) -> float:
        return self.bytes_per_s * self.efficiency


def user_links_path() -> Path:
    """Your own links (not in hardware/, whose every *.toml is a device catalogue file)."""
    return dlscale_home() / "links.toml"


def load_links(extra_files: list[Path] | None = None) -> dict[str, Link]:
    """Every known link by name: shipped, then $DLSCALE_HOME/hardware/links.toml, then extras."""
    texts = [
        ("the shipped links", (resources.files("dlscale.hardware") / "links.toml").read_text())
    ]
    for path in [user_links_path(), *(Path(p) for p in extra_files or [])]:
        if path.is_file():
            texts.append((str(path), path.read_text(encoding="utf-8")))
    links: dict[str, Link] = {}
    for label, text in texts:
        try:
            tables = tomllib.loads(text).get("link", [])
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{label}: not valid TOML: {exc}") from None
        for index, table in enumerate(tables):
            link = parse_link(table, f"{label}, link {index + 1}")
            links[link.name] = link
    return links


def parse_link(table: dict[str, Any], where: str) -> Link:
    try:
        name = str(table["name"]).strip().lower()
        kind = str(table["kind"])
        gbs, latency_us = float(table["gbs"]), float(table["latency_us"])
        efficiency = float(table.get("efficiency", DEFAULT_EFFICIENCY))
    except KeyError as exc:
        raise UserError(f"{where}: missing key {exc}") from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: {exc}") from None
    if kind not in KINDS:
        raise UserError(f"{where}: kind must be one of {', '.join(KINDS)} (got '{kind}')")
    if gbs <= 0 or latency_us < 0 or not 0 < efficiency <= 1:
        raise UserError(f"{where}: gbs > 0, latency_us ≥ 0 and 0 < efficiency ≤ 1 are needed")
    return Link(
        name=name,
        display_name=str(table.get("display_name", name)),
        kind=kind,
        bytes_per_s=gbs * 1e9,
        latency_s=latency_us * 1e-6,
        efficiency=efficiency,
        sources=tuple(str(s) for s in table.get("sources", [])),
        notes=str(table.get("notes", "")),
    )


def lookup_link(links: dict[str, Link], name: str) -> Link:
    key = name.strip().lower()
    if key in links:
        return links[key]
    raise UserError(
        f"unknown link '{name}'; known: nvlink, pcie (the device's own), {', '.join(links)}"
    )


def pcie_link_name(host_link: str | None) -> str | None:
    """'PCIe 4.0 x16' -> 'pcie4-x16'."""
    found = re.match(r"PCIe (\d)\.0 x(\d+)", host_link or "")
    return f"pcie{found.group(1)}-x{found.group(2)}" if found else None


def _interconnect_name(interconnect: str) -> str | None:
    """'NVLink 3 (12 links)' -> 'nvlink3'; 'NVLink 3 bridge (4 links)' -> 'nvlink3-bridge'."""
    found = re.match(r"NVLink (\d)( bridge)?", interconnect)
    if not found:
        return None
    return f"nvlink{found.group(1)}" + ("-bridge" if found.group(2) else "")


def own_interconnect(hardware: Hardware, links: dict[str, Link]) -> Link | None:
    """The device's peer link: its catalogue entry where there is one, else one built from the
    device's own figures (total both ways, halved to one direction)."""
    if not hardware.interconnect or not hardware.interconnect_bytes_per_s:
        return None
    name = _interconnect_name(hardware.interconnect)
    if name in links:
        return links[name]
    kind = "ici" if "ICI" in hardware.interconnect else "infinity-fabric"
    if "NVLink" in hardware.interconnect:
        kind = "nvlink"
    return Link(
        name=f"{hardware.name}-interconnect",
        display_name=hardware.interconnect,
        kind=kind,
        bytes_per_s=hardware.interconnect_bytes_per_s / 2,
        latency_s=DEFAULT_LATENCY_S.get(kind, 3e-6),
        efficiency=DEFAULT_EFFICIENCY,
        sources=hardware.sources,
        notes="from the device's catalogue entry: its interconnect total, halved to one way",
    )


def device_link(hardware: Hardware, choice: str | None, links: dict[str, Link]) -> Link:
    """The link devices of `hardware` talk over: `choice` None is the device's own interconnect
    (NVLink, Infinity Fabric, ICI), else its PCIe host link; 'nvlink' and 'pcie' name those two;
    anything else is a catalogue link."""
    own = own_interconnect(hardware, links)
    pcie_name = pcie_link_name(hardware.host_link)
    pcie = links.get(pcie_name) if pcie_name else None
    measured = hardware.measured.get("link") if isinstance(hardware.measured, dict) else None
    if choice is None:
        if measured:  # `local`: the link measured between this machine's processes
            return measured_link(measured)
        if own or pcie:
            return own or pcie
        raise UserError(
            f"'{hardware.name}' has no interconnect or PCIe link in its entry: name one with "
            f"--interconnect (e.g. eth-25g, ib-hdr; known: {', '.join(links)})"
        )
    key = choice.strip().lower()
    if key == "nvlink":
        if own is None or own.kind != "nvlink":
            raise UserError(f"'{hardware.name}' has no NVLink; try --interconnect pcie")
        return own
    if key == "pcie":
        if pcie is None:
            raise UserError(f"'{hardware.name}' has no PCIe host link in its entry")
        return pcie
    return lookup_link(links, key)


def measured_link(measured: dict) -> Link:
    """The link `dlscale bench machine` measured between two local processes (gloo)."""
    return Link(
        name="local-gloo",
        display_name="this machine's processes (gloo, measured)",
        kind="loopback",
        bytes_per_s=float(measured["bytes_per_s"]),
        latency_s=float(measured["latency_s"]),
        efficiency=1.0,  # the measurement is already what an all-reduce reaches
        notes="fitted to timed all-reduces between two local processes",
    )
