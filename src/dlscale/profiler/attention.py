"""Attention as devices run it: one fused kernel, not the math path the meta device falls back to.

`F.scaled_dot_product_attention` picks a backend per call. On a CPU (and on GPUs) that is a fused
flash kernel whenever the inputs allow it; on the meta device it is always the math path (two
batched products, a mask and a softmax), which materializes the T × T scores and saves them for
backward. Tracing that would charge the scores' bytes, saved memory and ops that a real step never
has. So while tracing, each call is sent to the kernel the CPU would choose for the same inputs
(asked of torch's own `_fused_sdp_choice`, on tiny CPU stand-ins), and the math path is kept where
the CPU would use it too (3-D inputs, dropout, a mask that needs a gradient, a user's
`sdpa_kernel(MATH)`).

FLOPs of the fused kernel come from torch's formula for the CUDA flash kernel (FlopCounterMode's):
its backward counts five products, as the kernel recomputes the scores, where the math path's
backward runs four.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.flop_counter import flop_registry

FLASH = SDPBackend.FLASH_ATTENTION.value  # as `_fused_sdp_choice` answers

CPU_FORWARD = "_scaled_dot_product_flash_attention_for_cpu"
CPU_BACKWARD = "_scaled_dot_product_flash_attention_for_cpu_backward"
CUDA_FORWARD = "_scaled_dot_product_flash_attention"
# Fused attention kernels, forward and backward, by aten name: the CPU's, which the tracer emits,
# and the CUDA ones, should a trace ever see them.
FORWARD = {
    CPU_FORWARD,
    CUDA_FORWARD,
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
}
BACKWARD = {name + "_backward" for name in FORWARD}
KERNELS = FORWARD | BACKWARD


def cpu_formula(name: str):
    """torch's FLOP formula for the CPU flash kernel (or its backward), or None for other ops.

    torch's registry has none for it, but has one for the CUDA flash kernel, whose operands come
    first in the same order: (query, key, value, ...) and (grad_out, query, key, value, ...).
    """
    twin = {CPU_FORWARD: CUDA_FORWARD, CPU_BACKWARD: CUDA_FORWARD + "_backward"}.get(name)
    return flop_registry[getattr(torch.ops.aten, twin)] if twin else None


def shape(func, args, kwargs, flops: int) -> tuple[int, int, bool]:
    """(FLOPs, keys per query, causal?) of a fused attention kernel or of its backward: what
    sets how fast it runs. Forward ops take (query, key, ...), backward ops (grad, query, key, ...).
    """
    key = args[1] if func.overloadpacket.__name__ in FORWARD else args[2]
    names = [argument.name for argument in func._schema.arguments]
    at = names.index("is_causal") if "is_causal" in names else None
    causal = kwargs.get("is_causal", args[at] if at is not None and at < len(args) else False)
    return flops, int(key.shape[-2]), bool(causal)


def _stand_in(tensor: torch.Tensor, head_size: bool) -> torch.Tensor:
    """A tiny CPU tensor that `_fused_sdp_choice` judges as it would `tensor`.

    Counting from the last dim: the head size (`head_size`, for query, key and value; else a
    mask's keys) and positions are cut to at most 2, heads are kept (grouped-query attention
    is judged by them), a batch is cut to at most 2 (so 1 against many still differs). Dtype,
    `requires_grad` and a transposed last dim are kept.
    """
    rank = tensor.dim()
    shape = []
    for dim, size in enumerate(tensor.shape):
        from_end = rank - dim
        keep = from_end == 3 or (from_end == 1 and head_size)
        shape.append(size if keep else min(size, 2))
    stand_in = torch.zeros(shape, dtype=tensor.dtype, device="cpu")
    if rank >= 2 and tensor.stride(-1) != 1 and tensor.shape[-1] > 1:
        stand_in = stand_in.transpose(-1, -2).contiguous().transpose(-1, -2)
    return stand_in.requires_grad_(tensor.requires_grad)


def cpu_would_fuse(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> bool:
    """Whether torch on a CPU runs this call as its flash kernel: torch's own choice, asked on
    stand-ins of the same rank, heads, head size, dtype, layout and need for gradients."""
    q, k, v = (_stand_in(t, head_size=True) for t in (query, key, value))
    mask = None if attn_mask is None else _stand_in(attn_mask, head_size=False)
    choice = torch.ops.aten._fused_sdp_choice(
        q, k, v, mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
    )
    return choice == FLASH


def _cpu_would_fuse_unrecorded(**call) -> bool:
    """`cpu_would_fuse` outside the tracer's dispatch mode: asking costs the traced step nothing."""
    with _disable_current_modes():
        return cpu_would_fuse(**call)


def fused(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """The CPU flash kernel's output; a boolean mask becomes an additive one, as torch does."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        like = {"dtype": query.dtype, "device": attn_mask.device}
        zero, minus_inf = torch.zeros((), **like), torch.full((), float("-inf"), **like)
        attn_mask = torch.where(attn_mask, zero, minus_inf)
    out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
    )
    return out


SDPA = torch._C._nn.scaled_dot_product_attention  # what `F.scaled_dot_product_attention` is


def _redirected(*args, **kwargs) -> torch.Tensor:
    """`F.scaled_dot_product_attention`, sent to the CPU's fused kernel where the CPU sends it."""
    call = _arguments(*args, **kwargs)
    if call["query"].device.type == "meta" and _cpu_would_fuse_unrecorded(**call):
        call.pop("enable_gqa")
        return fused(**call)
    return SDPA(*args, **kwargs)


class FusedAttention(TorchFunctionMode):
    """While tracing on meta, run scaled-dot-product attention as the CPU would.

    A mode sees every call of the builtin, however it was imported, except calls made inside a
    torch function that handles modes itself: `F.multi_head_attention_forward` (inside
    `nn.MultiheadAttention`) runs with the mode popped, so while it runs, the name it calls
    attention through (`F`'s own) is redirected too.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is SDPA:
            return _redirected(*args, **kwargs)
        if func is not F.multi_head_attention_forward:
            return func(*args, **kwargs)
        previous, F.scaled_dot_product_attention = F.scaled_dot_product_attention, _redirected
        try:
            return func(*args, **kwargs)
        finally:
            F.scaled_dot_product_attention = previous


def _arguments(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
) -> dict:
    return {
        "query": query,
        "key": key,
        "value": value,
        "attn_mask": attn_mask,
        "dropout_p": dropout_p,
        "is_causal": is_causal,
        "scale": scale,
        "enable_gqa": enable_gqa,
    }
