"""An LSTM on a CPU is priced as the fused kernel torch runs there: the ops the real dispatch
issues (counted here on real CPU tensors), the trace's FLOPs, bytes and per-step products."""

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from dlscale.hardware.device import Hardware
from dlscale.profiler.recorder import MODEL, Recorder
from dlscale.profiler.recurrent import cpu_fused_ops
from dlscale.profiler.roofline import phase_time, predict
from dlscale.profiler.trace import trace_step
from tests.toy_hardware import toy_hardware

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN"
)


def real_ops(lstm: nn.LSTM, x: torch.Tensor, hx=None) -> tuple[int, int, set[str]]:
    """(forward, backward) ops the recorder counts for one real CPU call of `lstm`, and the
    names of the ops that ran."""
    out, _ = lstm(x) if hx is None else lstm(x, hx)
    grad = torch.ones_like(out)
    recorder = Recorder()
    with recorder:
        out, _ = lstm(x) if hx is None else lstm(x, hx)
        out.backward(grad)
    forward, backward = recorder.costs[(MODEL, "forward")], recorder.costs[(MODEL, "backward")]
    names = set(forward.bytes_by_op) | set(backward.bytes_by_op)
    return forward.ops, backward.ops, names


CASES = {
    "batch-first": ({"batch_first": True}, (4, 6, 8), True),
    "two layers": ({"num_layers": 2, "batch_first": True}, (4, 6, 8), True),
    "time-major, no input gradient": ({"num_layers": 3}, (6, 4, 8), False),
    "bidirectional": ({"bidirectional": True, "batch_first": True}, (4, 6, 8), True),
    "bidirectional, two layers": ({"num_layers": 2, "bidirectional": True}, (6, 4, 8), True),
    "bidirectional, no input grad": ({"num_layers": 2, "bidirectional": True}, (6, 4, 8), False),
    "no bias, two layers": ({"num_layers": 2, "bias": False, "batch_first": True}, (4, 6, 8), True),
    "unbatched": ({"batch_first": True}, (6, 8), True),
}


@pytest.mark.parametrize("case", CASES)
def test_the_fused_op_count_is_what_the_cpu_dispatches(case):
    options, shape, needs_grad = CASES[case]
    lstm = nn.LSTM(8, 16, **options)
    x = torch.randn(shape, requires_grad=needs_grad)
    forward, backward, names = real_ops(lstm, x)
    assert "mkldnn_rnn_layer" in names  # the CPU ran the fused kernel
    fused = cpu_fused_ops(lstm, (x,), {}, "fp32")
    assert (fused.forward_ops, fused.backward_ops) == (forward, backward)


def test_a_given_state_creates_no_zeros():
    lstm = nn.LSTM(8, 16)
    x = torch.randn(6, 4, 8, requires_grad=True)
    hx = (torch.zeros(1, 4, 16), torch.zeros(1, 4, 16))
    forward, backward, _ = real_ops(lstm, x, hx)
    for args, kwargs in (((x, hx), {}), ((x,), {"hx": hx})):
        fused = cpu_fused_ops(lstm, args, kwargs, "fp32")
        assert (fused.forward_ops, fused.backward_ops) == (forward, backward)


def test_layers_torch_decomposes_on_a_cpu_keep_the_traced_count():
    x = torch.randn(4, 6, 8)
    assert cpu_fused_ops(nn.GRU(8, 16), (x,), {}, "fp32") is None
    assert cpu_fused_ops(nn.LSTM(8, 16, proj_size=4), (x,), {}, "fp32") is None
    assert cpu_fused_ops(nn.LSTM(8, 16), (x,), {}, "bf16") is None
    # and there the real CPU does dispatch per time step, as the trace counts
    forward_ops, _, names = real_ops(nn.GRU(8, 16), x.requires_grad_(True))
    assert "mkldnn_rnn_layer" not in names and forward_ops > 6 * 5  # 6 steps of several ops


class Sequence(nn.Module):
    """An LSTM alone, its outputs at every step as the logits."""

    def __init__(self, size: int):
        super().__init__()
        self.lstm = nn.LSTM(size, size, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]


def traced_lstm(size: int, steps: int, batch: int):
    step = trace_step(
        lambda: Sequence(size),
        torch.zeros(steps, size),
        batch,
        "fp32",
        lambda params: torch.optim.SGD(params, lr=0.1),
        "sgd",
        input_requires_grad=True,
    )
    (layer,) = [layer for layer in step.layers if layer.name == "lstm"]
    return step, layer


def test_a_traced_lstm_keeps_its_flops_and_per_step_products_in_fewer_ops():
    size, steps, batch = 16, 6, 4
    _step, layer = traced_lstm(size, steps, batch)
    real = nn.LSTM(size, size, batch_first=True)
    forward_ops, backward_ops, _ = real_ops(real, torch.randn(batch, steps, size).requires_grad_())
    fused = layer.cpu_fused
    assert (fused.forward_ops, fused.backward_ops) == (forward_ops, backward_ops) == (6, 3)
    forward, backward = layer.phases("cpu")
    assert (forward.ops, backward.ops) == (6, 3)
    assert layer.forward.ops > 10 * steps  # the decomposed path the trace took
    assert layer.phases("gpu") == (layer.forward, layer.backward)  # not counted on a GPU
    for phase, traced in ((forward, layer.forward), (backward, layer.backward)):
        assert phase.matmul_flops == traced.matmul_flops
        assert phase.other_flops == traced.other_flops
        assert phase.matmul_ops == traced.matmul_ops
    assert forward.bytes == layer.forward.bytes
    assert backward.bytes == layer.backward.bytes - fused.accumulation_bytes
    # Forward: per step one product for the input and one for the state, each (batch × size)
    # by (size × 4·size): 2 · 4 · 16 · 64 = 8,192 FLOPs each, 12 products in all.
    assert forward.matmul_ops == 2 * steps
    assert forward.matmul_flops == 2 * steps * 2 * batch * size * 4 * size == 98_304


def cpu(**overrides) -> Hardware:
    return toy_hardware(op_overhead_s=10e-6, **overrides)


def test_a_small_batch_lstm_with_a_large_state_is_bound_by_memory_bandwidth():
    """Each step's product reads the whole 4h × h weight for a few rows of batch."""
    size, steps, batch = 256, 16, 4
    step, layer = traced_lstm(size, steps, batch)
    hardware = cpu()
    # Per step the two products read W_ih and W_hh, 4·256·256 fp32 each: 2 MiB, 1 MiB each,
    # 41.9 µs at 50 GB/s (1e11 × 0.5), while they compute 2 · 2·4·256·1024 = 4.19 MFLOP,
    # 8.4 µs at 5e11 FLOP/s: 4 FLOPs a weight element, under the 10 FLOP/B balance.
    weight_s = steps * 2 * 4 * size * size * 4 / 50e9
    assert weight_s == pytest.approx(671e-6, rel=1e-3)
    products_s = steps * 2 * 2 * batch * size * 4 * size / 5e11
    assert products_s == pytest.approx(134e-6, rel=1e-2)
    (timed,) = [lt for lt in predict(step, hardware).layers if lt.name == "lstm"]
    assert timed.forward.memory_s >= weight_s
    assert timed.forward.overhead_s == pytest.approx(6 * 10e-6)  # six ops dispatched
    assert timed.forward.bound == "memory"
    assert timed.backward.bound == "memory"
    # Priced op by op as the trace took it, the ~12 ops a step (120 µs) hid that.
    assert phase_time(layer.forward, hardware, "fp32").bound == "overhead"


def test_the_products_run_at_the_rate_of_one_steps_product():
    size, steps, batch = 16, 6, 4
    _step, layer = traced_lstm(size, steps, batch)
    # A measured curve: n×n products at 1 GFLOP/s for n = 8 and 100 GFLOP/s for n = 512.
    hardware = cpu(measured={"matmul_flops_per_s": {"fp32": {8: 1e9, 512: 1e11}}})
    forward, _ = layer.phases("cpu")
    one_step = 2 * batch * size * 4 * size  # 8,192 FLOPs: n = 4,096^(1/3) = 16
    rate = hardware.matmul_rate("fp32", one_step)
    assert rate < hardware.matmul_rate("fp32", forward.matmul_flops)  # not the whole layer's
    vector_s = forward.other_flops / 5e11
    timed = phase_time(forward, hardware, "fp32")
    assert timed.compute_s == pytest.approx(forward.matmul_flops / rate + vector_s)


class AccumulationAdds(TorchDispatchMode):
    """Bytes of backward `add`s whose output has a parameter's shape: autograd summing the
    gradients of a weight used at every time step."""

    def __init__(self, shapes):
        super().__init__()
        self.shapes, self.bytes = shapes, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        backward = torch._C._current_autograd_node() is not None
        if backward and func.overloadpacket.__name__ == "add" and tuple(out.shape) in self.shapes:
            self.bytes += 3 * out.numel() * out.element_size()  # two read, one written
        return out


@pytest.mark.parametrize(
    "options", [{"batch_first": True}, {"num_layers": 2, "bidirectional": True}]
)
def test_the_backward_drops_the_traced_adds_that_sum_per_step_weight_gradients(options):
    size, steps, batch = 16, 6, 4
    with torch.device("meta"):
        lstm = nn.LSTM(size, 2 * size, **options)
        x = torch.empty(batch, steps, size, requires_grad=True)
    if not lstm.batch_first:
        x = x.transpose(0, 1)
    counter = AccumulationAdds({tuple(p.shape) for p in lstm.parameters()})
    with counter:
        out, _ = lstm(x)
        out.backward(torch.empty_like(out))
    # (T - 1) adds of every weight: 5 × 3 × its bytes
    weights = sum(p.numel() * 4 for p in lstm.parameters())
    assert counter.bytes == (steps - 1) * 3 * weights
    assert cpu_fused_ops(lstm, (x,), {}, "fp32").accumulation_bytes == counter.bytes
    # and the real fused backward issues no add of a weight's shape
    real = nn.LSTM(size, 2 * size, **options)
    x = torch.randn(x.shape, requires_grad=True)
    counter = AccumulationAdds({tuple(p.shape) for p in real.parameters()})
    with counter:
        out, _ = real(x)
        out.backward(torch.ones_like(out))
    assert counter.bytes == 0
