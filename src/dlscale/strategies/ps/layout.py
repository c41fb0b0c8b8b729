"""Where the parameters live: shards of whole tensors over the servers, and a worker's flat
buffers that its model's parameters and gradients are views of."""

from __future__ import annotations

import torch
from torch import nn

from dlscale.errors import UserError


def shard_parameters(sizes: list[int], servers: int) -> list[list[int]]:
    """Split parameter tensors (by index) over `servers`, balanced by elements: largest first,
    each to the least-loaded server. A tensor is never split."""
    if servers > len(sizes):
        raise UserError(
            f"strategy.servers {servers} is more than the model's {len(sizes)} parameter tensors"
        )
    loads, shards = [0] * servers, [[] for _ in range(servers)]
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        target = min(range(servers), key=lambda s: (loads[s], s))
        shards[target].append(index)
        loads[target] += sizes[index]
    return [sorted(shard) for shard in shards]


def flatten(tensors: list[torch.Tensor], indices: list[int]) -> torch.Tensor:
    return torch.cat([tensors[i].detach().reshape(-1) for i in indices])


class FlatShards:
    """A worker's parameters and gradients as one flat fp32 buffer per server shard.

    The model's tensors are views of these buffers, so a pull lands straight in the model and a
    push sends the gradients where backward wrote them. The host buffers are what travels (or
    what a server maps, on the shared-memory plane); on a GPU the model views device buffers,
    copied from the host after a pull and to it before a push.
    """

    def __init__(self, module: nn.Module, shards: list[list[int]], device: torch.device):
        self.params = list(module.parameters())
        self.shards, self.device = shards, device
        self.host_params = [flatten(self.params, indices).cpu().clone() for indices in shards]
        self.host_grads = [torch.zeros_like(flat) for flat in self.host_params]
        self.staged = device.type != "cpu"
        self._device_buffers()
        self.bind()

    def _device_buffers(self) -> None:
        if self.staged:
            self.flat_params = [flat.to(self.device) for flat in self.host_params]
            self.flat_grads = [flat.to(self.device) for flat in self.host_grads]
        else:
            self.flat_params, self.flat_grads = self.host_params, self.host_grads

    def bind(self) -> None:
        """Make the model's parameters and gradients views of the (device) flat buffers."""
        for indices, flat, grads in zip(
            self.shards, self.flat_params, self.flat_grads, strict=True
        ):
            offset = 0
            for i in indices:
                param, n = self.params[i], self.params[i].numel()
                param.data = flat[offset : offset + n].view_as(param)
                param.grad = grads[offset : offset + n].view_as(param)
                offset += n

    def replace_host(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        """Move to other host buffers (shared-memory files), keeping the values."""
        for new, old in zip([*params, *grads], [*self.host_params, *self.host_grads], strict=True):
            new.copy_(old)
        self.host_params, self.host_grads = params, grads
        if not self.staged:
            self._device_buffers()
            self.bind()

    def zero_grads(self) -> None:
        for grads in self.flat_grads:
            grads.zero_()

    def grads_to_host(self) -> None:
        if self.staged:
            for host, flat in zip(self.host_grads, self.flat_grads, strict=True):
                host.copy_(flat)

    def params_from_host(self) -> None:
        if self.staged:
            for flat, host in zip(self.flat_params, self.host_params, strict=True):
                flat.copy_(host)

    def params_to_host(self) -> None:
        if self.staged:
            for host, flat in zip(self.host_params, self.flat_params, strict=True):
                host.copy_(flat)
