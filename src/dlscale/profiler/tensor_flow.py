"""Which layer's output feeds which: the dataflow a tensor-parallel plan is drawn from.

One forward of a sample runs under a TorchFunctionMode that tags every tensor with the Linear
and Conv2d layers it was computed from, through operations that keep a split intact: on a
Linear's output features, activations, dropout, reshapes, head-wise attention and products of
tensors from the same layers; on a convolution's channels, activations, dropout and pooling.
A tensor tagged by a layer that meets any other operation (a norm, a residual sum with an
untagged tensor, a loss) makes that layer's output "escape": it must be whole there, so the
layer cannot leave its output split. What each Linear and Conv2d consumes, its shapes and
whether its input needs a gradient are recorded on the way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

SPLITTABLE = (nn.Linear, nn.Conv2d)

# Operations after which a Linear's output features are still split the same way (per feature,
# or per attention head when reshaped into heads).
_FEATURE_SAFE = {
    F.relu,
    torch.relu,
    Tensor.relu,
    F.gelu,
    F.silu,
    torch.tanh,
    Tensor.tanh,
    torch.sigmoid,
    Tensor.sigmoid,
    F.dropout,
    torch.dropout,
    Tensor.view,
    Tensor.reshape,
    torch.reshape,
    Tensor.transpose,
    torch.transpose,
    Tensor.permute,
    torch.permute,
    Tensor.contiguous,
    Tensor.split,
    torch.split,
    Tensor.chunk,
    torch.chunk,
    Tensor.__getitem__,
    F.scaled_dot_product_attention,
    torch.matmul,
    Tensor.__matmul__,
    torch.softmax,
    F.softmax,
    Tensor.softmax,
    Tensor.masked_fill,
    torch.mul,
    Tensor.mul,
    Tensor.__mul__,
    Tensor.__rmul__,
    Tensor.__truediv__,
    Tensor.div,
    Tensor.float,
    Tensor.to,
    Tensor.type_as,
}
# Operations after which a convolution's output channels are still split the same way.
_CHANNEL_SAFE = {
    F.relu,
    torch.relu,
    Tensor.relu,
    F.dropout,
    torch.dropout,
    F.max_pool2d,
    torch.max_pool2d,
    F.avg_pool2d,
    torch._C._nn.avg_pool2d,
    torch.tanh,
    Tensor.tanh,
}


@dataclass
class LayerFlow:
    """One Linear or Conv2d as the sample's forward used it (shapes without the batch)."""

    name: str
    kind: str  # "Linear" or "Conv2d"
    module: nn.Module
    order: int  # when it ran
    inputs_from: frozenset[str] = frozenset()  # the split layers its input was computed from
    input_shape: tuple[int, ...] = ()
    output_shape: tuple[int, ...] = ()
    input_needs_grad: bool = False
    input_itemsize: int = 4  # bytes per element as the step runs (2 for bf16 under autocast)
    output_itemsize: int = 4
    tied: bool = False  # a parameter shared with another module (GPT's head and embedding)

    @property
    def out_features(self) -> int:
        m = self.module
        return m.out_features if isinstance(m, nn.Linear) else m.out_channels

    @property
    def in_features(self) -> int:
        m = self.module
        return m.in_features if isinstance(m, nn.Linear) else m.in_channels

    @property
    def groups(self) -> int:
        return getattr(self.module, "groups", 1)


@dataclass
class Flow:
    layers: dict[str, LayerFlow]  # in the order they ran
    escaped: set[str] = field(default_factory=set)  # layers whose output must be whole somewhere


class _Tagger(TorchFunctionMode):
    def __init__(self, layers: dict[int, LayerFlow]):
        super().__init__()
        self.by_weight = layers  # id(weight) -> the layer it belongs to
        self.tags = WeakIdKeyDictionary()  # tensor -> frozenset of layer names
        self.seen: dict[str, LayerFlow] = {}
        self.escaped: set[str] = set()

    def tags_of(self, values) -> frozenset[str]:
        found: frozenset[str] = frozenset()
        for value in values:
            if isinstance(value, Tensor):
                found |= self.tags.get(value, frozenset())
        return found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flat, _ = tree_flatten((args, kwargs))
        tagged = self.tags_of(flat)
        result: frozenset[str] = frozenset()
        layer = self._layer_of(func, args, kwargs)
        if layer is not None:
            self._record(layer, args[0], out)
            result = frozenset({layer.name})
        elif tagged:
            safe = all(self._safe(func, name) for name in tagged)
            # A tensor from elsewhere that carries gradients (the residual stream) needs the
            # whole output; constants such as masks and scales do not.
            mixes = any(
                isinstance(v, Tensor) and v.requires_grad and v not in self.tags for v in flat
            )
            if safe and not mixes:
                result = tagged
            else:
                self.escaped |= tagged
        if result:
            for value in tree_flatten(out)[0]:
                if isinstance(value, Tensor):
                    self.tags[value] = result
        return out

    def _layer_of(self, func, args, kwargs) -> LayerFlow | None:
        if func not in (F.linear, F.conv2d, torch.conv2d):
            return None
        weight = args[1] if len(args) > 1 else kwargs.get("weight")
        return self.by_weight.get(id(weight))

    def _record(self, layer: LayerFlow, x: Tensor, out: Tensor) -> None:
        layer.order = len(self.seen)
        layer.inputs_from = self.tags_of([x])
        layer.input_shape = tuple(x.shape[1:])
        layer.output_shape = tuple(out.shape[1:])
        layer.input_needs_grad = x.requires_grad
        layer.input_itemsize = x.element_size()
        layer.output_itemsize = out.element_size()
        self.seen[layer.name] = layer

    def _safe(self, func, name: str) -> bool:
        layer = self.seen.get(name)
        allowed = _FEATURE_SAFE if layer is not None and layer.kind == "Linear" else _CHANNEL_SAFE
        return func in allowed


def record_flow(model: nn.Module, example: Tensor, precision: str = "fp32") -> Flow:
    """Run `example` (a batch of one or more) through `model` in eval mode, under the run's
    autocast for bf16/fp16 (so each tensor has the type it crosses devices in), and record the
    flow."""
    candidates: dict[int, LayerFlow] = {}
    owners: dict[int, int] = {}
    for name, module in model.named_modules():
        for param in module.parameters(recurse=False):
            owners[id(param)] = owners.get(id(param), 0) + 1
        if isinstance(module, SPLITTABLE):
            kind = "Linear" if isinstance(module, nn.Linear) else "Conv2d"
            candidates[id(module.weight)] = LayerFlow(name, kind, module, order=-1)
    for layer in candidates.values():
        layer.tied = any(owners[id(p)] > 1 for p in layer.module.parameters(recurse=False))
    tagger = _Tagger(candidates)
    was_training = model.training
    model.eval()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    device = example.device.type if example.device.type != "meta" else "cpu"
    try:
        with torch.autocast(device, dtype=dtype, enabled=dtype is not None), tagger:
            model(example)
    finally:
        model.train(was_training)
    ran = sorted(tagger.seen.values(), key=lambda layer: layer.order)
    return Flow({layer.name: layer for layer in ran}, tagger.escaped)
