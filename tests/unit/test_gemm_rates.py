"""Matrix products priced by their own shape on a measured (M, K, N) grid, the square curve
where there is none; every rate worked out by hand."""

import pytest
import torch
from torch import nn

from dlscale.bench import machine
from dlscale.bench.matmul import cold_shape_grid, shape_grid
from dlscale.hardware.device import Hardware, held_cache_bytes
from dlscale.profiler.gemms import Gemm
from dlscale.profiler.recorder import PhaseCost
from dlscale.profiler.roofline import phase_time, predict
from dlscale.profiler.trace import trace_step

G = 1e9
# Measured squares: 1 GFLOP/s at n = 10, 8 at n = 1000.
SQUARES = {"fp32": {"10": 1 * G, "1000": 8 * G}}


def rate(m: int, k: int, n: int) -> float:
    """The injected grid's rates: 1 GFLOP/s, + 2 for a long M, + 1 for a long K, + 4 for a
    long N. Linear in each side's log, so interpolating the grid gives it back exactly."""
    return (1 + 2 * (m == 1000) + 1 * (k == 1000) + 4 * (n == 1000)) * G


GRID = [[m, k, n, rate(m, k, n)] for m in (10, 1000) for k in (10, 1000) for n in (10, 1000)]


def cpu(measured: dict) -> Hardware:
    return Hardware(
        name="local",
        display_name="local",
        kind="cpu",
        vendor="x",
        peak_flops={"fp32": 8 * G, "bf16": 2 * G},
        memory_bytes=2**30,
        memory_bandwidth_bytes_per_s=1e10,
        op_overhead_s=0.0,
        compute_efficiency=1.0,
        measured=measured,
    )


def linear_step():
    """A traced training step of Linear(64, 256) at batch 32 with SGD, its input needing a
    gradient (so its backward has both products)."""
    return trace_step(
        lambda: nn.Linear(64, 256),
        torch.zeros(64),
        32,
        "fp32",
        lambda params: torch.optim.SGD(params, lr=0.1),
        "sgd",
        input_requires_grad=True,
    )


def test_a_skinny_product_runs_at_its_shapes_rate_not_at_the_squares():
    hw = cpu({"matmul_flops_per_s": SQUARES, "matmul_shape_flops_per_s": GRID})
    # M = 100 is half way from 10 to 1000 in log: 1 + 2·½ + 1 + 4 = 7 GFLOP/s.
    assert hw.gemm_rate("fp32", 100, 1000, 1000) == pytest.approx(7 * G)
    # The square of its FLOPs, n = (2e8 / 2)^(1/3) = 464, is 5/6 of the way up in log n (ln
    # 46.4 / ln 100 = 0.833): 1 + 7 × 0.833 = 6.83 GFLOP/s, which the shape no longer uses.
    assert hw.matmul_rate("fp32", 2e8) == pytest.approx(6.833 * G, rel=1e-3)
    assert hw.gemm_rate("fp32", 1000, 100, 10) == pytest.approx(3.5 * G)  # 1 + 2 + ½
    assert hw.gemm_rate("fp32", 5, 5000, 1) == pytest.approx(2 * G)  # clamped to the grid
    assert hw.measures_gemm("fp32")


def test_without_a_grid_a_product_falls_back_to_the_square_curve():
    old_entry = cpu({"matmul_flops_per_s": SQUARES})  # measured before the grid existed
    flops = 2 * 100 * 1000 * 1000
    assert old_entry.gemm_rate("fp32", 100, 1000, 1000) == old_entry.matmul_rate("fp32", flops)
    assert old_entry.measures_gemm("fp32")
    # The grid is fp32's: bf16 products take the curve (none here: the bf16 peak).
    hw = cpu({"matmul_flops_per_s": SQUARES, "matmul_shape_flops_per_s": GRID})
    assert hw.gemm_rate("bf16", 100, 1000, 1000) == pytest.approx(2 * G)
    assert not cpu({}).measures_gemm("fp32")


def test_each_product_of_a_phase_pays_its_own_shape_and_the_unmapped_rest_the_square():
    hw = cpu({"matmul_flops_per_s": SQUARES, "matmul_shape_flops_per_s": GRID})
    linear = Gemm("addmm", 100, 1000, 1000)  # 2e8 FLOPs at 7 GFLOP/s
    # 10 products of 10 × 1000 × 100 run as M = 100 rows: 1 + 1 + 1 + 2 = 5 GFLOP/s.
    batched = Gemm("bmm", 10, 1000, 100, repeats=10)
    unmapped = 16_000  # one product known only by its FLOPs: n = 20 on the squares
    cost = PhaseCost(
        matmul_flops=2 * linear.macs + 2 * batched.macs + unmapped,
        matmul_ops=3,
        gemms=[linear, batched],
    )
    square_rate = (1 + 7 * 0.150515) * G  # log(20 / 10) / log(1000 / 10) = 0.150515
    expected = 2e8 / (7 * G) + 2e7 / (5 * G) + unmapped / square_rate
    assert phase_time(cost, hw, "fp32").compute_s == pytest.approx(expected, rel=1e-5)
    assert phase_time(cost, hw, "fp32").compute_measured


def test_a_traced_linear_layers_products_are_priced_by_shape():
    """Forward x·Wᵀ (32 × 64 × 256), backward dY·W (32 × 256 × 64) and dYᵀ·x (256 × 32 × 64):
    each at its own grid rate (the grid: 1 GFLOP/s per long side of 1000, sides 10 and 1000)."""
    grid = [
        [m, k, n, (1 + (m == 1000) + (k == 1000) + (n == 1000)) * G]
        for m in (10, 1000)
        for k in (10, 1000)
        for n in (10, 1000)
    ]
    hw = cpu({"matmul_shape_flops_per_s": grid})
    step = linear_step()
    layer = next(layer for layer in step.layers if layer.forward.gemms)

    def at(side: int) -> float:  # log(side / 10) / log(100): a side's share of a long one
        return torch.tensor(side / 10).log().item() / torch.tensor(100.0).log().item()

    def seconds(m, k, n):
        return 2 * m * k * n / ((1 + at(m) + at(k) + at(n)) * G)

    forward = seconds(32, 64, 256)
    backward = seconds(32, 256, 64) + seconds(256, 32, 64)
    assert [(g.m, g.k, g.n) for g in layer.backward.gemms] == [(32, 256, 64), (256, 32, 64)]
    assert phase_time(layer.forward, hw, "fp32").compute_s == pytest.approx(
        forward + layer.forward.other_flops / (8 * G), rel=1e-5
    )
    assert phase_time(layer.backward, hw, "fp32", "backward").compute_s == pytest.approx(
        backward + layer.backward.other_flops / (8 * G), rel=1e-5
    )


def test_the_bench_times_every_combination_of_sides_up_to_its_largest_product():
    points = shape_grid(torch.device("cpu"), 0.001, sides=(2, 4), most_macs=32)
    shapes = [[m, k, n] for m in (2, 4) for k in (2, 4) for n in (2, 4)]
    assert [point[:3] for point in points] == shapes[:-1]  # 4³ = 64 > 32: left out
    assert all(point[3] > 0 for point in points)


# The same grid timed with its operands read from memory: every rate halved.
COLD = [[m, k, n, rate / 2] for m, k, n, rate in GRID]


def test_a_cold_product_runs_at_the_rate_timed_cold_and_only_past_the_cache():
    hw = cpu({"matmul_shape_flops_per_s": GRID, "matmul_shape_cold_flops_per_s": COLD})
    hw.measured["last_level_cache_bytes"] = 1000
    assert hw.gemm_rate("fp32", 100, 1000, 1000, cold=True) == pytest.approx(3.5 * G)  # 7 / 2
    assert hw.gemm_rate("fp32", 100, 1000, 1000) == pytest.approx(7 * G)
    assert hw.gemm_rate("bf16", 100, 1000, 1000, cold=True) == pytest.approx(2 * G)  # no grid
    assert hw.reads_cold(1001) and not hw.reads_cold(1000)  # the state passes the cache, or not
    assert not hw.reads_cold(10**9, "bf16")  # the grids are fp32's: bf16 products stay hot
    # Without the cold grid (an entry measured before it), or the cache's size: hot, as before,
    # not the slower of the shape's rate and the square curve's (3.33 GFLOP/s at 10 · 10 · 1000).
    hot_only = cpu(
        {
            "matmul_flops_per_s": SQUARES,
            "matmul_shape_flops_per_s": GRID,
            "last_level_cache_bytes": 1000,
        }
    )
    assert hot_only.gemm_rate("fp32", 100, 1000, 1000, cold=True) == pytest.approx(7 * G)
    assert hot_only.gemm_rate("fp32", 10, 10, 1000, cold=True) == pytest.approx(5 * G)
    assert not hot_only.reads_cold(10**9)
    assert not cpu({"matmul_shape_cold_flops_per_s": COLD}).reads_cold(10**9)
    # A cold point timed faster than the hot one (noise: the operands passed the cache in both)
    # keeps the hot rate; the others still take theirs.
    noisy = [
        [m, k, n, rate * 2 if (m, k, n) == (1000, 1000, 1000) else rate] for m, k, n, rate in COLD
    ]
    hw = cpu({"matmul_shape_flops_per_s": GRID, "matmul_shape_cold_flops_per_s": noisy})
    assert hw.gemm_rate("fp32", 1000, 1000, 1000, cold=True) == pytest.approx(8 * G)
    assert hw.gemm_rate("fp32", 10, 10, 10, cold=True) == pytest.approx(0.5 * G)


def test_a_step_whose_state_passes_the_cache_prices_its_products_cold():
    """Linear(64, 256) trained with SGD: 16,640 parameters and their gradients, 133,120 bytes
    of state. Past a cache of 100,000 bytes each product takes twice as long (the cold grid's
    rates are half); under one of 10**6 the step is the hot one."""
    step = linear_step()
    assert step.optimizer_working_set_bytes == 2 * 4 * (64 * 256 + 256)
    predictions = {}
    for cache in (100_000, 10**6):
        measured = {"matmul_shape_flops_per_s": GRID, "matmul_shape_cold_flops_per_s": COLD}
        hw = cpu({**measured, "last_level_cache_bytes": cache})
        predictions[cache] = predict(step, hw)
    cold, hot = predictions[100_000], predictions[10**6]
    assert cold.products_cold and not hot.products_cold
    layer = next(layer for layer in step.layers if layer.forward.gemms)
    hw = cpu({"matmul_shape_flops_per_s": GRID})
    products = sum(
        2 * g.macs / hw.gemm_rate("fp32", g.m, g.k, g.n)
        for g in [*layer.forward.gemms, *layer.backward.gemms]
    )
    by_layer = {
        name: {t.name: t.forward.compute_s + t.backward.compute_s for t in p.layers}
        for name, p in (("cold", cold), ("hot", hot))
    }
    assert by_layer["cold"][layer.name] - by_layer["hot"][layer.name] == pytest.approx(products)


def test_a_cold_step_prices_its_layers_products_cold_and_its_batched_ones_hot():
    """A batched product multiplies activations the step has just made (in GPT-2's step its
    [4, 64, 64] products ran nearer their hot time than their cold one): it stays hot."""
    hw = cpu({"matmul_shape_flops_per_s": GRID, "matmul_shape_cold_flops_per_s": COLD})
    linear, batched = Gemm("addmm", 100, 1000, 1000), Gemm("bmm", 10, 1000, 100, repeats=10)
    cost = PhaseCost(
        matmul_flops=2 * linear.macs + 2 * batched.macs, matmul_ops=2, gemms=[linear, batched]
    )
    hot = 2e8 / (7 * G) + 2e7 / (5 * G)  # as in the test of each product's own shape above
    assert phase_time(cost, hw, "fp32").compute_s == pytest.approx(hot, rel=1e-5)
    cold = 2e8 / (3.5 * G) + 2e7 / (5 * G)  # the layer's product at half its rate, bmm hot
    assert phase_time(cost, hw, "fp32", cold=True).compute_s == pytest.approx(cold, rel=1e-5)


def test_the_report_says_where_a_steps_products_were_priced_cold():
    from dlscale.profiler import profile
    from dlscale.profiler.report import step_parts_line, to_json
    from dlscale.profiler.target import resolve

    # The zoo's MLP with SGD: 535,818 parameters and their gradients, 4.3 MB of state.
    workload = resolve("mlp", 32, [784], "fp32", "sgd", False, {})
    said = {}
    for cache in (10**6, 10**9):
        measured = {"matmul_shape_flops_per_s": GRID, "matmul_shape_cold_flops_per_s": COLD}
        hw = cpu({**measured, "last_level_cache_bytes": cache})
        shown = to_json(profile(workload, [hw]))["hardware"][0]
        said[cache] = (shown["products_cold"], step_parts_line(shown))
    assert said[10**6][0] is True and said[10**9][0] is False
    phrase = "products at their rates read from memory"
    assert phrase in said[10**6][1] and phrase not in said[10**9][1]


def test_last_level_caches_counts_each_shared_cache_once(tmp_path, monkeypatch):
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})

    def cpu_caches(cpu: int, l3_shared: str | None) -> None:
        levels = [
            (0, "Data", 1, str(cpu)),
            (1, "Instruction", 1, str(cpu)),
            (2, "Unified", 2, str(cpu)),
        ]
        if l3_shared is not None:
            levels.append((3, "Unified", 3, l3_shared))
        for index, kind, level, shared in levels:
            folder = tmp_path / f"cpu{cpu}" / "cache" / f"index{index}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "type").write_text(kind + "\n")
            (folder / "level").write_text(f"{level}\n")
            (folder / "shared_cpu_list").write_text(shared + "\n")

    for cpu in range(4):  # two core complexes of two cores, each with its own L3
        cpu_caches(cpu, "0-1" if cpu < 2 else "2-3")
    assert machine.last_level_caches(str(tmp_path)) == 2
    for cpu in range(4):  # one L3 for all four
        cpu_caches(cpu, "0-3")
    assert machine.last_level_caches(str(tmp_path)) == 1
    assert machine.last_level_caches(str(tmp_path / "none")) == 1  # sysfs silent: one


def test_the_cold_bench_times_the_same_shapes_as_the_hot_one():
    points = cold_shape_grid(torch.device("cpu"), 1 << 20, 2, sides=(2, 4), most_macs=32)
    hot = shape_grid(torch.device("cpu"), 0.001, sides=(2, 4), most_macs=32)
    assert [point[:3] for point in points] == [point[:3] for point in hot]
    assert all(0 < point[3] < float("inf") for point in points)


def test_no_cold_grid_where_the_cache_size_is_unknown_or_on_a_gpu(monkeypatch):
    monkeypatch.setattr(machine, "last_level_cache_bytes", lambda device: None)
    assert machine.cold_grid(torch.device("cpu"), quick=True) is None
    monkeypatch.setattr(machine, "last_level_cache_bytes", lambda device: 50 * 2**20)
    monkeypatch.setattr(machine, "last_level_caches", lambda: 1)
    assert machine.cold_grid(torch.device("cuda"), quick=True) is None  # nothing timed there
    flushes = []
    monkeypatch.setattr(machine, "cold_shape_grid", lambda *args: flushes.append(args) or [])
    assert machine.cold_grid(torch.device("cpu"), quick=True) == []
    assert flushes == [(torch.device("cpu"), 100 * 2**20, machine.COLD_CALLS[True])]


MiB = 2**20


def test_the_cache_a_process_holds_ends_where_its_copies_slow_to_memorys_rate():
    # The development machine's VM at one thread (GB/s by working set): 15 from memory, so a
    # working set holds if its copy runs at 1.25 × 15 = 18.75 or faster, and every smaller one
    # did too.
    rates = {MiB: 70, 2 * MiB: 42, 4 * MiB: 22, 64 * MiB: 25, 128 * MiB: 17, 256 * MiB: 15}
    assert held_cache_bytes(rates, 15) == 64 * MiB
    dip = {MiB: 70, 2 * MiB: 16, 4 * MiB: 30}  # a slow size ends it, whatever comes after
    assert held_cache_bytes(dip, 15) == MiB
    assert held_cache_bytes({MiB: 18}, 15) == 0  # not even the smallest
    timed = machine.cache_copy_rates(torch.device("cpu"), 4 * MiB, 0.001)
    assert list(timed) == [MiB, 2 * MiB, 4 * MiB] and all(rate > 0 for rate in timed.values())
    # A cache of no power of two: the doublings below it, then the cache itself.
    assert list(machine.cache_copy_rates(torch.device("cpu"), 3 * MiB, 0.001)) == [
        MiB,
        2 * MiB,
        3 * MiB,
    ]
    assert machine.cache_copy_rates(torch.device("cpu"), MiB // 2, 0.001) == {}


def test_a_step_reads_cold_past_the_cache_its_process_holds_not_the_one_reported():
    hw = cpu({"matmul_shape_flops_per_s": GRID, "matmul_shape_cold_flops_per_s": COLD})
    hw.measured["last_level_cache_bytes"] = 300 * MiB  # a host socket's, as a VM reports it
    assert not hw.reads_cold(81 * MiB)  # GPT-2's state as benchmarked: inside 300 MiB
    # The copies by working set (GB/s) against the memory's 15: 64 MiB held.
    copies = [[MiB, 70e9], [64 * MiB, 25e9], [128 * MiB, 17e9], [300 * MiB, 15e9]]
    hw.measured.update(cache_copy_bytes_per_s=copies, copy_bytes_per_s=15e9)
    assert hw.cache_held_bytes() == 64 * MiB
    assert hw.reads_cold(81 * MiB) and not hw.reads_cold(64 * MiB)
    hw.measured["copy_bytes_per_s"] = 60e9  # nothing held: every step's state passes it
    assert hw.cache_held_bytes() == 0 and hw.reads_cold(1)
    hw.measured["copy_bytes_per_s"] = 1e9  # all held, but never past the reported cache
    assert hw.cache_held_bytes() == 300 * MiB and hw.reads_cold(301 * MiB)
    hw.measured["last_level_cache_bytes"] = 200 * MiB
    assert hw.reads_cold(201 * MiB)
