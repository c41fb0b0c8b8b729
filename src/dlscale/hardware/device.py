"""Hardware: one device's published (or measured) capabilities, in SI units."""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "int8", "int4")
# Integer formats count operations (TOP/s), not FLOPs: a device without an int4 peak runs int4
# products at best as int8 (weights unpacked to bytes), and without that at its fp32 rate.
PEAK_FALLBACK = {"int4": ("int8", "fp32")}
# `bench machine`'s fp32 products by shape, timed call after call (hot) and each after a write
# that evicts the caches (cold): lists of [M, K, N, FLOP/s] in `measured`.
HOT_GRID, COLD_GRID = "matmul_shape_flops_per_s", "matmul_shape_cold_flops_per_s"

# A working set is held in the caches while its copy runs this many times the memory's rate.
CACHE_SPEEDUP = 1.25


def held_cache_bytes(rates: dict[int, float], memory_rate: float) -> int:
    """The largest working set of `rates` (bytes -> copy bytes/s) up to which every copy, the
    smallest first, runs at least CACHE_SPEEDUP × `memory_rate` (a copy far larger than the
    cache); 0 where even the smallest does not (bench/machine.py cache_copy_rates)."""
    held = 0
    for size in sorted(rates):
        if rates[size] < CACHE_SPEEDUP * memory_rate:
            break
        held = size
    return held


# Fallbacks when an entry gives none. Efficiency: the fraction of a published peak that a large,
# well-shaped kernel reaches in practice. Op overhead: fixed time per operator (kernel launch and
# framework dispatch), which dominates small layers. Each entry may override all three.
DEFAULT_COMPUTE_EFFICIENCY = {"cpu": 0.7, "gpu": 0.7, "tpu": 0.6}
DEFAULT_MEMORY_EFFICIENCY = {"cpu": 0.7, "gpu": 0.8, "tpu": 0.8}
DEFAULT_OP_OVERHEAD_S = {"cpu": 5e-6, "gpu": 8e-6, "tpu": 10e-6}
# The fixed cost of one step of dlscale's own loop, outside the model's ops: the sampler and the
# batch gather, the step's timers, the loss read back to the host, the progress events. It is
# host work, and after the loss read-back (which waits for the device every step) the device's
# queue is empty until the next step's first launch, so on an accelerator it overlaps nothing:
# it adds in full. `bench machine` measures it (`loop_step_s`); this default is the figure it
# measured on the 2-core development machine (AMD EPYC, torch 2.13, one thread, 2026-11-27:
# 0.1–0.3 ms at a load average near 2, 0.3–1.0 ms at 4–7), its quieter figure rounded, taken as
# the cost of the same Python on any host core.
DEFAULT_STEP_OVERHEAD_S = {"cpu": 2e-4, "gpu": 2e-4, "tpu": 2e-4}
# Ops torch DDP's reducer issues a gradient tensor, as dlscale's ddp runs it (its gradients
# views of the buckets, train/ddp_hook.wrap): the copy into its bucket; none back (torch's
# default, the buckets apart, copies each back too: torch.profiler counts aten::copy_).
REDUCER_OPS_PER_TENSOR = 1

# Winograd's minimal filtering F(2×2, 3×3) computes a 2×2 output tile of a 3×3 convolution with
# 16 multiplies instead of 36: 2.25× fewer (Lavin and Gray, "Fast Algorithms for Convolutional
# Neural Networks", CVPR 2016, arXiv:1509.09308). cuDNN has shipped Winograd kernels for 3×3
# stride-1 convolutions since v5 and picks them when they are fastest; on a catalogue GPU such a
# convolution at the fp32 (CUDA-core) rate is counted at this factor above its direct-count
# rate. F(4×4, 3×3) would be 4×; its transforms cost more, so the smaller tile is assumed.
WINOGRAD_F2X2_3X3_SPEEDUP = 36 / 16


@dataclass(frozen=True)
class Hardware:
    """A device: peak FLOP/s per precision, memory, links, power, sources.

    For CPUs, `memory_bytes` is the platform's maximum supported RAM (or the measured RAM for
    `local`) and the host link is absent: a CPU trains from its own memory.
    """

    name: str  # the key users type: "a100-40gb", "local"
    display_name: str
    kind: str  # "cpu" | "gpu" | "tpu"
    vendor: str
    peak_flops: dict[str, float]  # precision -> FLOP/s (int8: OP/s); dense, no sparsity
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    host_link: str | None = None  # "PCIe 4.0 x16"
    host_link_bytes_per_s: float | None = None  # one direction
    interconnect: str | None = None  # "NVLink 3 (12 links)"
    interconnect_bytes_per_s: float | None = None  # total per device, both directions
    interconnect_link: str | None = None  # its Link's name in links.toml: "nvlink3"
    tdp_w: float | None = None
    price_per_hour: float | None = None  # USD per device-hour, cloud on-demand where offered
    price_source: str | None = None  # where the price was read
    price_date: str | None = None  # when: "2026-11"
    compute_efficiency: float | None = None
    # precision -> the share of its peak a large matrix product reaches, from a published (or
    # measured) GEMM figure; a precision not listed takes compute_efficiency or the default.
    compute_efficiency_by_precision: dict[str, float] = field(default_factory=dict)
    efficiency_source: str | None = None  # where those shares were published (or measured)
    # The device's convolution library picks Winograd for 3×3 stride-1 layers (cuDNN from v5 on
    # Maxwell and later): see winograd_speedup().
    winograd_convs: bool = False
    memory_efficiency: float | None = None
    op_overhead_s: float | None = None
    sources: tuple[str, ...] = ()
    notes: str = ""
    measured: dict = field(default_factory=dict)  # `local` only: raw `bench machine` results
    # A systolic-array chip: rows, cols, arrays, clock_mhz, sram_kib (profiler/systolic.py).
    systolic: dict | None = None
    # Cores and caches. CPUs (one socket): cores, hardware threads, L1 data and L2 per core, L3
    # per socket. GPUs: streaming multiprocessors (NVIDIA) or compute units (AMD), L2 per device.
    cores: int | None = None
    threads: int | None = None
    sm_count: int | None = None
    l1d_kib_per_core: float | None = None
    l2_kib_per_core: float | None = None
    l2_mib: float | None = None
    l3_mib: float | None = None
    # Published figures another source gives differently: figure, ours, theirs, source, why.
    differs: tuple[dict, ...] = ()
    # MIG profiles (hardware/mig.py): name -> {compute_slices, memory_slices}, with
    # sms_per_slice and the profile table's source; empty where the GPU has no MIG.
    mig: dict = field(default_factory=dict)

    def peak(self, precision: str) -> tuple[float, str]:
        """Peak FLOP/s for a training precision, and the precision actually used for it.

        Mixed precision trains its matrix products in bf16/fp16; a device without those units
        runs them at its fp32 rate. fp32 training is not assumed to use TF32. int4 without an
        int4 peak runs at the int8 one where there is one (PEAK_FALLBACK).
        """
        if precision in self.peak_flops:
            return self.peak_flops[precision], precision
        for fallback in PEAK_FALLBACK.get(precision, ()):
            if fallback in self.peak_flops:
                return self.peak_flops[fallback], fallback
        return self.peak_flops["fp32"], "fp32"

    @property
    def efficiency_compute(self) -> float:
        return self.compute_efficiency or DEFAULT_COMPUTE_EFFICIENCY[self.kind]

    def efficiency_at(self, precision: str) -> float:
        """The share of the peak a large matrix product reaches at `precision` (the precision
        its products actually run at, after peak()'s fallback): the entry's figure for that
        precision, else its one compute_efficiency, else the default for its kind."""
        return self.compute_efficiency_by_precision.get(precision, self.efficiency_compute)

    @property
    def efficiency_memory(self) -> float:
        return self.memory_efficiency or DEFAULT_MEMORY_EFFICIENCY[self.kind]

    @property
    def overhead_per_op_s(self) -> float:
        if self.op_overhead_s is not None:
            return self.op_overhead_s
        return DEFAULT_OP_OVERHEAD_S[self.kind]

    @property
    def overhead_per_step_s(self) -> float:
        """The fixed cost of one step of dlscale's loop: measured (`local`), else the default."""
        measured = self.measured.get("loop_step_s")
        return DEFAULT_STEP_OVERHEAD_S[self.kind] if measured is None else float(measured)

    @property
    def dispatch_s(self) -> float:
        """One op issued from C++ with no autograd (DDP's reducer copying a gradient into its
        bucket): a bare op's dispatch as `bench machine` times it (an add of one element), else
        the per-op default."""
        measured = self.measured.get("op_overhead_s", {}).get("add_s")
        return self.overhead_per_op_s if measured is None else float(measured)

    @property
    def ddp_fixed_step_s(self) -> float:
        """What torch DDP adds to a step beyond its reducer's ops and bytes (its forward's
        bookkeeping, the comm hook's call, a one-process all-reduce handed to gloo's threads):
        measured on a CPU by `bench machine` (a tiny model's step under DDP less its bare step,
        less that model's reducer ops at `dispatch_s`: one a parameter tensor and one for its
        one bucket); 0 where it was not measured."""
        loop = self.measured.get("loop") or {}
        measured = loop.get("ddp_step_s")
        if measured is None:
            return 0.0
        # An entry measured before the gradients were bucket views: a copy each way a tensor.
        per_tensor = REDUCER_OPS_PER_TENSOR if loop.get("ddp_bucket_view") else 2
        probe_ops = per_tensor * int(loop.get("ddp_probe_tensors", 0)) + 1
        return max(0.0, float(measured) - probe_ops * self.dispatch_s)

    def host_copy_bytes_per_s(self, pinned: bool) -> tuple[float | None, str]:
        """The rate a batch crosses the host link at, one direction, and how it is priced:
        'pinned', 'pageable' (measured by `bench machine` on `local`), or 'pageable, priced
        as pinned' where no pageable rate was measured (catalogue entries: a pageable copy is
        staged through the driver's pinned buffer by host memcpy, a figure of the host, not
        of the device). None: no host link (a CPU trains from its own memory)."""
        pageable = self.measured.get("host_link", {}).get("pageable_h2d_bytes_per_s")
        if not pinned and pageable:
            return float(pageable), "pageable"
        how = "pinned" if pinned else "pageable, priced as pinned (no pageable rate measured)"
        return self.host_link_bytes_per_s, how

    def measures_matmul(self, precision: str) -> bool:
        """Whether products at this precision run at a measured curve, not the peak."""
        return bool(self.measured.get("matmul_flops_per_s", {}).get(self.peak(precision)[1]))

    def measures_rate(self, precision: str, path: tuple[str, ...]) -> bool:
        """Whether an op whose measured points sit at `path` (conv, attention) gets a measured
        rate: its own points at fp32, else the matmul curve it falls back to."""
        if precision == "fp32" and self._points(path):
            return True
        return self.measures_matmul(precision)

    def measures_memory_op(self, op: str, working_set_bytes: int | None = None) -> bool:
        """Whether a memory-bound op's share of bandwidth was measured, not the default."""
        if working_set_bytes is not None and self.measured.get("optimizer_efficiency"):
            return True
        return op in self.measured.get("op_efficiency", {})

    def matmul_rate(self, precision: str, flops_per_op: float) -> float:
        """FLOP/s one matrix product of this size reaches.

        With a measured curve (`local`: FLOP/s of n×n products by n), the rate at the product's
        equivalent square size n = (FLOPs / 2)^(1/3), interpolated in log n and clamped to the
        measured range: small products run far below the peak. Otherwise peak × the efficiency
        at the precision the product runs at.
        """
        peak, used = self.peak(precision)
        curve = self.measured.get("matmul_flops_per_s", {}).get(used)
        if not curve or flops_per_op <= 0:
            return peak * self.efficiency_at(used)
        size = max(1.0, flops_per_op / 2) ** (1 / 3)
        return _interpolate({int(n): rate for n, rate in curve.items()}, size)

    def measures_gemm(self, precision: str) -> bool:
        """Whether products at this precision run at measured rates: by shape, else by size."""
        if precision == "fp32" and self._points((HOT_GRID,)):
            return True
        return self.measures_matmul(precision)

    def gemm_rate(self, precision: str, m: float, k: float, n: float, cold: bool = False) -> float:
        """FLOP/s one (M × K) · (K × N) product reaches: on a measured fp32 grid of (M, K, N,
        FLOP/s) points (`local`), interpolated in log M, log K and log N and clamped to the
        grid; else (another precision, an entry measured before the grid) the square curve at
        its FLOPs (matmul_rate). `cold`: its operands come from memory (reads_cold), on the grid
        timed so where there is one, never faster than the hot grid (a product whose operands
        pass the cache read them from memory there too: where its cold time came out shorter,
        that is the timing's noise: up to 15% at single shapes on the 2-core development machine).

        A training step's products are skinny (tokens × d × 4d, d × tokens × 4d in backward):
        the square of equal FLOPs can run at another rate than the shape itself.
        """
        hot = self._grid_rate(precision, HOT_GRID, m, k, n)
        if not cold or not self._points((COLD_GRID,)):
            return hot
        return min(hot, self._grid_rate(precision, COLD_GRID, m, k, n))

    def _grid_rate(self, precision: str, grid: str, m: float, k: float, n: float) -> float:
        return self._measured_rate(
            precision, 2 * m * k * n, (grid,), lambda points: _on_grid(points, m, k, n)
        )

    def cache_copy_rate(self, working_set_bytes: float) -> float | None:
        """Bytes/s a copy of this working set runs at where it stays in the caches: on the
        copies `bench machine` timed by working set (`cache_copy_bytes_per_s`, a CPU),
        interpolated in log bytes and clamped to them; None where it timed none."""
        points = self.measured.get("cache_copy_bytes_per_s")
        if not points:
            return None
        return _interpolate({float(size): rate for size, rate in points}, working_set_bytes)

    def copy_rate(self, working_set_bytes: float) -> float:
        """Bytes/s (read + write) a copy of this working set runs at: the copies `bench machine`
        timed by working set up to the largest it timed, its memory copy past it (a CPU); else
        the memory bandwidth at the device's efficiency."""
        points = self.measured.get("cache_copy_bytes_per_s")
        memory = self.measured.get("copy_bytes_per_s")
        if points and memory and working_set_bytes > max(size for size, _ in points):
            return float(memory)
        return self.cache_copy_rate(working_set_bytes) or (
            self.memory_bandwidth_bytes_per_s * self.efficiency_memory
        )

    def cache_held_bytes(self) -> int | None:
        """How much of its last-level cache this process holds (held_cache_bytes of the copies
        `bench machine` timed by working set against its memory copy rate); None where it timed
        none."""
        points = self.measured.get("cache_copy_bytes_per_s")
        memory = self.measured.get("copy_bytes_per_s")
        if not points or not memory:
            return None
        return held_cache_bytes({int(size): rate for size, rate in points}, memory)

    def reads_cold(self, state_bytes: int, precision: str = "fp32") -> bool:
        """Whether a training step whose parameters, gradients and optimizer state take
        `state_bytes` reads its products' operands from memory: that state passes this
        device's last-level cache (as much of it as `bench machine`'s copies found this process
        holds, where it timed them: cache_held_bytes), so between two uses of a weight the
        step has streamed more than the cache holds; only where `bench machine` timed the
        products that way (a CPU) and at the precision it timed them in (fp32).
        """
        cache = self.measured.get("last_level_cache_bytes")
        held = self.cache_held_bytes()
        if cache and held is not None:
            cache = min(cache, held)
        cold = precision == "fp32" and self._points((COLD_GRID,))
        return bool(cache is not None and cold and state_bytes > cache)

    def conv_rate(
        self,
        precision: str,
        flops: float,
        weight: float,
        pixels: float,
        phase: str = "forward",
        winograd: bool = False,
    ) -> float:
        """FLOP/s a convolution (or its backward, by `phase`) reaches, counted in its direct
        FLOPs: on a measured fp32 grid of (weight elements, output pixels, FLOP/s) points
        (`local`), interpolated in log weight and log pixels (see _conv_on_grid for beyond
        it); else what a matrix product of its FLOPs reaches, times Winograd's saving where it
        applies.

        Few channels (a small weight) or few output pixels run far below a matrix product of
        the same FLOPs: im2col, layout changes and the fixed cost of each call.
        `winograd`: the convolution is one Winograd's F(2×2, 3×3) computes (3×3, stride 1, no
        dilation, one group); see winograd_speedup().
        """
        rate = self._measured_rate(
            precision,
            flops,
            ("conv_flops_per_s", phase),
            lambda grid: _conv_on_grid(grid, weight, pixels, extend=self.kind != "cpu"),
        )
        return rate * (self.winograd_speedup(precision) if winograd else 1.0)

    def first_touch_seconds(self, new_outputs: list[int]) -> float:
        """What the new tensors of a phase (their bytes) cost beyond the writes that fill them:
        on a CPU whose `bench machine` measured it, each one at or above the allocator's
        threshold (`first_touch.threshold_bytes`) comes from the kernel as fresh pages, faulted
        in and zeroed one at a time on its first write (`first_touch.s_per_byte`: 0.42–0.48 ns
        a byte on the 2-core development machine, where the sum that fills it takes 0.1 ns a
        byte; VGG-16's 411 MB weight gradient pays about 0.2 s a step). Nothing elsewhere: a
        GPU's caching allocator keeps its blocks."""
        figure = self.measured.get("first_touch")
        if not figure:
            return 0.0
        large = sum(size for size in new_outputs if size >= figure["threshold_bytes"])
        return large * figure["s_per_byte"]

    def per_sample_pointwise_convs(self) -> bool:
        """Whether this device runs a small 1×1 convolution (profiler.recorder.small_pointwise)
        as one product per sample, not as one convolution: a CPU measured at one thread
        (`local` whose `bench machine` ran at one), where torch picks its own im2col kernels
        over oneDNN for them. ResNet-50 at batch 4 on the 2-core development machine: its 33
        such layers took 134 ms a step against 49 ms on the convolution grid."""
        return self.kind == "cpu" and self.measured.get("threads") == 1

    def winograd_speedup(self, precision: str) -> float:
        """How much faster than its direct count a Winograd-eligible convolution runs here.

        On an entry marked `winograd_convs` (no measured convolution grid), at the fp32
        CUDA-core rate: F(2×2, 3×3)'s 2.25× fewer multiplies. Not on a measured entry (its grid
        timed what the library picked), an entry not marked (CPUs, TPUs, Kepler), or at Tensor
        Core precisions (assumed implicit GEMM there: no published figure says otherwise).
        """
        if not self.winograd_convs or "conv_flops_per_s" in self.measured:
            return 1.0
        return WINOGRAD_F2X2_3X3_SPEEDUP if self.peak(precision)[1] == "fp32" else 1.0

    def attention_rate(
        self, precision: str, flops: float, keys: float, causal: bool, phase: str = "forward"
    ) -> float:
        """FLOP/s a fused attention kernel (or its backward, by `phase`) reaches: on a measured
        fp32 curve of (keys per query, FLOP/s) points (`local`), causal or full, interpolated in
        log keys and clamped to it; else what a matrix product of its FLOPs reaches.

        A flash kernel works in blocks of keys: with few keys per query its blocks run part
        full (on a CPU, a third to a half of the matmul rate at 64 keys). A causal kernel skips
        the masked blocks that the FLOP count includes, so it counts faster at many keys.
        """
        kind = "causal" if causal else "full"
        return self._measured_rate(
            precision,
            flops,
            ("attention_flops_per_s", kind, phase),
            lambda points: _interpolate({float(k): rate for k, rate in points}, max(1.0, keys)),
        )

    def _measured_rate(
        self, precision: str, flops: float, path: tuple[str, ...], read: Callable[[list], float]
    ) -> float:
        """`read` applied to the measured list of points at `path` in `measured`, for an fp32 op
        that computes; where there is none (another precision, no FLOPs, an entry of another
        shape), what a matrix product of the op's FLOPs reaches."""
        found = self._points(path)
        if not found or flops <= 0 or precision != "fp32":
            return self.matmul_rate(precision, flops)
        return read(found)

    def _points(self, path: tuple[str, ...]) -> list | None:
        """The measured list of points at `path` in `measured`, or None."""
        found = self.measured
        for key in path:
            found = found.get(key) if isinstance(found, dict) else None
        return found if isinstance(found, list) and found else None

    def op_efficiency(self, op: str, working_set_bytes: int | None = None) -> float:
        """Share of memory bandwidth a memory-bound op reaches: measured per op, or the default.

        `working_set_bytes`: the op is one of the optimizer's, on one parameter tensor whose
        parameter, gradient and state take that many bytes. Where the optimizer was measured
        inside training steps at several working sets (`local`), the share at this one,
        interpolated in log bytes and clamped to the measured range; it exceeds 1 where the
        caches hold the tensor's state between its ops and between steps.
        """
        curve = self.measured.get("optimizer_efficiency")
        if working_set_bytes is not None and curve:
            points = _streaming_as_one(curve, self.measured.get("last_level_cache_bytes"))
            return _interpolate(points, max(1.0, working_set_bytes))
        return self.measured.get("op_efficiency", {}).get(op, self.efficiency_memory)


# A working set this many times the last-level cache streams from memory: an update's rate
# there is one rate, whatever the size (the bandwidth probe's own rule, bench/machine.py).
STREAMING_CACHES = 4


def _streaming_as_one(curve: list, cache_bytes: int | None) -> dict[float, float]:
    """The update curve's points by working set, those that stream (≥ STREAMING_CACHES × the
    last-level cache) set to their median: repeated measurements of one rate. On the 2-core
    development machine the same fused update's rate there came out at 29–30 GB/s for one
    point and 46–48 for the other, which point varying from run to run (docs/performance.md,
    "The fused CPU update"): interpolating between them priced one layer at the slow reading."""
    points = {float(size): share for size, share in curve}
    if cache_bytes:
        streaming = [size for size in points if size >= STREAMING_CACHES * cache_bytes]
        if len(streaming) > 1:
            median = statistics.median(points[size] for size in streaming)
            points.update(dict.fromkeys(streaming, median))
    return points


def _on_grid(grid: list, *at: float) -> float:
    """y at `at` on a grid of (x1, …, xd, y) points (convolutions: weight, pixels; products: M,
    K, N): interpolated in log of the last coordinate along each measured value of the ones
    before it, then in log of each earlier one across them; clamped to the grid."""
    if len(at) == 1:
        return _interpolate({float(x): y for x, y in grid}, max(1.0, at[0]))
    by_first: dict[float, list] = {}
    for first, *rest in grid:
        by_first.setdefault(float(first), []).append(rest)
    inner = {x: _on_grid(rest, *at[1:]) for x, rest in by_first.items()}
    return _interpolate(inner, max(1.0, at[0]))


def _conv_on_grid(grid: list, weight: float, pixels: float, extend: bool = True) -> float:
    """A convolution's rate on a grid of (weight, pixels, FLOP/s) points: interpolated inside
    it, clamped below it and in weight. Beyond its largest output, with `extend` (an
    accelerator), the trend of its last two output sizes goes on in log pixels (a GPU fills more
    of its cores with more pixels; an older `local` stopped at 8,192, far below a GPU's layers),
    never falling, and never above the fastest rate the grid measured: no layer is assumed
    faster than the best one timed. Without it (a CPU) the rate stays the largest output's: a
    CPU's cores are busy long before, and LeNet's first layer at batch 512 (294,912 output
    pixels, 150 weights) ran at 20.7 GFLOP/s forward on the 2-core development machine against
    21.5 at the grid's 8,192 pixels, which the trend had raised to 44.8 (docs/performance.md)."""
    sizes = sorted({float(p) for _, p, _ in grid})
    edge = _on_grid(grid, weight, pixels)
    if not extend or len(sizes) < 2 or pixels <= sizes[-1]:
        return edge
    top, below = sizes[-1], sizes[-2]
    per_log = (edge - _on_grid(grid, weight, below)) / math.log(top / below)
    best = max(rate for *_, rate in grid)
    return min(best, edge + max(0.0, per_log) * math.log(pixels / top))


def _interpolate(curve: dict[float, float], x: float) -> float:
    """y at x on a measured curve, linear in log x, clamped to the measured range."""
    points = sorted(curve.items())
    logs = [math.log(key) for key, _ in points]
    target = math.log(x)
    i = bisect.bisect_left(logs, target)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    weight = (target - logs[i - 1]) / (logs[i] - logs[i - 1])
    return points[i - 1][1] + weight * (points[i][1] - points[i - 1][1])
