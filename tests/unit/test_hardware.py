"""The hardware catalogue: shipped figures against datasheets, user files, errors, `local`
(tests/cli/test_hardware_cli.py drives `dlscale hardware`)."""

import dataclasses
import random
from pathlib import Path

import pytest

from dlscale.errors import UserError
from dlscale.hardware import (
    Hardware,
    get_hardware,
    load_catalogue,
    local_entry_path,
    parse_hardware_list,
    save_local,
)
from dlscale.hardware.catalogue import entry_to_toml, parse_catalogue

REQUIRED_DEVICES = {
    "i7-7700k",
    "xeon-platinum-8180",
    "epyc-7601",
    "ryzen-9-5950x",
    "gtx-1080",
    "gtx-1080-ti",
    "k80",
    "p100-sxm2-16gb",
    "v100-sxm2-16gb",
    "v100-sxm2-32gb",
    "a100-40gb",
    "a100-80gb",
    "rtx-3090",
    "h100-sxm",
    "h200-sxm",
    "l4",
    "mi25",
    "mi50",
    "mi60",
    "mi300x",
    "tpu-v2",
    "tpu-v3",
    "tpu-v4",
}
GIB = 2**30
T = 1e12  # TFLOP/s
G = 1e9  # GB/s

ENTRY = """\
[[device]]
name = "{name}"
display_name = "Test GPU"
kind = "gpu"
vendor = "Acme"
peak_tflops = {{ fp32 = {fp32}, bf16 = 100 }}
memory_gib = 16
memory_bandwidth_gbs = 500
host_link = "PCIe 4.0 x16"
host_link_gbs = 31.5
sources = ["https://example.com/datasheet.pdf"]
"""


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets an empty DLSCALE_HOME, so the real ~/.dlscale never leaks in."""
    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- shipped catalogue


def test_shipped_catalogue_has_every_required_device_with_sane_figures():
    catalogue = load_catalogue()
    assert set(catalogue) >= REQUIRED_DEVICES
    for name, device in catalogue.items():
        assert device.name == name and device.kind in ("cpu", "gpu", "tpu"), name
        assert device.sources and all(s.startswith("https://") for s in device.sources), name
        assert device.notes, name
        fp32 = device.peak_flops["fp32"]
        assert fp32 > 0 and device.memory_bandwidth_bytes_per_s > 0 and device.memory_bytes > 0
        assert device.tdp_w and device.tdp_w > 0, name
        for half in ("bf16", "fp16", "tf32"):
            assert device.peak_flops.get(half, fp32) >= fp32, (name, half)
        assert device.peak_flops.get("fp64", 0) <= fp32, name
        if device.kind == "cpu":
            assert device.host_link is None and "×" in device.notes, name
        else:
            assert device.host_link and device.host_link_bytes_per_s > 0, name
        if device.interconnect:
            assert device.interconnect_bytes_per_s > device.host_link_bytes_per_s, name


def test_spot_checks_against_vendor_datasheets():
    c = load_catalogue()
    a100 = c["a100-40gb"]
    assert a100.peak_flops["fp32"] == 19.5 * T and a100.peak_flops["bf16"] == 312 * T
    assert a100.peak_flops["tf32"] == 156 * T and a100.memory_bytes == 40 * GIB
    assert a100.memory_bandwidth_bytes_per_s == 1555 * G
    assert c["a100-80gb"].memory_bandwidth_bytes_per_s == 2039 * G
    h100 = c["h100-sxm"]
    assert h100.memory_bytes == 80 * GIB and h100.memory_bandwidth_bytes_per_s == 3350 * G
    assert h100.peak_flops["bf16"] == pytest.approx(989 * T, rel=1e-3)  # dense, not 1979
    assert c["h200-sxm"].memory_bandwidth_bytes_per_s == 4800 * G
    assert c["v100-sxm2-16gb"].peak_flops["fp32"] == 15.7 * T
    assert c["v100-sxm2-32gb"].memory_bytes == 32 * GIB
    assert c["l4"].peak_flops["bf16"] == 121 * T  # the datasheet's 242 assumes sparsity
    assert c["tpu-v4"].peak_flops["bf16"] == 275 * T
    assert c["mi300x"].memory_bytes == 192 * GIB


@pytest.mark.parametrize(
    ("name", "cores", "clock_hz", "fma_units", "fp32_lanes"),
    [
        ("i7-7700k", 4, 4.2e9, 2, 8),  # AVX2, base clock
        ("xeon-platinum-8180", 28, 1.7e9, 2, 16),  # AVX-512, AVX-512 base clock
        ("epyc-7601", 32, 2.2e9, 1, 8),  # Zen 1: two 128-bit pipes = one 256-bit FMA
        ("ryzen-9-5950x", 16, 3.4e9, 2, 8),  # Zen 3 AVX2, base clock
    ],
)
def test_cpu_peaks_are_cores_clock_fma_lanes_times_two(
    name, cores, clock_hz, fma_units, fp32_lanes
):
    peaks = load_catalogue()[name].peak_flops
    assert peaks["fp32"] == pytest.approx(cores * clock_hz * fma_units * fp32_lanes * 2)
    assert peaks["fp64"] == pytest.approx(peaks["fp32"] / 2)  # half the lanes
    assert set(peaks) == {"fp32", "fp64"}  # no AMX, AVX512-BF16 or VNNI on these


def test_devices_without_half_precision_units_fall_back_to_fp32():
    c = load_catalogue()
    assert "bf16" not in c["gtx-1080"].peak_flops and "fp16" not in c["i7-7700k"].peak_flops
    assert c["gtx-1080"].peak("bf16") == (c["gtx-1080"].peak_flops["fp32"], "fp32")
    assert c["a100-40gb"].peak("bf16") == (312 * T, "bf16")


# ----------------------------------------------------------------------------- lookups


def test_lookup_is_case_insensitive_and_lists_parse_in_order():
    assert get_hardware("A100-40GB").name == "a100-40gb"
    devices = parse_hardware_list(" a100-40gb, H100-SXM ,")
    assert [d.name for d in devices] == ["a100-40gb", "h100-sxm"]
    with pytest.raises(UserError, match="no hardware named"):
        parse_hardware_list(" , ")


def test_unknown_hardware_names_the_known_ones():
    with pytest.raises(UserError) as info:
        get_hardware("a100")
    message = str(info.value)
    assert message.startswith("unknown hardware 'a100'; did you mean a100-40gb, a100-80gb")
    assert "(known: i7-7700k, " in message
    assert "a100-40gb" in message and "tpu-v4" in message and "\n" not in message


def test_local_before_any_measurement_says_to_run_bench_machine():
    with pytest.raises(UserError, match=r"run 'dlscale bench machine' first to measure this"):
        get_hardware("local")


# ----------------------------------------------------------------------------- user files


def test_user_files_add_and_override_later_wins(home: Path, tmp_path: Path):
    write(home / "hardware" / "lab.toml", ENTRY.format(name="lab-gpu", fp32=10))
    override = ENTRY.format(name="a100-40gb", fp32=20)
    write(home / "hardware" / "mine.toml", override)
    catalogue = load_catalogue()
    assert catalogue["lab-gpu"].peak_flops == {"fp32": 10 * T, "bf16": 100 * T}
    assert catalogue["lab-gpu"].host_link_bytes_per_s == 31.5 * G
    assert catalogue["a100-40gb"].peak_flops["fp32"] == 20 * T
    assert catalogue["a100-40gb"].display_name == "Test GPU"
    # --hardware-file comes after the user's folder, so it wins over both.
    extra = write(tmp_path / "extra.toml", ENTRY.format(name="a100-40gb", fp32=30))
    assert get_hardware("a100-40gb", [extra]).peak_flops["fp32"] == 30 * T
    assert len(load_catalogue([extra])) == len(catalogue)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            ENTRY.format(name="x", fp32=1).replace('vendor = "Acme"\n', ""),
            "missing required key 'vendor'",
        ),
        (ENTRY.format(name="x", fp32=-1), "fp32 must be a finite number > 0, not -1"),
        (
            ENTRY.format(name="x", fp32=1).replace("memory_gib = 16", "memory_gib = 0"),
            "memory_gib must",
        ),
        (ENTRY.format(name="x", fp32=1) + "colour = 'red'\n", "unknown key 'colour'"),
        (ENTRY.format(name="x", fp32=1).replace("fp32 = 1, ", ""), "needs an fp32 figure"),
        (ENTRY.format(name="x", fp32=1).replace("bf16", "fp8"), "unknown precision 'fp8'"),
        (ENTRY.format(name="x", fp32=1).replace('"gpu"', '"npu"'), "kind 'npu' is not one of"),
        (ENTRY.format(name="x", fp32=1).replace("host_link_gbs = 31.5\n", ""), "together"),
        (ENTRY.format(name="x", fp32=1).replace("500", '"fast"'), "must be a number"),
        (ENTRY.format(name="x", fp32=1) + "compute_efficiency = 1.5\n", "must be ≤ 1"),
        (ENTRY.format(name="x", fp32=1) * 2, "device 'x' appears twice"),
    ],
)
def test_bad_entries_are_one_line_naming_file_and_device(tmp_path: Path, text: str, problem: str):
    path = write(tmp_path / "bad.toml", text)
    with pytest.raises(UserError) as info:
        load_catalogue([path])
    message = str(info.value)
    assert message.startswith(f"{path}: device ") and problem in message and "\n" not in message
    assert "'x'" in message


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[[device]\nname = 'x'\n", "not valid TOML"),
        ("[device]\nname = 'x'\n", "array of tables"),
        ("cpus = 3\n", "unknown top-level key 'cpus'"),
    ],
)
def test_bad_files_are_one_line_naming_the_file(home: Path, text: str, problem: str):
    path = write(home / "hardware" / "broken.toml", text)
    with pytest.raises(UserError) as info:
        load_catalogue()
    assert str(info.value).startswith(f"{path}: ") and problem in str(info.value)


def test_missing_extra_file_is_a_user_error(tmp_path: Path):
    with pytest.raises(UserError, match="hardware file not found"):
        load_catalogue([tmp_path / "absent.toml"])


# ----------------------------------------------------------------------------- local entry


def measured_machine(rng: random.Random) -> Hardware:
    """A `local` entry with awkward numbers: none of them is round in the file's units."""
    return Hardware(
        name="local",
        display_name='Laptop "work" \\ AMD Ryzen 7 PRO 7840U',
        kind="cpu",
        vendor="AMD",
        peak_flops={"fp64": rng.uniform(1e10, 1e12), "fp32": rng.uniform(1e10, 1e12)},
        memory_bytes=rng.randrange(GIB, 512 * GIB),
        memory_bandwidth_bytes_per_s=rng.uniform(1e9, 1e11),
        tdp_w=28.0,
        compute_efficiency=rng.random() * 0.9 + 0.05,
        op_overhead_s=rng.uniform(1e-7, 1e-4),
        sources=("dlscale bench machine",),
        notes="measured\nover 3 runs",
        measured={
            "matmul_fp32_flops": [0.1 + 0.2, 1e-300, 123456789.0],
            "threads": 16,
            "ok": True,
            "cpu model": "AMD Ryzen 7 PRO 7840U",
            "stream": {"copy_bytes_per_s": 5.5e10, "triad_bytes_per_s": float("inf")},
            "grid": [[200, 128, 0.1 + 0.7], [2304, 8192, 3.3e10]],
        },
    )


def test_save_local_round_trips_exactly(home: Path):
    machine = measured_machine(random.Random(0))
    path = save_local(machine)
    assert path == local_entry_path() == home / "hardware" / "local.toml"
    text = path.read_text()
    assert "[device.measured]" in text and "[device.measured.stream]" in text
    assert get_hardware("local") == machine
    assert load_catalogue()["local"] == machine


def test_unit_conversion_is_exact_for_any_float():
    """The file holds decimal text in human units; every SI value comes back bit for bit."""
    rng = random.Random(1)
    for _ in range(300):
        machine = measured_machine(rng)
        machine = dataclasses.replace(
            machine,
            host_link="PCIe 4.0 x16",
            host_link_bytes_per_s=rng.uniform(1e8, 1e11),
            peak_flops={"fp32": 10 ** rng.uniform(-3, 18)},
        )
        (again,) = parse_catalogue(entry_to_toml(machine), "test")
        assert again == machine
