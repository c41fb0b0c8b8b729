"""The matrix products (GEMMs) an aten op runs: each one's M × K × N, how many, what it computes.

The tracer sees every op a step runs (profiler/recorder.py); the ops that FlopCounterMode counts
as matrix products are GEMMs whatever module ran them (nn.Linear, transformers' Conv1D, a bare
`x @ w`, attention's batched products), so a systolic array is fed from the ops, not the module
classes. A GEMM here is (M × K) · (K × N), repeated `repeats` times (a batched product, a
convolution's groups, attention's batch × heads); its multiply-accumulates are M·K·N·repeats,
which is FlopCounterMode's count / 2 for every op mapped (tested).

Convolutions are lowered as SCALE-Sim lowers them (im2col): M is the output pixels (× batch), K
the window (kh·kw·C_in per group), N the filters per group. In backward, the weight's gradient
is the window × pixels × filters product, and the input's gradient is the transposed product
(Caffe's col2im): pixels × filters × window, scattered back onto the input. That has exactly the
forward's multiply-accumulates at any stride; running it instead as a convolution over the
stride-dilated gradient would multiply stride² − 1 zeros for every real product.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlscale.profiler import attention


@dataclass(frozen=True)
class Gemm:
    name: str  # what it computes: "conv1 forward: conv", "fc1 backward: mm", ...
    m: int
    k: int
    n: int
    repeats: int = 1  # a batched product's batch, a grouped convolution's groups

    @property
    def macs(self) -> int:
        return self.m * self.k * self.n * self.repeats


_MM = {"mm": (0, 1), "addmm": (1, 2), "_scaled_mm": (0, 1)}  # which args are the two operands
_BMM = {"bmm": (0, 1), "baddbmm": (1, 2)}
_CONVOLUTION = {"convolution", "_convolution"}  # (input, weight, bias, stride, ..., groups, ...)
# The plain products (neither convolution nor attention): each one GEMM, named by its op.
PRODUCTS = frozenset({*_MM, *_BMM})
# Those that are not batched: a layer's (its weight, or an input saved since the forward, against
# what the step just made), which a step whose state passes the cache reads from memory; a
# batched product multiplies activations the step has just made (attention's scores by hand).
UNBATCHED_PRODUCTS = frozenset(_MM)


def op_gemms(name: str, args: tuple, out) -> list[Gemm]:
    """The GEMMs of one aten matrix-product op, named by what each computes; [] for one this
    does not know (the caller reports its FLOPs as not mapped)."""
    if name in _MM:
        a, b = (args[i] for i in _MM[name])
        return [Gemm(name, a.shape[0], a.shape[1], b.shape[1])]
    if name in _BMM:
        a, b = (args[i] for i in _BMM[name])
        return [Gemm(name, a.shape[1], a.shape[2], b.shape[2], a.shape[0])]
    if name in _CONVOLUTION:
        x, weight, transposed, groups = args[0], args[1], args[6], args[8]
        conv = Convolution.of(weight, x if transposed else out, groups)
        return [conv.col2im("conv") if transposed else conv.im2col("conv")]
    if name == "convolution_backward":
        return _convolution_backward(args)
    if name in attention.FORWARD:
        return _attention(*args[:3], backward=False)
    if name in attention.BACKWARD:
        return _attention(*args[1:4], backward=True)
    return []


@dataclass(frozen=True)
class Convolution:
    """A convolution as its direct (im2col) product runs it: pixels × window × filters, per
    group. A transposed convolution is the direct one read backwards (its input is the direct
    one's output), so both share this description."""

    pixels: int  # the direct convolution's output pixels, times the batch
    window: int  # kernel elements × its input channels per group
    filters: int  # its output channels per group
    groups: int

    @staticmethod
    def of(weight, direct_output, groups: int) -> Convolution:
        """From the weight and the tensor the direct convolution outputs (N, C, spatial…). The
        weight is (C_out, C_in/g, k…), or (C_in, C_out/g, k…) transposed: either way its first
        dim is the direct convolution's output channels, its second its input channels per
        group."""
        kernel = math.prod(weight.shape[2:])
        pixels = direct_output.shape[0] * math.prod(direct_output.shape[2:])
        return Convolution(pixels, weight.shape[1] * kernel, weight.shape[0] // groups, groups)

    def im2col(self, role: str) -> Gemm:
        return Gemm(role, self.pixels, self.window, self.filters, self.groups)

    def col2im(self, role: str) -> Gemm:
        return Gemm(role, self.pixels, self.filters, self.window, self.groups)


def _convolution_backward(args) -> list[Gemm]:
    # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    # transposed, output_padding, groups, output_mask)
    grad_output, x, weight, transposed, groups, mask = (args[i] for i in (0, 1, 2, 7, 9, 10))
    conv = Convolution.of(weight, x if transposed else grad_output, groups)
    found = []
    if mask[0]:  # the input's gradient: the direct product of a transposed conv, and vice versa
        found.append(conv.im2col("input grad") if transposed else conv.col2im("input grad"))
    if mask[1]:  # the weight's: window × pixels × filters
        found.append(Gemm("weight grad", conv.window, conv.pixels, conv.filters, conv.groups))
    return found


def _attention(query, key, value, backward: bool) -> list[Gemm]:
    """Fused attention's products per batch × query head, as FlopCounterMode counts them: forward
    S = Q·Kᵀ and O = P·V; backward recomputes S, then dP = dO·Vᵀ, dV = Pᵀ·dO, dQ = dS·K and
    dK = dSᵀ·Q (q: (B, H, Tq, D), k: (B, Hkv, Tk, D), v: (B, Hkv, Tk, Dv))."""
    batch, heads, queries, head_size = query.shape
    keys, value_size = key.shape[-2], value.shape[-1]
    count = batch * heads
    products = [("Q·Kᵀ", queries, head_size, keys)]
    if not backward:
        products.append(("P·V", queries, keys, value_size))
    else:
        products += [
            ("dO·Vᵀ", queries, value_size, keys),
            ("Pᵀ·dO", keys, queries, value_size),
            ("dS·K", queries, keys, head_size),
            ("dSᵀ·Q", keys, queries, head_size),
        ]
    return [Gemm(role, m, k, n, count) for role, m, k, n in products]
