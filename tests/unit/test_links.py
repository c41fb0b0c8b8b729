"""The links between devices and the catalogue's prices: sources, parsing, defaults, overrides."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from dlscale.bench.link import summarize_contention
from dlscale.errors import UserError
from dlscale.hardware.catalogue import entry_to_toml, load_catalogue, parse_catalogue
from dlscale.hardware.links import (
    KINDS,
    Link,
    device_link,
    link_to_toml,
    load_links,
    lookup_link,
    measured_link,
    parse_links,
    pcie_link_name,
)

USER_FILE = """
[[device]]
name = "l4"
display_name = "L4 (our reserved price)"
kind = "gpu"
vendor = "NVIDIA"
memory_gib = 24
memory_bandwidth_gbs = 300
host_link = "PCIe 4.0 x16"
host_link_gbs = 31.5
interconnect = "lab fabric"
interconnect_gbs = 40
interconnect_link = "lab-fabric"
price_per_hour = 0.31
price_source = "our 2026 contract"
price_date = "2026-11"
peak_tflops = {{ fp32 = 30.3 }}

[[link]]
name = "lab-fabric"
display_name = "Our lab's fabric"
kind = "ethernet"
gbs = {gbs}
latency_us = 12
"""


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty DLSCALE_HOME per test, so no user file leaks in."""
    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def one_line_error(call) -> str:
    with pytest.raises(UserError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


# ----------------------------------------------------------------------------- shipped data


def test_every_link_parses_with_a_source_and_sane_figures():
    links = load_links()
    wanted = {f"pcie{gen}-x16" for gen in (3, 4, 5, 6)} | {f"nvlink{n}" for n in range(1, 6)}
    wanted |= {"nvlink3-bridge", "if-vega20", "if-mi300x", "ici-v2", "ici-v3", "ici-v4"}
    wanted |= {"ib-edr", "ib-hdr", "ib-ndr"} | {f"eth-{g}g" for g in (10, 25, 100, 200, 400)}
    assert wanted <= set(links)
    for link in links.values():
        assert link.kind in KINDS and link.notes, link.name
        assert link.sources and all(s.startswith("https://") for s in link.sources), link.name
        assert 1e9 <= link.bytes_per_s <= 1e12 and 0 < link.latency_s <= 1e-4, link.name
        assert 0 < link.efficiency <= 1, link.name


def test_link_rates_follow_their_derivations():
    links = load_links()
    gbs = {name: link.bytes_per_s / 1e9 for name, link in links.items()}
    # PCIe doubles each generation; NVLink is links × per-link rate, one direction.
    assert gbs["pcie4-x16"] == 2 * gbs["pcie3-x16"] and gbs["pcie5-x16"] == 2 * gbs["pcie4-x16"]
    assert (gbs["nvlink1"], gbs["nvlink2"], gbs["nvlink3"], gbs["nvlink4"], gbs["nvlink5"]) == (
        4 * 20,
        6 * 25,
        12 * 25,
        18 * 25,
        18 * 50,
    )
    assert (gbs["ib-edr"], gbs["ib-hdr"], gbs["ib-ndr"]) == (100 / 8, 200 / 8, 400 / 8)
    assert gbs["eth-10g"] == 10 / 8 and gbs["eth-400g"] == 400 / 8
    # A ring over a P100's cube-mesh uses half its links; a switched NVLink more.
    assert links["nvlink1"].efficiency < links["nvlink3"].efficiency


def test_every_device_parses_and_names_a_known_link():
    links, catalogue = load_links(), load_catalogue()
    for device in catalogue.values():
        if device.interconnect_link is not None:
            assert device.interconnect_link in links, device.name
            own = links[device.interconnect_link]
            # The device's own total both ways is twice the link's one direction.
            assert own.bytes_per_s == pytest.approx(device.interconnect_bytes_per_s / 2)
        if device.host_link is not None:
            pcie = links[pcie_link_name(device.host_link)]
            assert pcie.bytes_per_s == pytest.approx(device.host_link_bytes_per_s)
        if device.kind != "cpu":
            assert device_link(device, None, links).name in links


def test_every_price_has_a_source_and_a_month_and_the_rest_say_why_not():
    catalogue = load_catalogue()
    priced = {name for name, d in catalogue.items() if d.price_per_hour is not None}
    wanted = {"k80", "p100-sxm2-16gb", "v100-sxm2-16gb", "a100-40gb", "a100-80gb", "h100-sxm"}
    assert wanted | {"h200-sxm", "l4", "mi300x", "tpu-v2", "tpu-v3", "tpu-v4"} <= priced
    for name in priced:
        device = catalogue[name]
        assert 0.1 < device.price_per_hour < 50, name
        assert device.price_source.startswith("https://"), name
        assert re.fullmatch(r"20[12]\d-(0[1-9]|1[0-2])", device.price_date), name
        assert "Price" in device.notes, name  # how the per-device figure was derived
    for name in set(catalogue) - priced:
        assert "No price" in catalogue[name].notes, name
    assert {"gtx-1080", "i7-7700k"} <= set(catalogue) - priced


def test_pcie_link_names_derive_from_host_link_text():
    assert pcie_link_name("PCIe 3.0 x16") == "pcie3-x16"
    assert pcie_link_name("PCIe 5.0 x8") == "pcie5-x8"
    assert pcie_link_name("NVLink-C2C") is None and pcie_link_name(None) is None


# ----------------------------------------------------------------------------- choosing a link


def test_device_link_default_nvlink_pcie_and_by_name():
    links, catalogue = load_links(), load_catalogue()
    p100, l4, mi300x = catalogue["p100-sxm2-16gb"], catalogue["l4"], catalogue["mi300x"]
    assert device_link(p100, None, links).name == "nvlink1"  # its own interconnect
    assert device_link(p100, "nvlink", links).name == "nvlink1"
    assert device_link(p100, "PCIe", links).name == "pcie3-x16"  # from host_link, any case
    assert device_link(l4, None, links).name == "pcie4-x16"  # no interconnect: PCIe
    assert device_link(mi300x, None, links).name == "if-mi300x"
    assert device_link(catalogue["tpu-v4"], None, links).name == "ici-v4"
    assert device_link(p100, "ib-hdr", links) is links["ib-hdr"]
    measured = replace(l4, measured={"link": {"bytes_per_s": 2e9, "latency_s": 1e-4}})
    assert device_link(measured, None, links).name == "local-gloo"  # `local`: as measured


def test_device_link_errors_are_one_line_naming_the_choices():
    links, catalogue = load_links(), load_catalogue()
    message = one_line_error(lambda: device_link(catalogue["l4"], "warp", links))
    assert message.startswith("unknown link 'warp'; known: nvlink, pcie")
    assert "ib-ndr" in message and "eth-10g" in message
    assert "has no NVLink" in one_line_error(lambda: device_link(catalogue["l4"], "nvlink", links))
    message = one_line_error(lambda: device_link(catalogue["mi300x"], "nvlink", links))
    assert "its interconnect is if-mi300x" in message
    cpu = catalogue["xeon-platinum-8180"]
    assert "has no PCIe host link" in one_line_error(lambda: device_link(cpu, "pcie", links))
    assert "--interconnect" in one_line_error(lambda: device_link(cpu, None, links))
    assert device_link(cpu, "eth-25g", links).name == "eth-25g"  # CPUs over a network
    assert lookup_link(links, " IB-NDR ").name == "ib-ndr"
    stray = replace(catalogue["h100-sxm"], interconnect_link="nvlink9")
    assert "interconnect_link 'nvlink9'" in one_line_error(lambda: device_link(stray, None, links))


def test_a_device_without_a_catalogued_link_gets_one_from_its_own_figures():
    links, catalogue = load_links(), load_catalogue()
    mine = replace(catalogue["mi50"], name="mine", interconnect_link=None)
    own = device_link(mine, None, links)
    assert own.kind == "infinity-fabric" and own.bytes_per_s == pytest.approx(100e9)
    odd = replace(catalogue["l4"], host_link="PCIe 4.0 x8", host_link_bytes_per_s=15.75e9)
    assert device_link(odd, "pcie", links).bytes_per_s == 15.75e9  # not in the catalogue


# ----------------------------------------------------------------------------- user files


def test_a_user_file_overrides_a_price_and_adds_a_link(home: Path):
    assert load_catalogue()["l4"].price_per_hour == 0.8
    write(home / "hardware" / "ours.toml", USER_FILE.format(gbs=5))
    l4 = load_catalogue()["l4"]
    assert (l4.price_per_hour, l4.price_source, l4.price_date) == (
        0.31,
        "our 2026 contract",
        "2026-11",
    )
    links = load_links()
    assert device_link(l4, None, links).bytes_per_s == 5e9  # the file's own link
    assert links["lab-fabric"].efficiency == 0.8  # the stated default when none is given
    assert load_links()["ib-hdr"] == links["ib-hdr"]  # shipped links still there


def test_a_later_file_replaces_a_link_and_extra_files_come_last(home: Path, tmp_path: Path):
    write(home / "hardware" / "ours.toml", USER_FILE.format(gbs=5))
    extra = write(
        tmp_path / "extra.toml",
        '[[link]]\nname = "lab-fabric"\nkind = "ethernet"\ngbs = 7\nlatency_us = 1\n',
    )
    assert load_links([extra])["lab-fabric"].bytes_per_s == 7e9
    shadow = write(
        tmp_path / "shadow.toml",
        '[[link]]\nname = "pcie3-x16"\nkind = "pcie"\ngbs = 12\nlatency_us = 9\nefficiency = 0.5\n',
    )
    assert load_links([shadow])["pcie3-x16"].bytes_per_s == 12e9


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[[link]]\nname = "x"\nkind = "pcie"\ngbs = 1\n', "missing required key 'latency_us'"),
        ('[[link]]\nname = "x"\nkind = "warp"\ngbs = 1\nlatency_us = 1\n', "kind 'warp'"),
        ('[[link]]\nname = "x"\nkind = "pcie"\ngbs = 0\nlatency_us = 1\n', "gbs > 0"),
        ('[[link]]\nname = "x"\nkind = "pcie"\ngbs = "fast"\nlatency_us = 1\n', "finite number"),
        (
            '[[link]]\nname = "x"\nkind = "pcie"\ngbs = 1\nlatency_us = 1\nspeed = 2\n',
            "unknown key 'speed'",
        ),
        ('[[link]]\nname = "nvlink"\nkind = "pcie"\ngbs = 1\nlatency_us = 1\n', "not nvlink"),
        (
            '[[link]]\nname = "x"\nkind = "pcie"\ngbs = 1\nlatency_us = 1\nefficiency = 2\n',
            "efficiency ≤ 1",
        ),
        (
            '[[link]]\nname = "x"\nkind = "pcie"\ngbs = 1\nlatency_us = 1\ncontention = 0.5\n',
            "contention ≥ 1",
        ),
        (
            '[[link]]\nname = "x"\nkind = "pcie"\ngbs = 1\nlatency_us = 1\noverlap = 1.5\n',
            "0 ≤ overlap ≤ 1",
        ),
        ("link = 3\n", "array of tables"),
        ("[[link]\n", "not valid TOML"),
    ],
)
def test_bad_links_are_one_line_naming_the_file(text: str, problem: str):
    message = one_line_error(lambda: parse_links(text, "mine.toml"))
    assert message.startswith("mine.toml") and problem in message


def test_price_fields_and_link_name_round_trip_through_the_writer():
    device = load_catalogue()["h100-sxm"]
    (back,) = parse_catalogue(entry_to_toml(device), "written")
    assert back == device and back.interconnect_link == "nvlink4"
    bad = entry_to_toml(device).replace(f'price_date = "{device.price_date}"\n', "")
    assert "needs its price_source and price_date" in one_line_error(
        lambda: parse_catalogue(bad, "mine.toml")
    )


def test_link_is_a_frozen_value():
    link = Link("x", "X", "pcie", 1e9, 1e-6, 0.5)
    assert link.effective_bytes_per_s == 0.5e9
    with pytest.raises(AttributeError):
        link.efficiency = 1.0  # type: ignore[misc]


def test_a_links_costs_come_from_its_kind_unless_its_entry_says():
    """NCCL's 8.4 µs launch (ring/Simple) for GPU links and networks; gloo on loopback: no launch
    beyond its fitted latency, and the measured contention 2.0 / 1.07 ms."""
    links = load_links()
    assert links["nvlink1"].launch_s == pytest.approx(8.4e-6)
    assert (links["ib-hdr"].overlap, links["ib-hdr"].contention) == (1.0, 1.0)
    (own,) = parse_links(
        '[[link]]\nname = "x"\nkind = "pcie"\ngbs = 1\nlatency_us = 1\nlaunch_us = 20\n'
        "overlap = 0.5\ncontention = 1.5\n",
        "mine.toml",
    )
    assert (own.launch_s, own.overlap, own.contention) == (pytest.approx(20e-6), 0.5, 1.5)
    local = measured_link({"bytes_per_s": 1e9, "latency_s": 1e-4})
    assert local.launch_s == 0.0 and local.contention == pytest.approx(2.0 / 1.07)


def test_a_measured_contention_replaces_the_kinds_stated_one():
    """`bench machine` measures contention beside compute: measured_link uses it; an entry saved
    before it did keeps loopback's stated 2.0 / 1.07 (KIND_COSTS)."""
    fit = {"bytes_per_s": 1e9, "latency_s": 1e-4}
    measured = measured_link({**fit, "contention": 2.6, "contention_quartiles": [1.9, 3.4]})
    assert measured.contention == 2.6 and measured.launch_s == 0.0
    assert "contention measured" in measured.notes
    assert measured_link(fit).contention == pytest.approx(2.0 / 1.07)


@pytest.mark.parametrize("bad", [0.5, math.nan, math.inf, "2", True])
def test_a_bad_measured_contention_is_one_line(bad):
    message = one_line_error(
        lambda: measured_link({"bytes_per_s": 1e9, "latency_s": 1e-4, "contention": bad})
    )
    assert message.startswith("the local entry's measured link") and "contention" in message


def test_bench_links_measured_contention_round_trips_through_its_toml():
    fit = {"bytes_per_s": 11.8e6, "latency_s": 210e-6, "fit_max_error": 0.04, "timed": {}}
    result = {"hosts": ["10.0.0.1", "10.0.0.2"], "p2p": fit, "name": "link-a-b"}
    (link,) = parse_links(link_to_toml({**result, "allreduce": {**fit, "contention": 1.35}}), "w")
    assert (link.kind, link.contention, link.launch_s) == ("ethernet", 1.35, 0.0)
    (old,) = parse_links(link_to_toml({**result, "allreduce": fit}), "w")
    assert old.contention == 1.0  # measured before contention was: ethernet's stated one
    bad = {**result, "allreduce": {**fit, "contention": 0.9}}
    assert "contention ≥ 1" in one_line_error(lambda: link_to_toml(bad))


def test_contention_is_the_median_ratio_never_under_one():
    """Ratios (inside compute / alone) by size and round: sorted 0.9 1.2 1.5 2.0 3.0, median 1.5;
    quartiles by statistics' exclusive method at positions 1.5 and 4.5 of 5: 1.05 and 2.5."""
    found = summarize_contention({65536: [1.2, 0.9, 1.5], 1048576: [3.0, 2.0]})
    assert found["contention"] == pytest.approx(1.5)
    assert found["contention_quartiles"] == pytest.approx([1.05, 2.5])
    assert found["contention_by_size"] == pytest.approx({"65536": 1.2, "1048576": 2.5})
    assert summarize_contention({65536: [0.8, 0.9, 0.95]})["contention"] == 1.0
    assert summarize_contention({65536: [1.4]})["contention_quartiles"] == [1.4, 1.4]
