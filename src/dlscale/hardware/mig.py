"""MIG slices: one Multi-Instance GPU profile of a catalogue GPU, as a device of its own.

NVIDIA's MIG user guide: a GPU memory slice is "roughly one eighth of the total GPU memory
resources, including both capacity and bandwidth", and an SM slice "roughly one seventh of the
total number of SMs available in the GPU when configured in MIG mode"; a profile `Ng.Mgb` holds
N SM slices and a number of memory slices given in its table ("Fraction of memory", with the L2
cache split the same way). In MIG mode not every SM is used: an A100 (108 SMs) gives 14 SMs a
slice (98 in all), an H100 SXM (132) gives 16 (112), as NVML lists each profile's SMs. So a slice
is priced at its SMs' share of the whole GPU's peaks and its memory slices' share of the memory
and its bandwidth. The profiles and SMs a slice live in the parent's `[device.mig]` table.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

from dlscale.errors import UserError
from dlscale.hardware.device import Hardware

COMPUTE_SLICES = 7  # SM slices of a MIG-capable GPU (A100, H100)
MEMORY_SLICES = 8  # memory slices of one
MIG_KEYS = ("sms_per_slice", "source", "profiles")
PROFILE_KEYS = {"compute_slices": COMPUTE_SLICES, "memory_slices": MEMORY_SLICES}
SEPARATOR = ":"  # a slice's name: the parent's, then its profile ("a100-40gb:1g.5gb")


def parse_mig(table: Any, where: str) -> dict:
    """A [device.mig] table: sms_per_slice, source (a URL), and profiles, each a table of
    compute_slices (of 7) and memory_slices (of 8)."""
    if not isinstance(table, dict):
        raise UserError(f"{where}: mig must be a table, [device.mig]")
    unknown = [key for key in table if key not in MIG_KEYS]
    missing = [key for key in MIG_KEYS if key not in table]
    if unknown or missing:
        bad = f"unknown key '{unknown[0]}'" if unknown else f"no '{missing[0]}'"
        raise UserError(f"{where}: mig has {bad} (keys: {', '.join(MIG_KEYS)})")
    sms = _whole(table["sms_per_slice"], f"{where}: mig.sms_per_slice", None)
    source = table["source"]
    if not isinstance(source, str) or not source.startswith("https://"):
        raise UserError(f"{where}: mig.source must be a https:// URL")
    profiles = table["profiles"]
    if not isinstance(profiles, dict) or not profiles:
        raise UserError(f"{where}: mig.profiles must be a table of profiles, e.g. '1g.5gb'")
    parsed = {}
    for name, shares in profiles.items():
        label = f"{where}: mig profile '{name}'"
        if not isinstance(shares, dict) or set(shares) != set(PROFILE_KEYS):
            raise UserError(f"{label} needs exactly {', '.join(PROFILE_KEYS)}")
        parsed[name] = {
            key: _whole(shares[key], f"{label}: {key}", most) for key, most in PROFILE_KEYS.items()
        }
    return {"sms_per_slice": sms, "source": source, "profiles": parsed}


def _whole(value: Any, label: str, most: int | None) -> int:
    number = value if isinstance(value, int | Decimal) and not isinstance(value, bool) else None
    if number is None or number < 1 or Decimal(number) % 1 or (most and number > most):
        bound = f" from 1 to {most}" if most else " ≥ 1"
        raise UserError(f"{label} must be a whole number{bound}, not {value!r}")
    return int(number)


def split_name(name: str) -> tuple[str, str] | None:
    """'a100-40gb:1g.5gb' -> ('a100-40gb', '1g.5gb'); None for a name without a profile."""
    parent, separator, profile = name.partition(SEPARATOR)
    return (parent, profile) if separator else None


def slices(parent: Hardware) -> list[Hardware]:
    """Every MIG profile of `parent` as a device, in the catalogue's order."""
    return [mig_slice(parent, profile) for profile in parent.mig.get("profiles", {})]


def mig_slice(parent: Hardware, profile: str) -> Hardware:
    """`parent`'s MIG `profile` as a device: its SMs' share of every peak, its memory slices'
    share (of 8) of the memory, the bandwidth and the L2; the host link shared, no peer link."""
    profiles = parent.mig.get("profiles", {})
    if not profiles:
        raise UserError(f"'{parent.name}' has no MIG profiles (MIG: A100, H100 and later)")
    if profile not in profiles:
        raise UserError(
            f"'{parent.name}' has no MIG profile '{profile}'; its profiles: {', '.join(profiles)}"
        )
    assert parent.sm_count, f"{parent.name}: a MIG table needs the GPU's sm_count"
    shares = profiles[profile]
    sms = shares["compute_slices"] * parent.mig["sms_per_slice"]
    compute_share = sms / parent.sm_count
    memory_share = shares["memory_slices"] / MEMORY_SLICES
    notes = (
        f"MIG {profile} of the {parent.display_name}: {shares['compute_slices']} of "
        f"{COMPUTE_SLICES} SM slices × {parent.mig['sms_per_slice']} SMs = {sms} of the "
        f"GPU's {parent.sm_count} SMs, so every peak × {sms}/{parent.sm_count} = "
        f"{compute_share:.4f}; {shares['memory_slices']} of {MEMORY_SLICES} memory slices, so "
        f"memory, bandwidth and L2 × {memory_share:g} (the MIG user guide's profile table). "
        "nvidia-smi reports a little less memory than the share (the driver keeps some). The "
        "host link is the GPU's, shared by its slices; no NVLink peer link (MIG restricts "
        "peer-to-peer between instances). No price or TDP of its own."
    )
    return dataclasses.replace(
        parent,
        name=f"{parent.name}{SEPARATOR}{profile}",
        display_name=f"{parent.display_name}, MIG {profile}",
        peak_flops={p: flops * compute_share for p, flops in parent.peak_flops.items()},
        memory_bytes=parent.memory_bytes * shares["memory_slices"] // MEMORY_SLICES,
        memory_bandwidth_bytes_per_s=parent.memory_bandwidth_bytes_per_s * memory_share,
        interconnect=None,
        interconnect_bytes_per_s=None,
        interconnect_link=None,
        tdp_w=None,
        price_per_hour=None,
        price_source=None,
        price_date=None,
        sm_count=sms,
        l2_mib=parent.l2_mib * memory_share if parent.l2_mib else None,
        sources=tuple(dict.fromkeys((*parent.sources, parent.mig["source"]))),
        notes=notes,
        differs=(),
        mig={},
    )
