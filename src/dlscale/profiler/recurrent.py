"""The aten ops torch dispatches for an LSTM that a CPU runs as oneDNN's fused kernel.

A trace on meta (or fake) tensors takes torch's decomposed RNN path: per time step and layer a
product for the input, one for the hidden state and about ten elementwise ops, each dispatched on
its own (773 forward and 1,529 backward ops for the zoo's 64-step LSTM). On a CPU torch 2.13
instead runs a fp32 LSTM without projections as one `mkldnn_rnn_layer` per layer and direction,
and its backward as one `mkldnn_rnn_layer_backward` each (aten/src/ATen/native/RNN.cpp,
`use_mkldnn`). The same products are done inside that kernel, one per time step of batch ×
hidden rows, so the trace's FLOPs, bytes and products (which set the rate) stand; only the ops
that each pay the per-op dispatch cost are fewer: the kernels and the few ops around them, counted
here. The counts were read from real CPU tensors under a dispatch-counting mode and are checked
against it in tests/unit/test_recurrent.py. The bytes stay the trace's but for one part the kernel
does not move: the decomposed backward sums each weight's per-step gradients with T - 1 separate
`add`s (each reads two weight-sized tensors and writes one); the kernel accumulates them inside.

Nor does the kernel run every product one time step at a time. oneDNN's RNN primitive, which
the kernel calls, merges over the time steps the products that do not wait on the step before
(`merge_gemm_layer` and `merge_gemm_iter`, set by `rnn_utils::init_conf` in oneDNN's
src/cpu/rnn/rnn_utils.hpp; rnn_utils.cpp in older releases): in the forward, at fp32 and under
128 samples, the input's projection for every step (one T·B-row product instead of T of B
rows); in the backward the input's gradient (T·B rows) and both weights' gradients (summed over
the steps inside one product T·B deep). The products on the hidden state, which each step needs
from the last, stay per step. The trace's per-step products (torch's decomposed path on the meta
device) are merged so (`merged_products`), and each is priced at the rate of its merged shape:
the zoo's 64-step LSTM of 128 hidden units at batch 8, whose per-step products (8 rows; the
weights' gradients 8 deep) were priced at about 1.6× its measured forward and backward on the
2-core development machine (docs/performance.md). The bytes stay the trace's: a merged product
reads its weight once where the trace counts a read a step (an over-count, left).

Nor do its elementwise passes leave the caches: a time step's gates are a few rows of the batch,
its weights are read every step. Where `bench machine` timed copies by working set (a CPU), the
layer's phases are priced as the kernel runs a step, its products and then its gates, the next
step waiting on both: products + the gates (their FLOPs, or their bytes at the rate copies of one
kernel's weights ran, whichever is longer: `PhaseCost.kernel_step_bytes`, roofline.phase_time),
not the slower of the products and every byte at the stream bandwidth. On the development
machine's VM (2026-11-29) the zoo's LSTM at batch 8 was priced 2.58 / 4.00 ms so against
kernels of 1.06 / 2.0, and 1.08 / 1.77 now.

Left as the trace counts them: GRU and RNN (torch's CPU path decomposes them too), an LSTM with
projections, and bf16/fp16 (fused only on CPUs with oneDNN's bf16/fp16 support, not assumed).
GPUs run every RNN through cuDNN (`_cudnn_rnn`), whose dispatched ops have not been counted on
one: a GPU keeps the decomposed count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dlscale.profiler.gemms import Gemm

# A per-step product the fused kernel runs once over every step: its shape at one step (M, K,
# N), the axis that grows with the steps (0: M, rows; 1: K, the depth summed over), the steps.
StepProduct = tuple[int, int, int, int, int]
# oneDNN merges the forward's input projection over the steps only under this many samples
# (its init_conf, at fp32); the backward's merges at any batch.
FORWARD_MERGE_BATCH = 128


@dataclass(frozen=True)
class FusedCalls:
    """What a CPU that fuses the layer does differently from the trace, over the layer's calls."""

    forward_ops: int
    backward_ops: int
    accumulation_bytes: int  # the trace's backward `add`s summing per-step weight gradients
    forward_merged: tuple[StepProduct, ...] = ()  # products the kernel merges over the steps
    backward_merged: tuple[StepProduct, ...] = ()
    # One kernel's (a layer and direction's) weights, trained or not, on average over the
    # layer's kernels: the working set a time step reads, approximately (a merged input
    # projection is not read every step)
    kernel_weight_bytes: int = 0

    def __add__(self, other: FusedCalls) -> FusedCalls:
        return FusedCalls(
            self.forward_ops + other.forward_ops,
            self.backward_ops + other.backward_ops,
            self.accumulation_bytes + other.accumulation_bytes,
            self.forward_merged + other.forward_merged,
            self.backward_merged + other.backward_merged,
            max(self.kernel_weight_bytes, other.kernel_weight_bytes),
        )


def merged_products(gemms: list[Gemm], merges: tuple[StepProduct, ...]) -> list[Gemm]:
    """The trace's products with each merge's per-step products (up to its steps of that
    shape, among the trace's own: a merged product is never merged again) as one product over
    those steps, appended after the rest; the same multiply-accumulates."""
    by_shape: dict[tuple[int, int, int], list[int]] = {}
    for index, gemm in enumerate(gemms):
        if gemm.repeats == 1:
            by_shape.setdefault((gemm.m, gemm.k, gemm.n), []).append(index)
    taken: set[int] = set()
    merged = []
    for m, k, n, axis, steps in merges:
        waiting = by_shape.get((m, k, n), [])
        found, by_shape[m, k, n] = waiting[:steps], waiting[steps:]
        if len(found) < 2:
            by_shape[m, k, n] = found + by_shape[m, k, n]
            continue
        taken.update(found)
        count = len(found)
        rows, depth = (m * count, k) if axis == 0 else (m, k * count)
        merged.append(Gemm(gemms[found[0]].name, rows, depth, n))
    return [gemm for index, gemm in enumerate(gemms) if index not in taken] + merged


def cpu_fused_ops(module: nn.Module, args, kwargs, precision: str) -> FusedCalls | None:
    """One call of `module` on a CPU that fuses it; None where torch's CPU path decomposes it
    (the trace's count then stands)."""
    if not isinstance(module, nn.LSTM) or module.proj_size or precision != "fp32":
        return None
    if not torch.backends.mkldnn.is_available():
        return None
    given = [*args, *kwargs.values()]
    x = given[0] if given else None
    if not isinstance(x, torch.Tensor):  # a PackedSequence takes another path
        return None
    hx = given[1] if len(given) > 1 else None
    kernels = module.num_layers * (2 if module.bidirectional else 1)
    batch_first_copy = module.batch_first and x.dim() == 3  # time-major copy of the input
    forward = (
        kernels  # mkldnn_rnn_layer
        + 2  # stack: h_n and c_n over layers
        + (2 if hx is None else 0)  # zeros: h_0 and c_0
        + (0 if module.bias else 2 * kernels)  # zeros: the missing biases
        + (1 if batch_first_copy else 0)  # clone
        + (module.num_layers if module.bidirectional else 0)  # cat: both directions' outputs
    )
    backward = kernels  # mkldnn_rnn_layer_backward
    if module.bidirectional:  # add: the two directions' input gradients, where one is needed
        backward += module.num_layers - (0 if x.requires_grad else 1)
    if batch_first_copy and x.requires_grad:  # new_empty_strided, copy_: back to batch-first
        backward += 2
    steps = x.shape[1] if batch_first_copy else x.shape[0]
    batch = 1 if x.dim() == 2 else x.shape[0] if module.batch_first else x.shape[1]
    weights = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    hidden, gates = module.hidden_size, 4 * module.hidden_size
    directions = 2 if module.bidirectional else 1
    forward_merged: list[StepProduct] = []
    backward_merged: list[StepProduct] = []
    for layer in range(module.num_layers):
        width = module.input_size if layer == 0 else hidden * directions
        for _ in range(directions):
            if batch < FORWARD_MERGE_BATCH:  # the input's projection
                forward_merged.append((batch, width, gates, 0, steps))
            if layer > 0 or x.requires_grad:  # the input's gradient, where autograd wants one
                backward_merged.append((batch, gates, width, 0, steps))
            backward_merged += [
                (gates, batch, width, 1, steps),  # the input weight's gradient
                (gates, batch, hidden, 1, steps),  # the hidden weight's gradient
            ]
    return FusedCalls(
        forward,
        backward,
        max(0, steps - 1) * 3 * weights,
        tuple(forward_merged),
        tuple(backward_merged),
        sum(p.numel() * p.element_size() for p in module.parameters()) // kernels,
    )
