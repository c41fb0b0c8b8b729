"""`dlscale profile … --inference [--precision int8|int4]`: the forward pass alone, predicted per
device at the format's rates and bytes.

Inference runs each layer's forward and nothing else: no backward, no optimizer, no saved
activations; memory is the weights plus the largest live input and output. For int8 the traced
(fp32) step's bytes are counted at one byte an element and its matrix products at the device's
int8 peak (a device without one falls back, and says so); int4 at half a byte an element and the
int4 peak, else the int8 one, else fp32 (said the same way). int8 needs a quantized kernel for every
op the model runs: torch's x86/fbgemm backend has them for convolutions, linear layers and the
elementwise, pooling and shape ops around them; a model with an op outside that set (layer
norm's statistics are fine, attention and embeddings are not) is refused in one line naming the
layer and the op.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

from dlscale.errors import UserError
from dlscale.hardware.device import Hardware
from dlscale.profiler.advice import USABLE_MEMORY_FRACTION
from dlscale.profiler.memory import ELEMENT_BYTES
from dlscale.profiler.recorder import LOSS, PhaseCost
from dlscale.profiler.roofline import phase_time
from dlscale.profiler.trace import StepTrace

# aten ops (besides matrix products) that torch's int8 CPU backend has quantized kernels for.
INT8_OPS = {
    "relu",
    "relu_",
    "threshold",
    "hardtanh",
    "hardtanh_",
    "clamp",
    "sigmoid",
    "tanh",
    "max_pool2d",
    "max_pool2d_with_indices",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    "_adaptive_avg_pool2d",
    "add",
    "add_",
    "mul",
    "mul_",
    "cat",
    "flatten",
    "view",
    "_unsafe_view",
    "reshape",
    "clone",
    "dropout",
    "native_dropout",
    "mean",
    "native_batch_norm",
    "_native_batch_norm_legit_no_training",
    "native_layer_norm",
    "gelu",
    "hardswish",
    "silu",
}
ATTENTION_OPS = ("scaled_dot_product", "_flash_attention", "_efficient_attention")


@dataclass(frozen=True)
class InferenceRow:
    hardware: str
    precision: str
    precision_used: str  # the peak the matrix products ran at
    forward_s: float
    samples_per_s: float
    weights_bytes: int
    activation_bytes: int
    fits: bool
    bound: str  # the bound of most of the forward's time: compute, memory, overhead


def check_quantized(trace: StepTrace, precision: str = "int8") -> None:
    """One line for an op integer (int8 or int4) inference has no kernel for, named with its
    layer. int4 is held to the same op set (no separate list of int4 kernels was found)."""
    for layer in trace.layers:
        if layer.name == LOSS:
            continue
        if layer.forward.attention:
            raise UserError(
                f"--precision {precision}: '{layer.name}' ({layer.type}) runs attention, "
                f"which torch has no quantized ({precision}) kernel for; {precision} inference "
                "covers convolutions, linear layers and the elementwise, pooling "
                "and shape ops around them"
            )
        for op in layer.forward.bytes_by_op:
            if op not in INT8_OPS and not op.startswith(ATTENTION_OPS):
                raise UserError(
                    f"--precision {precision}: '{layer.name}' ({layer.type}) runs aten.{op}, "
                    f"which torch has no quantized ({precision}) kernel for; {precision} inference "
                    "covers convolutions, linear layers and the elementwise, "
                    "pooling and shape ops around them"
                )


def _scaled(cost: PhaseCost, scale: float) -> PhaseCost:
    return dataclasses.replace(
        cost,
        bytes=int(cost.bytes * scale),
        bytes_by_op=Counter({op: int(b * scale) for op, b in cost.bytes_by_op.items()}),
    )


def predict_inference(trace: StepTrace, hardware: Hardware, precision: str) -> InferenceRow:
    """The forward pass of the traced batch on `hardware`, at `precision`'s rates and bytes."""
    scale = ELEMENT_BYTES[precision] / ELEMENT_BYTES[trace.precision]
    forward_s, by_bound = 0.0, Counter()
    used = precision
    for layer in trace.layers:
        if layer.name == LOSS:
            continue
        # as the device runs it: an fp32 LSTM on a CPU is its fused kernel (LayerTrace.phases;
        # at other precisions the fused kernel is not assumed, as in training)
        forward = layer.phases(hardware.kind)[0] if precision == "fp32" else layer.forward
        timed = phase_time(_scaled(forward, scale), hardware, precision)
        forward_s += timed.seconds
        by_bound[timed.bound] += timed.seconds
    if precision not in hardware.peak_flops:
        used = hardware.peak(precision)[1]
    weights = int(trace.params * ELEMENT_BYTES[precision])
    live = max(
        (int((layer.input_bytes + layer.output_bytes) * scale) for layer in trace.layers),
        default=0,
    )
    usable = hardware.memory_bytes * USABLE_MEMORY_FRACTION
    return InferenceRow(
        hardware.name,
        precision,
        used,
        forward_s,
        trace.batch_size / forward_s if forward_s else 0.0,
        weights,
        live,
        weights + live <= usable,
        by_bound.most_common(1)[0][0] if by_bound else "compute",
    )
