"""What a tensor-parallel step moves: every collective DTensor issues, counted, sized and timed.

A TorchDispatchMode (as torch's CommDebugMode does) steps aside for DTensor operations, so
DTensor turns them into its functional collectives, and then sees each of those: its kind, its
payload (an all-reduce's tensor, an all-gather's whole result) and the time from its start to
the end of the wait for it. It runs in backward too (autograd carries the mode along).
"""

from __future__ import annotations

import threading
import time

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

_c10d = torch.ops._c10d_functional
KINDS = {
    _c10d.all_reduce.default: "all_reduce",
    _c10d.all_gather_into_tensor.default: "all_gather",
    _c10d.reduce_scatter_tensor.default: "reduce_scatter",
    _c10d.all_to_all_single.default: "all_to_all",
    _c10d.broadcast.default: "broadcast",
}
WAIT = _c10d.wait_tensor.default


class CommMeter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seconds = 0.0
        self.counts: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()

    def add(self, kind: str, payload_bytes: int, seconds: float) -> None:
        with self._lock:
            entry = self.counts.setdefault(kind, {"count": 0, "payload_bytes": 0})
            entry["count"] += 1
            entry["payload_bytes"] += payload_bytes
            self.seconds += seconds

    @property
    def payload_bytes(self) -> int:
        with self._lock:
            return sum(entry["payload_bytes"] for entry in self.counts.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor or issubclass(t, DTensor) for t in types):
            return NotImplemented  # DTensor first: it turns the op into local ops and comms
        kwargs = kwargs or {}
        kind = KINDS.get(func)
        if kind is None and func is not WAIT:
            return func(*args, **kwargs)
        start = time.perf_counter()
        out = func(*args, **kwargs)
        seconds = time.perf_counter() - start
        if func is WAIT:
            with self._lock:
                self.seconds += seconds
        else:
            sized = out if kind == "all_gather" else args[0]
            self.add(kind, sized.numel() * sized.element_size(), seconds)
        return out
