"""The catalogue's cores and caches, the figures flagged as differing from other sources, int4
peaks and MIG slices: schema, lookups and the shares worked out by hand
(tests/cli/test_hardware_cli.py drives `dlscale hardware show` and `list --mig`)."""

from pathlib import Path

import pytest

from dlscale.errors import UserError
from dlscale.hardware import get_hardware, load_catalogue, parse_hardware_list
from dlscale.hardware.catalogue import entry_to_toml, parse_catalogue
from dlscale.profiler.inference import predict_inference
from tests.unit.test_hardware import ENTRY, GIB

T = 1e12


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path / "home"))


def one(text: str):
    (device,) = parse_catalogue(text, "mine.toml")
    return device


# ----------------------------------------------------------------------------- cores and caches


@pytest.mark.parametrize(
    ("name", "cores", "threads", "l1d", "l2", "l3"),
    [
        ("xeon-platinum-8180", 28, 56, 32, 1024, 38.5),  # Skylake-SP: 1 MB L2 a core
        ("epyc-7601", 32, 64, 32, 512, 64),  # Zen 1: 8 MB L3 per 4-core CCX × 8
        ("i7-7700k", 4, 8, 32, 256, 8),
        ("ryzen-9-5950x", 16, 32, 32, 512, 64),  # Zen 3: 32 MB L3 per 8-core CCD × 2
    ],
)
def test_cpu_entries_carry_cores_threads_and_caches(name, cores, threads, l1d, l2, l3):
    cpu = load_catalogue()[name]
    assert (cpu.cores, cpu.threads) == (cores, threads)
    assert (cpu.l1d_kib_per_core, cpu.l2_kib_per_core, cpu.l3_mib) == (l1d, l2, l3)
    # The peak the entry states is its cores' (the notes' product): cores × clock × FLOP/cycle.
    per_cycle = {"xeon-platinum-8180": 64, "epyc-7601": 16, "i7-7700k": 32, "ryzen-9-5950x": 32}
    clock = {"xeon-platinum-8180": 1.7e9, "epyc-7601": 2.2e9, "i7-7700k": 4.2e9}
    clock["ryzen-9-5950x"] = 3.4e9
    assert cpu.peak_flops["fp32"] == pytest.approx(cpu.cores * clock[name] * per_cycle[name])


def test_gpu_entries_carry_their_multiprocessors():
    c = load_catalogue()
    assert (c["a100-40gb"].sm_count, c["h100-sxm"].sm_count) == (108, 132)
    assert (c["mi50"].sm_count, c["gtx-580"].sm_count) == (60, 16)


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ("cores = 4\nthreads = 2\n", "at least as many threads as cores"),
        ("threads = 8\n", "threads needs cores"),
        ("cores = 2.5\n", "cores must be a whole number > 0"),
        ("l3_mib = -1\n", "l3_mib must be a number > 0"),
    ],
)
def test_bad_cores_and_caches_are_one_line(extra: str, problem: str):
    text = ENTRY.format(name="mine", fp32=10).replace("sources =", extra + "sources =")
    with pytest.raises(UserError, match=problem):
        one(text)


# ----------------------------------------------------------------------------- differs


def test_the_three_lecture_devices_flag_their_differing_figures_with_both_sources():
    c = load_catalogue()
    for name in ("xeon-platinum-8180", "epyc-7601", "mi50"):
        device = c[name]
        assert device.differs, name
        for row in device.differs:
            # Both sources: ours among the entry's, theirs a URL of its own.
            assert row["source"].startswith("https://") and device.sources, name
            assert row["ours"] != row["theirs"] and row["why"], name
    # The MI50's two clocks give the two figures: 3840 lanes × 2 FLOP × clock (AMD states
    # 13.25 as 13.3).
    assert pytest.approx(13.25, abs=0.005) == 3840 * 2 * 1.725e9 / T
    assert pytest.approx(13.41, abs=0.005) == 3840 * 2 * 1.746e9 / T
    # The Xeon at its nominal base: 28 cores × 64 FLOP/cycle × 2.5 GHz = 4.48 TFLOP/s.
    assert "4.48" in c["xeon-platinum-8180"].differs[0]["theirs"]


def test_a_differs_table_needs_every_key_and_a_url():
    base = ENTRY.format(name="mine", fp32=10)
    partial = base + '\n[[device.differs]]\nfigure = "fp32"\nours = "1"\n'
    with pytest.raises(UserError, match="a differs table has no 'theirs'"):
        one(partial)
    row = 'figure = "a"\nours = "1"\ntheirs = "2"\nsource = "ftp://x"\nwhy = "b"\n'
    with pytest.raises(UserError, match="https:// URL"):
        one(base + "\n[[device.differs]]\n" + row)


# ----------------------------------------------------------------------------- int4


def test_int4_peaks_where_published_and_the_fallback_where_not():
    c = load_catalogue()
    assert c["a100-40gb"].peak("int4") == (1248 * T, "int4")  # dense; 2496 with sparsity
    assert c["a100-80gb"].peak("int4") == (1248 * T, "int4")
    # Hopper and the L4 publish none: int4 runs at the int8 rate; a device without either at
    # its fp32 rate.
    assert c["h100-sxm"].peak("int4") == (c["h100-sxm"].peak_flops["int8"], "int8")
    assert c["l4"].peak("int4")[1] == "int8"
    assert c["gtx-580"].peak("int4") == (c["gtx-580"].peak_flops["fp32"], "fp32")


def test_int4_inference_counts_half_a_byte_and_names_the_fallback():
    from dlscale.api.profiling import profile
    from dlscale.profiler.request import ProfileRequest

    request = ProfileRequest(
        target="mlp",
        batch_size=16,
        precision="int4",
        inference=True,
        hardware=("a100-40gb", "h100-sxm"),
    )
    result = profile(request)
    a100, h100 = result.inference
    assert (a100.precision_used, h100.precision_used) == ("int4", "int8")
    assert a100.weights_bytes == result.trace.params // 2  # two int4 weights a byte
    int8 = predict_inference(result.trace, get_hardware("a100-40gb"), "int8")
    assert int8.weights_bytes == 2 * a100.weights_bytes


def test_int4_training_is_refused_in_one_line():
    from dlscale.profiler.request import ProfileRequest

    with pytest.raises(UserError, match="--precision int4 is for inference"):
        ProfileRequest(target="mlp", precision="int4")


# ----------------------------------------------------------------------------- MIG


@pytest.mark.parametrize(
    ("name", "sms", "memory_gib", "bandwidth_gbs", "fp32_tflops"),
    [
        # 1 SM slice of 14 SMs out of 108; 1 of 8 memory slices of 40 GiB at 1555 GB/s.
        ("a100-40gb:1g.5gb", 14, 5, 1555 / 8, 19.5 * 14 / 108),
        ("a100-40gb:1g.10gb", 14, 10, 1555 * 2 / 8, 19.5 * 14 / 108),
        ("a100-40gb:3g.20gb", 42, 20, 1555 * 4 / 8, 19.5 * 42 / 108),
        ("a100-40gb:7g.40gb", 98, 40, 1555, 19.5 * 98 / 108),  # MIG mode uses 98 of 108 SMs
        ("a100-80gb:2g.20gb", 28, 20, 2039 * 2 / 8, 19.5 * 28 / 108),
        # H100 SXM: 16 SMs a slice out of 132; 80 GiB at 3350 GB/s in eighths.
        ("h100-sxm:1g.10gb", 16, 10, 3350 / 8, 67 * 16 / 132),
        ("h100-sxm:4g.40gb", 64, 40, 3350 * 4 / 8, 67 * 64 / 132),
    ],
)
def test_a_mig_slice_has_its_share_of_sms_memory_and_bandwidth(
    name, sms, memory_gib, bandwidth_gbs, fp32_tflops
):
    slice_ = get_hardware(name)
    parent = get_hardware(name.split(":")[0])
    assert slice_.name == name and slice_.sm_count == sms
    assert slice_.memory_bytes == memory_gib * GIB
    assert slice_.memory_bandwidth_bytes_per_s == pytest.approx(bandwidth_gbs * 1e9)
    assert slice_.peak_flops["fp32"] == pytest.approx(fp32_tflops * T)
    for precision, flops in parent.peak_flops.items():  # every precision by the same share
        assert slice_.peak_flops[precision] == pytest.approx(flops * sms / parent.sm_count)
    # Its own device: no NVLink peer link, no price or TDP; the host link is the GPU's.
    assert slice_.interconnect_link is None and slice_.price_per_hour is None
    assert slice_.host_link == parent.host_link and not slice_.mig


def test_seven_one_g_slices_use_the_mig_mode_sms_and_eight_tenths_of_nothing_more():
    a100 = get_hardware("a100-40gb")
    one_g = get_hardware("a100-40gb:1g.5gb")
    assert 7 * one_g.sm_count == get_hardware("a100-40gb:7g.40gb").sm_count == 98
    assert 8 * one_g.memory_bytes == a100.memory_bytes  # memory slices are eighths
    assert 7 * one_g.peak_flops["bf16"] < a100.peak_flops["bf16"]  # 98 of 108 SMs


def test_mig_names_resolve_in_lists_and_bad_ones_are_one_line():
    found = parse_hardware_list("A100-40GB:1G.5GB, h100-sxm:7g.80gb")
    assert [d.name for d in found] == ["a100-40gb:1g.5gb", "h100-sxm:7g.80gb"]
    with pytest.raises(UserError, match=r"'a100-40gb' has no MIG profile '1g\.9gb'; its profiles"):
        get_hardware("a100-40gb:1g.9gb")
    with pytest.raises(UserError, match="'l4' has no MIG profiles"):
        get_hardware("l4:1g.6gb")
    with pytest.raises(UserError, match="unknown hardware 'nope'"):
        get_hardware("nope:1g.5gb")


def test_a_mig_table_is_checked():
    base = ENTRY.format(name="mine", fp32=10)
    table = '\n[device.mig]\nsms_per_slice = 4\nsource = "https://x"\n\n[device.mig.profiles]\n'
    with pytest.raises(UserError, match="a mig table needs the GPU's sm_count"):
        one(base + table + '"1g" = { compute_slices = 1, memory_slices = 1 }\n')
    with_sms = base.replace("sources =", "sm_count = 28\nsources =") + table
    with pytest.raises(UserError, match="memory_slices must be a whole number from 1 to 8"):
        one(with_sms + '"1g" = { compute_slices = 1, memory_slices = 9 }\n')
    mine = one(with_sms + '"2g" = { compute_slices = 2, memory_slices = 4 }\n')
    assert mine.mig["profiles"]["2g"] == {"compute_slices": 2, "memory_slices": 4}


def test_new_fields_round_trip_through_the_writer():
    c = load_catalogue()
    for name in ("a100-40gb", "h100-sxm", "xeon-platinum-8180", "mi50", "gtx-580"):
        (back,) = parse_catalogue(entry_to_toml(c[name]), "written")
        assert back == c[name], name
