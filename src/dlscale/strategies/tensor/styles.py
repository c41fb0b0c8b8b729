"""A plan's styles as torch tensor-parallel styles, and the one torch lacks: convolutions split
by channels.

Linear layers use torch's own `ColwiseParallel` and `RowwiseParallel`. DTensor has no rule for
a convolution whose weight is split by output channels, so `ConvParallel` keeps the weight as
a DTensor (split on its output or input channels, so checkpoints, optimizers and gradients see
it as torch's styles' weights) and runs the convolution on the local shards, moving activations
with DTensor's own redistributions: the input's gradient summed over the devices in backward
(identity forward, all-reduce backward), the output gathered (all-gather) or summed
(all-reduce) in forward where the plan says so.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)


def whole_with_summed_grad(x: Tensor, mesh: DeviceMesh) -> Tensor:
    """`x` as it is (every device holds it whole); its gradient, which each device computes
    only in part, is summed over the devices in backward (Megatron's f operator)."""
    held = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
    return held.to_local(grad_placements=[Partial()])


def gather_channels(x: Tensor, mesh: DeviceMesh) -> Tensor:
    """Each device's channels (dim 1) side by side on every device; backward keeps its own."""
    split = DTensor.from_local(x, mesh, [Shard(1)], run_check=False)
    return split.redistribute(mesh, [Replicate()]).to_local()


def sum_partials(x: Tensor, mesh: DeviceMesh) -> Tensor:
    """The sum of every device's partial `x`, on every device (all-reduce)."""
    partial = DTensor.from_local(x, mesh, [Partial()], run_check=False)
    return partial.redistribute(mesh, [Replicate()]).to_local()


class ConvParallel(ParallelStyle):
    """A Conv2d split by channels. `style`: colwise[_gather] (output channels, input whole),
    grouped[_gather] (groups divided among the devices, input and output split), rowwise
    (input channels split, outputs summed)."""

    def __init__(self, style: str):
        self.style = style

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        assert isinstance(module, nn.Conv2d), module
        rowwise = self.style == "rowwise"
        weight_split = [Shard(1)] if rowwise else [Shard(0)]
        bias_split = [Replicate()] if rowwise else [Shard(0)]
        module.weight = nn.Parameter(
            distribute_tensor(module.weight.data, device_mesh, weight_split)
        )
        if module.bias is not None:
            module.bias = nn.Parameter(distribute_tensor(module.bias.data, device_mesh, bias_split))
        style, size = self.style, device_mesh.size()

        def forward(x: Tensor) -> Tensor:  # x: (B, C_in or its share, H, W)
            if style.startswith("colwise"):
                x = whole_with_summed_grad(x, device_mesh)
            groups = module.groups // size if style.startswith("grouped") else module.groups
            weight = module.weight.to_local()
            bias = module.bias.to_local() if module.bias is not None else None
            out = F.conv2d(
                x,
                weight,
                None if rowwise else bias,
                module.stride,
                module.padding,
                module.dilation,
                groups,
            )
            if rowwise:
                out = sum_partials(out, device_mesh)
                return out if bias is None else out + bias.view(1, -1, 1, 1)
            return gather_channels(out, device_mesh) if style.endswith("_gather") else out

        module.forward = forward
        return module


def torch_style(kind: str, style: str) -> ParallelStyle:
    if kind == "Conv2d":
        return ConvParallel(style)
    if style == "colwise":
        return ColwiseParallel()
    if style == "colwise_gather":
        return ColwiseParallel(output_layouts=Replicate())
    assert style == "rowwise", style
    return RowwiseParallel()


def apply_plan(model: nn.Module, mesh: DeviceMesh, layers: list) -> nn.Module:
    """Split `model`'s planned layers over `mesh` (torch.distributed.tensor.parallel).

    In-place activations (AlexNet's `ReLU(inplace=True)`) compute out of place: a split layer's
    output is a view of a DTensor's local part, which autograd forbids modifying in place."""
    for module in model.modules():
        if getattr(module, "inplace", False) is True:
            module.inplace = False
    plan = {layer.name: torch_style(layer.kind, layer.style) for layer in layers}
    return parallelize_module(model, mesh, plan) if plan else model
