"""Attention as devices run it: one fused kernel, not the math path the meta device falls back to.

`F.scaled_dot_product_attention` picks a backend per call. On a CPU (and on GPUs) that is a fused
flash kernel whenever the inputs allow it; on the meta device it is always the math path (two
batched products, a mask and a softmax), which materializes the T × T scores and saves them for
backward. Tracing that would charge the scores' bytes, saved memory and ops that a real step never
has. So while tracing, each call is sent to the kernel the CPU would choose for the same inputs
(asked of torch's own `_fused_sdp_choice`, on tiny CPU stand-ins), and the math path is kept where
the CPU would use it too (3-D inputs, dropout with gradients, a user's `sdpa_kernel(MATH)`).

FLOPs of the fused kernel come from torch's formula for the CUDA flash kernel (FlopCounterMode's):
its backward counts five products, as the kernel recomputes the scores, where the math path's
backward runs four.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils.flop_counter import flop_registry

FLASH = 1  # torch.nn.attention.SDPBackend.FLASH_ATTENTION, as `_fused_sdp_choice` returns it

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


def key_length(name: str, args) -> int:
    """Keys each query attends to: what sets how well a fused kernel's blocks fill."""
    key = args[1] if name in FORWARD else args[2]
    return int(key.shape[-2])


def _stand_in(tensor: torch.Tensor) -> torch.Tensor:
    """A tiny CPU tensor of `tensor`'s rank and dtype: leading dims 1, the last two at most 2.

    It matches the stand-in query and keys below (at most 2 positions each), broadcast dims of
    size 1 included, so `_fused_sdp_choice` judges it as it would `tensor`.
    """
    dims = tensor.dim()
    shape = [min(size, 2) if dim >= dims - 2 else 1 for dim, size in enumerate(tensor.shape)]
    return torch.zeros(shape, dtype=tensor.dtype)


def cpu_would_fuse(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> bool:
    """Whether torch on a CPU runs this call as its flash kernel."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return False
    if enable_gqa and query.shape[1] != key.shape[1]:
        return False
    # Batch 1 and at most 2 positions keep the stand-ins tiny; heads and head sizes are kept.
    length_q, length_k = query.shape[-2], key.shape[-2]
    q = torch.zeros(1, query.shape[1], min(length_q, 2), query.shape[-1], dtype=query.dtype)
    k = torch.zeros(1, key.shape[1], min(length_k, 2), key.shape[-1], dtype=key.dtype)
    v = torch.zeros(1, value.shape[1], min(length_k, 2), value.shape[-1], dtype=value.dtype)
    q.requires_grad_(query.requires_grad)
    mask = None if attn_mask is None else _stand_in(attn_mask)
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
        additive = torch.zeros_like(attn_mask, dtype=query.dtype)
        attn_mask = additive.masked_fill_(attn_mask.logical_not(), float("-inf"))
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
    torch function that handles modes itself (`F.multi_head_attention_forward`): that runs with
    the mode popped, so while it runs, the name it calls through (`F`'s own) is redirected too.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is SDPA:
            return _redirected(*args, **kwargs)
        if getattr(func, "__module__", None) != F.__name__:
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
        "query": query, "key": key, "value": value, "attn_mask": attn_mask,
        "dropout_p": dropout_p, "is_causal": is_causal, "scale": scale, "enable_gqa": enable_gqa,
    }  # fmt: skip
