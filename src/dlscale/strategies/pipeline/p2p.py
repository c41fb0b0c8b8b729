"""Tensors between neighbouring pipeline stages over torch.distributed, for the 2bw schedule
(GPipe and 1F1B use torch.distributed.pipelining's own), and the shapes they will have."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dlscale.train.device import autocast

Meta = list[tuple[tuple, torch.dtype]]


class DistTransport:
    """Point-to-point to the previous and next stage. A send does not wait: under 2bw a stage's
    gradient for the stage before it is received in the next training step, after collectives
    (tied gradients, checkpoints) that must not wait behind it, so sends go on their own group
    and are only waited for when they are done or at the end."""

    def __init__(self, group, prev_rank: int | None, next_rank: int | None, device):
        self.group, self.prev, self.next, self.device = group, prev_rank, next_rank, device
        self.pending: list[tuple] = []  # (work, tensor): a tensor lives until its send is done
        self.sent_bytes = 0

    def send(self, to_next: bool, tensors: list[torch.Tensor]) -> None:
        peer = self.next if to_next else self.prev
        assert peer is not None
        self.pending = [(w, t) for w, t in self.pending if not w.is_completed()]
        for tensor in tensors:
            tensor = tensor.contiguous()
            self.pending.append((dist.isend(tensor, peer, group=self.group), tensor))
            self.sent_bytes += tensor.numel() * tensor.element_size()

    def recv(self, from_next: bool, like: Meta) -> list[torch.Tensor]:
        peer = self.next if from_next else self.prev
        assert peer is not None
        out = [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in like]
        for tensor in out:
            dist.irecv(tensor, peer, group=self.group).wait()
        return out

    def flush(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending = []


def exchange_shapes(
    module: nn.Module, example: torch.Tensor, transport: DistTransport, precision: str
) -> tuple[Meta, Meta]:
    """(input, output) shapes and dtypes of this stage's tensors: the first stage runs the
    example microbatch, each later one what the stage before it reported, once before training."""
    device = transport.device
    if transport.prev is None:
        inputs = [example.to(device)]
    else:
        received = [None]
        dist.recv_object_list(received, transport.prev, group=transport.group)
        inputs = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype in received[0]]
    with torch.no_grad(), autocast(device, precision):
        out = module(*inputs)
    outputs = list(out) if isinstance(out, tuple) else [out]
    in_meta = [(tuple(t.shape), t.dtype) for t in inputs]
    out_meta = [(tuple(t.shape), t.dtype) for t in outputs]
    if transport.next is not None:
        dist.send_object_list([out_meta], transport.next, group=transport.group)
    return in_meta, out_meta
