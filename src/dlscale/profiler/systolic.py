"""Layers on a systolic array: weight-, input- and output-stationary dataflows, cycle by cycle.

Every matrix product a traced step runs is one or more GEMMs (profiler/gemms.py): a linear
layer's or a convolution's forward, and in backward the gradient of its input and of its
weight; attention's products per batch × head. A GEMM (M × K) · (K × N) maps onto an array of
R × C processing elements as SCALE-Sim maps it (Samajdar et al., "A Systematic Methodology for
Characterizing Scalability of DNN Accelerators using SCALE-Sim", ISPASS 2020): a convolution's M
is the output pixels (× batch), K its window (kh·kw·C_in per group), N its filters. The step's
other work (elementwise ops, norms, softmax, the optimizer) runs on no array; its share of the
FLOPs is reported apart. Each dataflow keeps one operand in the array and streams the others:

| dataflow | stays in the PEs | rows (Sr) | columns (Sc) | streamed over (T) |
|---|---|---|---|---|
| os, output stationary | the outputs | M | N | K |
| ws, weight stationary (the TPU) | the weights | K | N | M |
| is, input stationary | the inputs | K | M | N |

A fold is one R × C tile of Sr × Sc; there are ⌈Sr/R⌉·⌈Sc/C⌉ of them, run one after another.
A fold takes T + R + C − 2 cycles output-stationary (T steps, plus filling and draining the
skewed wavefront), and T + 2R + C − 2 weight- or input-stationary (R more to load the
stationary operand). These are SCALE-Sim's compute cycles exactly (tested against it).

Several arrays on a chip (a TPU's MXUs) split the columns among them. Memory: an operand that
fits its SRAM buffer is read from DRAM once; one that does not is read again for every fold
that streams it (the other operand's folds). A layer takes the longer of its compute cycles at
the clock and its DRAM bytes at the chip's bandwidth.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

from dlscale.errors import UserError
from dlscale.profiler.gemms import Gemm

DATAFLOWS = ("os", "ws", "is")
STAYS = {"os": "outputs", "ws": "weights", "is": "inputs"}


@dataclass(frozen=True)
class Array:
    """A chip's systolic arrays: R × C PEs each, the clock, each operand's SRAM buffer."""

    rows: int
    cols: int
    arrays: int
    clock_hz: float
    dram_bytes_per_s: float
    ifmap_sram_bytes: int
    filter_sram_bytes: int
    ofmap_sram_bytes: int


@dataclass(frozen=True)
class Mapping:
    gemm: Gemm
    dataflow: str
    folds: int
    cycles: int
    utilization: float  # useful MACs / (cycles × R × C × arrays)
    dram_bytes: int
    seconds: float
    bound: str  # "compute" or "memory"


def spatio_temporal(dataflow: str, m: int, k: int, n: int) -> tuple[int, int, int]:
    """(Sr, Sc, T) of a GEMM under a dataflow (the table above)."""
    if dataflow == "os":
        return m, n, k
    if dataflow == "ws":
        return k, n, m
    if dataflow == "is":
        return k, m, n
    raise UserError(f"--dataflow: '{dataflow}' is not one of {', '.join(DATAFLOWS)}")


def fold_cycles(dataflow: str, rows: int, cols: int, t: int) -> int:
    """One fold's cycles: T steps and the wavefront's fill and drain (+R to preload)."""
    return t + rows + cols - 2 + (0 if dataflow == "os" else rows)


def compute_cycles(dataflow: str, m: int, k: int, n: int, rows: int, cols: int) -> tuple:
    """(folds, cycles) of one GEMM on one R × C array: SCALE-Sim's compute cycles."""
    if rows < 1 or cols < 1:
        raise UserError(f"a systolic array needs at least 1 row and 1 column (got {rows} × {cols})")
    sr, sc, t = spatio_temporal(dataflow, m, k, n)
    folds = math.ceil(sr / rows) * math.ceil(sc / cols)
    return folds, folds * fold_cycles(dataflow, rows, cols, t)


def map_gemm(gemm: Gemm, dataflow: str, array: Array, element_bytes: int) -> Mapping:
    """One GEMM (all its repeats) on the chip: cycles, utilisation, DRAM traffic, time."""
    sr, sc, t = spatio_temporal(dataflow, gemm.m, gemm.k, gemm.n)
    per_array = math.ceil(sc / array.arrays)  # the arrays share the columns
    row_folds, col_folds = math.ceil(sr / array.rows), math.ceil(per_array / array.cols)
    folds = row_folds * col_folds
    cycles = folds * fold_cycles(dataflow, array.rows, array.cols, t) * gemm.repeats
    utilization = gemm.macs / (cycles * array.rows * array.cols * array.arrays)
    dram = _dram_bytes(gemm, dataflow, array, row_folds, col_folds, element_bytes)
    compute_s, memory_s = cycles / array.clock_hz, dram / array.dram_bytes_per_s
    bound = "compute" if compute_s >= memory_s else "memory"
    return Mapping(
        gemm,
        dataflow,
        folds * gemm.repeats,
        cycles,
        utilization,
        dram,
        max(compute_s, memory_s),
        bound,
    )


def _dram_bytes(gemm, dataflow, array, row_folds, col_folds, element_bytes) -> int:
    """Each operand once if it fits its buffer, else once per fold of the other operand; the
    outputs once, plus a read and write of partial sums per extra fold of K where K is split."""
    a, b, c = gemm.m * gemm.k, gemm.k * gemm.n, gemm.m * gemm.n  # inputs, weights, outputs
    fits = {
        "a": a * element_bytes <= array.ifmap_sram_bytes,
        "b": b * element_bytes <= array.filter_sram_bytes,
        "c": c * element_bytes <= array.ofmap_sram_bytes,
    }
    if dataflow == "os":  # inputs stream per column fold, weights per row fold
        elements = a * (1 if fits["a"] else col_folds) + b * (1 if fits["b"] else row_folds) + c
    elif dataflow == "ws":  # weights once; inputs per column fold; K split over row folds
        partial = 0 if fits["c"] else 2 * c * (row_folds - 1)
        elements = b + a * (1 if fits["a"] else col_folds) + c + partial
    else:  # is: inputs once; weights per column fold; K split over row folds
        partial = 0 if fits["c"] else 2 * c * (row_folds - 1)
        elements = a + b * (1 if fits["b"] else col_folds) + c + partial
    return elements * element_bytes * gemm.repeats


def step_gemms(trace) -> list[Gemm]:
    """Every GEMM a traced step ran (profiler/gemms.py), forward then backward per module,
    named by the module and phase that ran it."""
    found = []
    for layer in trace.layers:
        for phase in ("forward", "backward"):
            for gemm in getattr(layer, phase).gemms:
                found.append(replace(gemm, name=f"{layer.name} {phase}: {gemm.name}"))
    return found


@dataclass(frozen=True)
class Unmapped:
    """The step's FLOPs the arrays do not run, as the trace counts them (the profile's)."""

    step_flops: int  # forward, backward and optimizer: the profile's "step FLOPs"
    other_flops: int  # elementwise, reductions, norms, softmax, losses, the optimizer
    products: dict[str, int]  # matrix-product FLOPs of aten ops no GEMM is known for, by op

    @property
    def flops(self) -> int:
        return self.other_flops + sum(self.products.values())

    @property
    def mapped_flops(self) -> int:
        return self.step_flops - self.flops

    @property
    def share(self) -> float:
        return self.flops / self.step_flops if self.step_flops else 0.0


def unmapped(trace) -> Unmapped:
    """What of the traced step no GEMM covers: its vector work, and the matrix products of any
    op whose operands are not known as a GEMM."""
    step, other, products = trace.optimizer_flops, trace.optimizer_flops, Counter()
    for layer in trace.layers:
        for cost in (layer.forward, layer.backward):
            step += cost.flops
            other += cost.other_flops
            products.update(cost.unmapped_products)
    return Unmapped(step, other, dict(products))


def best_reason(m: int, k: int, n: int, dataflow: str) -> str:
    """Why a dataflow suits a GEMM: what it keeps in place and how often that is reused."""
    reuse = {"os": k, "ws": m, "is": n}[dataflow]
    return f"{STAYS[dataflow]} stay in the array, each used {reuse:,} times"


@dataclass(frozen=True)
class LayerChoice:
    gemm: Gemm
    by_dataflow: dict[str, Mapping]
    best: str
    reason: str


def array_of(hardware) -> Array:
    """The systolic description of a catalogue entry (one line when it has none)."""
    table = hardware.systolic
    if not table:
        raise UserError(
            f"--dataflow: hardware '{hardware.name}' has no systolic array description; use a "
            "TPU (tpu-v2, tpu-v3, tpu-v4) or add `systolic = { rows = R, cols = C, arrays = A, "
            "clock_mhz = F, sram_kib = S }` to its entry in a hardware file"
        )
    sram = int(table["sram_kib"] * 1024)
    return Array(
        int(table["rows"]),
        int(table["cols"]),
        int(table.get("arrays", 1)),
        table["clock_mhz"] * 1e6,
        hardware.memory_bandwidth_bytes_per_s,
        sram // 3,
        sram // 3,
        sram // 3,
    )


def choose(
    gemms: list[Gemm], array: Array, element_bytes: int, dataflows: tuple[str, ...] = DATAFLOWS
) -> list[LayerChoice]:
    """Every GEMM under every dataflow, and the one that runs it soonest, with why."""
    found = []
    for gemm in gemms:
        mapped = {df: map_gemm(gemm, df, array, element_bytes) for df in dataflows}
        best = min(mapped, key=lambda df: (mapped[df].seconds, mapped[df].cycles))
        found.append(LayerChoice(gemm, mapped, best, best_reason(gemm.m, gemm.k, gemm.n, best)))
    return found


def totals(choices: list[LayerChoice]) -> dict[str, dict[str, float]]:
    """Per dataflow, the whole model's cycles, seconds, DRAM bytes and mean utilisation."""
    found = {}
    for df in choices[0].by_dataflow if choices else ():
        rows = [c.by_dataflow[df] for c in choices]
        cycles = sum(r.cycles for r in rows)
        found[df] = {
            "cycles": cycles,
            "seconds": sum(r.seconds for r in rows),
            "dram_bytes": sum(r.dram_bytes for r in rows),
            "utilization": sum(r.utilization * r.cycles for r in rows) / cycles if cycles else 0,
        }
    return found
