"""The op recorder: every aten op's FLOPs and bytes, attributed to a module and a phase.

FLOPs of conv, linear, matmul and attention come from `torch.utils.flop_counter.flop_registry`,
the formulas FlopCounterMode uses (FLOPs = 2 × MACs); the CPU's fused attention kernel, which it
lacks, gets its formula for the CUDA flash kernel. Other compute (elementwise, reductions,
norms, pooling, losses) counts one FLOP per element of the op's largest tensor. Every op moves the
bytes of its tensor inputs and outputs (batch norm in training reads its input twice: `REREAD`);
views move nothing. Unknown ops are listed by name.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from dlscale.profiler import attention
from dlscale.profiler.gemms import Gemm, op_gemms

# Ops that move no data and compute nothing (beyond views, which torch marks itself).
_FREE = {
    "detach",
    "alias",
    "lift_fresh",
    "_unsafe_view",
    "unsafe_split",
    "unsafe_chunk",
    "_local_scalar_dense",
    "_record_function_enter_new",
    "_record_function_exit",
    "record_stream",
    "set_",
    "resize_",
}
# Ops that only create a tensor: they write their output, compute nothing.
_FACTORY = {
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "zeros",
    "zeros_like",
    "new_zeros",
    "ones",
    "ones_like",
    "new_ones",
    "full",
    "full_like",
    "new_full",
    "arange",
    "scalar_tensor",
    "fill_",
    "zero_",
}
# Ops that move data without arithmetic: bytes, no FLOPs.
_MOVE = {
    "clone",
    "copy_",
    "_to_copy",
    "cat",
    "stack",
    "embedding",
    "index_select",
    "gather",
    "scatter",
    "scatter_add",
    "index",
    "index_put",
    "index_put_",
    "tril",
    "triu",
    "constant_pad_nd",
    "repeat",
    "flip",
    "roll",
    "select_backward",
    "slice_backward",
    "embedding_dense_backward",
    "masked_fill",
    "masked_fill_",
    "_unsafe_index",
    "contiguous",
}
# Non-pointwise compute counted at one FLOP per element of the largest tensor.
_ELEMENTWISE_LIKE = {
    "sum",
    "mean",
    "amax",
    "amin",
    "max",
    "min",
    "var",
    "var_mean",
    "std",
    "norm",
    "linalg_vector_norm",
    "cumsum",
    "prod",
    "_softmax",
    "_log_softmax",
    "_safe_softmax",
    "_softmax_backward_data",
    "_log_softmax_backward_data",
    "native_layer_norm",
    "native_layer_norm_backward",
    "native_batch_norm",
    "native_batch_norm_backward",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training",
    "native_group_norm",
    "native_group_norm_backward",
    "max_pool2d_with_indices",
    "max_pool2d_with_indices_backward",
    "avg_pool2d",
    "avg_pool2d_backward",
    "_adaptive_avg_pool2d",
    "_adaptive_avg_pool2d_backward",
    "adaptive_max_pool2d",
    "adaptive_max_pool2d_backward",
    "nll_loss_forward",
    "nll_loss_backward",
    "nll_loss2d_forward",
    "nll_loss2d_backward",
    "_fused_dropout",
    "native_dropout",
    "native_dropout_backward",
    "bernoulli_",
    "bernoulli",
    "rand_like",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_lstm_cell_backward_impl",
    "_thnn_fused_gru_cell",
}

# Batch norm in training passes over its activations twice: one pass reduces them to the batch's
# mean and variance, the next normalizes (reads them again) and writes the output. Its backward
# likewise reduces grad_out and input to two sums per channel, then reads both again to write the
# input's gradient. That is how PyTorch's CUDA kernels run it (batch_norm_stats then
# batch_norm_elemt; batch_norm_backward_reduce then batch_norm_backward_elemt: pytorch/pytorch
# aten/src/ATen/native/cuda/Normalization.cu @000e0689, read 2026-11-27), and the two sub-layers
# Jung et al. split BN into ("Restructuring Batch Normalization to Accelerate CNN Training",
# SysML 2019, arXiv:1807.01702). An activation too large for the caches comes from memory both
# times, so these tensors are counted once more than the inputs + outputs rule counts them.
# op -> (its training flag, the positions of the tensors read twice)
REREAD = {
    "native_batch_norm": ("training", (0,)),
    "_native_batch_norm_legit": ("training", (0,)),
    "_native_batch_norm_legit_functional": ("training", (0,)),
    "native_batch_norm_backward": ("train", (0, 1)),
}

LOSS = "(loss)"
OPTIMIZER = "(optimizer)"
MODEL = "(model)"  # ops in the root module's own forward, or autograd's own bookkeeping


@dataclass
class PhaseCost:
    """What one phase (forward or backward) of one module did."""

    matmul_flops: int = 0  # conv / linear / matmul / attention (FlopCounterMode's formulas)
    other_flops: int = 0  # elementwise, reductions, norms, pooling, losses: 1 per element
    bytes: int = 0  # inputs + outputs of every op, views excluded
    ops: int = 0  # aten ops launched (each pays a fixed dispatch or kernel-launch cost)
    matmul_ops: int = 0  # of which matrix products (their size sets the rate they reach)
    # The convolutions among the matrix products, one (FLOPs, weight elements, output pixels)
    # each: their speed depends on the weight's size and the number of output pixels.
    convs: list[tuple[int, int, int]] = field(default_factory=list)
    # One flag per entry of `convs`: a 3×3, stride-1, undilated, ungrouped convolution, which a
    # GPU library computes with Winograd's algorithm (hardware.device.winograd_speedup).
    conv_winograd: list[bool] = field(default_factory=list)
    # One entry per entry of `convs`: for a 1×1 convolution of stride 1 on a batch under 16, the
    # one product per sample that torch's CPU backend computes it as at one thread, not oneDNN
    # (small_pointwise); else None.
    conv_pointwise: list[Gemm | None] = field(default_factory=list)
    # Fused attention kernels among them, one (FLOPs, keys per query, causal?) each: how many
    # keys a query attends to sets how well the kernel's blocks fill, and a causal kernel skips
    # the masked half of them.
    attention: list[tuple[int, int, bool]] = field(default_factory=list)
    bytes_by_op: Counter[str] = field(default_factory=Counter)  # non-matmul ops' bytes, by op
    # Bytes of each tensor of NEW_OUTPUT_MIN_BYTES or more that an op returns in new memory (not
    # written in place, not a view): on a CPU the largest come from the kernel afresh every
    # step (Hardware.first_touch_seconds).
    new_outputs: list[int] = field(default_factory=list)
    # The matrix products as GEMMs (M × K × N), what a systolic array is fed (profiler/gemms.py)
    gemms: list[Gemm] = field(default_factory=list)
    unmapped_products: Counter[str] = field(default_factory=Counter)  # FLOPs of ops with none
    # Run inside one fused recurrent kernel (a CPU's fp32 LSTM, profiler/recurrent.py): the
    # bytes a time step reads, mostly its weights, which stay in the caches from step to step;
    # 0: dispatched op by op.
    kernel_step_bytes: int = 0

    @property
    def flops(self) -> int:
        return self.matmul_flops + self.other_flops

    @property
    def conv_flops(self) -> int:
        return sum(flops for flops, _, _ in self.convs)

    def conv_shapes(self) -> list[tuple[int, int, int, bool, Gemm | None]]:
        """Each convolution's (FLOPs, weight elements, output pixels, Winograd-eligible?, its
        product per sample if a small pointwise one); one listed without them (a cost built by
        hand) is neither."""
        missing = len(self.convs)
        winograd = self.conv_winograd + [False] * (missing - len(self.conv_winograd))
        pointwise = self.conv_pointwise + [None] * (missing - len(self.conv_pointwise))
        return [
            (*conv, eligible, small)
            for conv, eligible, small in zip(self.convs, winograd, pointwise, strict=True)
        ]

    @property
    def attention_flops(self) -> int:
        return sum(flops for flops, _, _ in self.attention)

    def add(self, other: PhaseCost) -> None:
        self.matmul_flops += other.matmul_flops
        self.other_flops += other.other_flops
        self.bytes += other.bytes
        self.ops += other.ops
        self.matmul_ops += other.matmul_ops
        self.convs.extend(other.convs)
        self.conv_winograd.extend(other.conv_winograd)
        self.conv_pointwise.extend(other.conv_pointwise)
        self.attention.extend(other.attention)
        self.bytes_by_op.update(other.bytes_by_op)
        self.new_outputs.extend(other.new_outputs)
        self.gemms.extend(other.gemms)
        self.unmapped_products.update(other.unmapped_products)


# Ops whose result depends on the values of tensors, which a trace never computes: a Python
# branch on a tensor (`if x.sum() > 0`) and `.item()`/`.tolist()` read a scalar; nonzero and its
# kin make a shape out of values.
DATA_DEPENDENT = {
    "_local_scalar_dense",
    "item",
    "is_nonzero",
    "equal",
    "nonzero",
    "nonzero_static",
    "masked_select",
    "unique",
    "_unique",
    "_unique2",
    "unique_consecutive",
    "unique_dim",
    "repeat_interleave",
    "bincount",
    "histc",
}


class OpFailure(RuntimeError):
    """An aten op failed while tracing: which op, in which module, in which phase."""

    def __init__(self, op: str, module: str, phase: str, error: BaseException):
        super().__init__(f"aten.{op} in '{module}' ({phase}): {error}")
        self.op, self.module, self.phase, self.error = op, module, phase, error
        self.module_type = "?"  # filled in by the tracer, which knows the modules

    @property
    def data_dependent(self) -> bool:
        return self.op in DATA_DEPENDENT


class ModuleFailure(RuntimeError):
    """The model's own Python code failed while `module` ran."""

    def __init__(self, module: str, module_type: str, error: BaseException):
        super().__init__(f"in '{module}' ({module_type}): {error}")
        self.module, self.module_type, self.error = module, module_type, error


class Recorder(TorchDispatchMode):
    """Attributes every aten op's FLOPs and bytes to the module (and phase) running it."""

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []  # forward: the modules being run, outermost first
        self.node_owner: dict[object, str] = {}  # autograd node -> module whose forward made it
        self.scope: str | None = None  # LOSS or OPTIMIZER while those run outside modules
        self.costs: dict[tuple[str, str], PhaseCost] = {}
        self.uncounted: Counter[str] = Counter()

    def current(self) -> tuple[str, str]:
        """(module name, phase) of the op being run."""
        node = torch._C._current_autograd_node()
        if node is not None:
            return self.node_owner.get(node, MODEL), "backward"
        if self.stack:
            return self.stack[-1], "forward"
        return self.scope or MODEL, "forward"

    def claim(self, outputs, owner: str, boundary: frozenset = frozenset()) -> None:
        """Give `owner` the graph nodes behind `outputs` made since its inputs (`boundary`).

        The walk stops at the inputs' nodes. It passes through nodes an inner module claimed
        first (inner modules finish, and claim, before their container does) without taking
        them: a module's own ops can sit between two children, as attention sits between its
        input and output projections.
        """
        pending = [t.grad_fn for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)]
        seen: set[object] = set()
        while pending:
            node = pending.pop()
            if node is None or node in boundary or node in seen:
                continue
            seen.add(node)
            self.node_owner.setdefault(node, owner)
            pending.extend(next_node for next_node, _ in node.next_functions)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            out = func(*args, **kwargs)
        except OpFailure:
            raise
        except Exception as exc:  # named here: which op, in which module, forward or backward
            module, phase = self.current()
            raise OpFailure(func.overloadpacket.__name__, module, phase, exc) from exc
        name = func.overloadpacket.__name__
        # prim.device and kin: a fake tensor's metadata queries, dispatched like ops (a meta
        # tensor answers them without a dispatch); they move and compute nothing
        if func.is_view or name in _FREE or func.namespace == "prim":
            return out
        cost = PhaseCost(ops=1)
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        large = [t for t in outputs if nbytes(t) >= NEW_OUTPUT_MIN_BYTES]
        if large:  # an output in an input's storage was written in place (`add_`, `out=`)
            written = {storage_id(t) for t in inputs}
            cost.new_outputs = [nbytes(t) for t in large if storage_id(t) not in written]
        if name in _FACTORY:
            cost.bytes = sum(nbytes(t) for t in outputs)
        else:
            cost.bytes = sum(nbytes(t) for t in inputs + outputs) + reread_bytes(func, args, kwargs)
            cost.bytes += written_in_place_bytes(func, args, kwargs)
            packet = func.overloadpacket
            formula = flop_registry.get(packet) or attention.cpu_formula(name)
            if formula is not None:
                cost.matmul_flops = int(formula(*args, **kwargs, out_val=out))
                cost.matmul_ops = 1
                cost.gemms = op_gemms(name, args, out)
                if not cost.gemms and cost.matmul_flops:  # reported as not mapped, by op
                    cost.unmapped_products[name] = cost.matmul_flops
                if name in _CONV:
                    cost.convs.append(conv_shape(name, args, out, cost.matmul_flops))
                    cost.conv_winograd.append(winograd_eligible(name, args))
                    cost.conv_pointwise.append(small_pointwise(name, args, out))
                if name in attention.KERNELS:
                    cost.attention.append(attention.shape(func, args, kwargs, cost.matmul_flops))
            elif torch.Tag.pointwise in func.tags or name in _ELEMENTWISE_LIKE:
                cost.other_flops = max((t.numel() for t in inputs + outputs), default=0)
            elif name.startswith("_foreach_") or name in FUSED_OPTIMIZERS:
                # one kernel over a list of tensors, elementwise (a fused optimizer's a pass)
                cost.other_flops = sum(t.numel() for t in args[0] if isinstance(t, torch.Tensor))
            elif name not in _MOVE:
                self.uncounted[name] += 1
            if not cost.matmul_ops:
                cost.bytes_by_op[name] = cost.bytes
        key = self.current()
        self.costs.setdefault(key, PhaseCost()).add(cost)
        return out


_CONV = {"convolution", "convolution_backward"}
# New outputs smaller than this are not listed: no allocator hands them fresh pages each step
# (glibc's threshold for that is 32 MiB: bench/machine.py FRESH_MAPPING_BYTES).
NEW_OUTPUT_MIN_BYTES = 2**20


def conv_shape(name: str, args, out, flops: int) -> tuple[int, int, int]:
    """(FLOPs, weight elements, output pixels) of a convolution or of its backward."""
    # convolution(input, weight, ...) -> output; convolution_backward(grad_output, input,
    # weight, ...), whose grad_output has the output's shape.
    output, weight = (out, args[1]) if name == "convolution" else (args[0], args[2])
    return flops, weight.numel(), output.numel() // max(1, output.shape[1])


# torch's CPU convolution runs a 1×1 kernel of stride 1 and dilation 1 on fewer than this many
# samples with its own im2col + GEMM kernels (ConvBackend Slow2d/Slow3d) when one thread computes
# it, and every other shape with oneDNN (use_mkldnn in aten/src/ATen/native/Convolution.cpp,
# torch 2.13; tests/unit/test_conv_backend.py checks the rule against torch's own selection).
# On this machine's one thread that path ran ResNet-50's 1×1 layers at a third of the rate the
# 3×3 grid predicts for them (docs/performance.md).
POINTWISE_ONEDNN_BATCH = 16


def small_pointwise(name: str, args, out) -> Gemm | None:
    """For a convolution (or its backward) torch's CPU backend computes without oneDNN at one
    thread (every kernel side 1, stride 1, dilation 1, not transposed, a batch under 16), the
    product it runs once per sample and group, the weight times the sample's columns: output
    channels × input channels × output pixels, per group (a narrow N, few pixels, runs far
    slower than a narrow M); None for any other convolution."""
    if name == "convolution":  # (input, weight, bias, stride, padding, dilation, transposed…)
        tensor, weight, output, rest = args[0], args[1], out, args[3:]
    else:  # (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed…)
        tensor, weight, output, rest = args[1], args[2], args[0], args[4:]
    stride, _, dilation, transposed, _, groups = rest[:6]
    small = (
        all(side == 1 for side in weight.shape[2:])
        and all(step == 1 for step in stride)
        and all(gap == 1 for gap in dilation)
        and not transposed
        and tensor.shape[0] < POINTWISE_ONEDNN_BATCH
    )
    if not small:
        return None
    pixels = math.prod(output.shape[2:])
    per_group = weight.shape[0] // groups
    return Gemm("pointwise", per_group, weight.shape[1], pixels, tensor.shape[0] * groups)


def winograd_eligible(name: str, args) -> bool:
    """A 2-D 3×3 convolution of stride 1, no dilation and one group, not transposed: the shape
    Winograd's F(2×2, 3×3) computes. The same for its backward, whose input and weight
    gradients cuDNN also has Winograd kernels for. Not a 1-D kernel of 3 (cuDNN runs it as a
    1×3 filter, and its Winograd algorithm "requires 3x3 filter": NVIDIA's forum,
    https://forums.developer.nvidia.com/t/cudnn-status-not-supported-for-algo-6-and-3/165802,
    read 2026-11-27) nor a 3×3×3 one (F(2×2, 3×3)'s 36/16 is not its saving)."""
    # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
    # groups); convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
    # dilation, transposed, output_padding, groups, output_mask)
    weight, rest = (args[1], args[3:]) if name == "convolution" else (args[2], args[4:])
    stride, _, dilation, transposed, _, groups = rest[:6]
    kernel = tuple(weight.shape[2:])
    return (
        kernel == (3, 3)
        and all(step == 1 for step in stride)
        and all(gap == 1 for gap in dilation)
        and not transposed
        and groups == 1
    )


# torch's fused optimizer kernels: each updates its lists of tensors in place in one pass and
# returns nothing, so what they write is not among their outputs.
FUSED_OPTIMIZERS = {"_fused_adam_", "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_"}


def written_in_place_bytes(func, args, kwargs) -> int:
    """Bytes a fused optimizer kernel writes back: every list its schema marks written
    (`Tensor(a!)[]`: the parameters and the optimizer's state), read once and written once, so
    Adam moves 28 bytes a fp32 parameter (parameter, gradient and two moments read; parameter
    and moments written), SGD 12, SGD with momentum and Adagrad 20. The gradients, marked
    written too, are written only when a `grad_scale` is passed (unscaled in place); 0 for
    every other op (an in-place op's write is its output, counted already)."""
    if func.overloadpacket.__name__ not in FUSED_OPTIMIZERS:
        return 0
    names = [argument.name for argument in func._schema.arguments]
    values = {**dict(zip(names, args, strict=False)), **kwargs}
    written = 0
    for argument in func._schema.arguments:
        info = argument.alias_info
        if info is None or not info.is_write or argument.name == "state_steps":
            continue
        if argument.name == "grads" and values.get("grad_scale") is None:
            continue
        value = values.get(argument.name) or []
        written += sum(nbytes(t) for t in value if isinstance(t, torch.Tensor))
    return written


def reread_bytes(func, args, kwargs) -> int:
    """Bytes a batch norm in training reads a second time (`REREAD`); 0 for any other op, for
    batch norm in eval mode, and for a backward that computes no input gradient (its one
    reduction pass is all it runs)."""
    reread = REREAD.get(func.overloadpacket.__name__)
    if reread is None:
        return 0
    flag, positions = reread
    names = [argument.name for argument in func._schema.arguments]
    # Positional arguments name the schema's first ones; the rest come as keywords or defaults.
    values = {**dict(zip(names, args, strict=False)), **kwargs}
    if not values.get(flag):
        return 0
    if "output_mask" in values and not values["output_mask"][0]:
        return 0
    return sum(nbytes(args[i]) for i in positions if isinstance(args[i], torch.Tensor))


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def storage_id(tensor: torch.Tensor) -> int:
    return StorageWeakRef(tensor.untyped_storage()).cdata
