"""An LSTM on a CPU is priced as the fused kernel torch runs there: the ops the real dispatch
issues (counted here on real CPU tensors), the trace's FLOPs and bytes, its
per-step products merged over the steps where the kernel merges them."""

from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from dlscale.hardware.device import Hardware
from dlscale.profiler.gemms import Gemm
from dlscale.profiler.inference import predict_inference
from dlscale.profiler.recorder import LOSS, MODEL, Recorder
from dlscale.profiler.recurrent import cpu_fused_ops, merged_products
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

    def __init__(self, size: int, hidden: int | None = None, **options):
        super().__init__()
        self.lstm = nn.LSTM(size, hidden or size, batch_first=True, **options)

    def forward(self, x):
        return self.lstm(x)[0]


def traced_lstm(size: int, steps: int, batch: int, hidden=None, input_grad: bool = True, **options):
    step = trace_step(
        lambda: Sequence(size, hidden, **options),
        torch.zeros(steps, size),
        batch,
        "fp32",
        lambda params: torch.optim.SGD(params, lr=0.1),
        "sgd",
        input_requires_grad=input_grad,
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
    # The products the kernel merges over the steps (input and hidden size equal here, so the
    # input's gradient shares the hidden state's shape, and the two weights' gradients theirs):
    # forward one projection of 24 rows and the 6 hidden ones; backward the input's gradient,
    # both weights' (24 deep) and the 5 hidden ones (none for the zero initial state).
    assert sorted(forward.gemms, key=lambda g: g.m) == [
        *[Gemm("addmm", batch, size, 4 * size)] * steps,
        Gemm("addmm", steps * batch, size, 4 * size),
    ]
    assert sorted(backward.gemms, key=lambda g: (g.m, g.k)) == [
        *[Gemm("mm", batch, 4 * size, size)] * (steps - 1),
        Gemm("mm", steps * batch, 4 * size, size),
        *[Gemm("mm", 4 * size, steps * batch, size)] * 2,
    ]
    for phase, traced in ((forward, layer.forward), (backward, layer.backward)):
        assert sum(g.macs for g in phase.gemms) == sum(g.macs for g in traced.gemms)


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


def test_where_a_cpu_timed_its_caches_the_kernel_moves_its_gates_there_after_its_products():
    """Inside the fused kernel a step's gates wait on its products and the next step on both;
    what they move stays in the caches: their bytes at the rate copies of one kernel's weights
    ran (interpolated in log bytes, clamped); the gates' FLOPs or bytes, the longer, added to
    the products, not hidden behind them."""
    size, steps, batch = 256, 16, 4
    _step, layer = traced_lstm(size, steps, batch)
    copies = [[2**20, 70e9], [2**22, 25e9], [2**28, 15e9]]  # bytes -> copy bytes/s
    hardware = cpu(measured={"cache_copy_bytes_per_s": copies})
    assert hardware.cache_copy_rate(2**10) == 70e9 and hardware.cache_copy_rate(2**30) == 15e9
    assert 25e9 < hardware.cache_copy_rate(2**21) < 70e9
    forward, backward = layer.phases("cpu")
    assert forward.kernel_step_bytes == backward.kernel_step_bytes == layer.weight_bytes
    rate = hardware.cache_copy_rate(layer.weight_bytes)  # 2 MiB and the biases
    for phase, name in ((forward, "forward"), (backward, "backward")):
        timed = phase_time(phase, hardware, "fp32", name)
        assert timed.memory_s == pytest.approx(sum(phase.bytes_by_op.values()) / rate)
        # The gates' FLOPs (on the vector units) and bytes are one pass, after the products.
        vector_s = phase.other_flops / 5e11
        products_s = timed.compute_s - vector_s
        assert timed.seconds == pytest.approx(
            products_s + max(vector_s, timed.memory_s) + timed.overhead_s
        )
    # A deep bidirectional LSTM runs a kernel per layer and direction: a step's working set is
    # one kernel's weights, not the module's.
    _step, deep = traced_lstm(size, steps, batch, num_layers=2, bidirectional=True)
    deep_forward, _ = deep.phases("cpu")
    kernel = 4 * size * (size + size) * 4 + 2 * 4 * size * 4  # layer 0: W_ih, W_hh, biases
    assert deep_forward.kernel_step_bytes == deep.weight_bytes // 4
    assert kernel <= deep_forward.kernel_step_bytes < 2 * kernel  # layer 1's W_ih: 2 × size
    # A CPU that timed no copies (an entry from before), or the trace's ops one by one: as
    # before, the slower of compute and memory at the stream bandwidth.
    for phase, device in ((forward, cpu()), (layer.forward, hardware)):
        plain = phase_time(phase, device, "fp32")
        assert plain.seconds == pytest.approx(
            max(plain.compute_s, plain.memory_s) + plain.overhead_s
        )


def test_the_products_run_at_the_rate_of_their_merged_shapes():
    """The input's projection runs as one product over the 6 steps, the hidden state's as 6."""
    size, steps, batch = 16, 6, 4
    _step, layer = traced_lstm(size, steps, batch)
    # A measured curve: n×n products at 1 GFLOP/s for n = 8 and 100 GFLOP/s for n = 512.
    hardware = cpu(measured={"matmul_flops_per_s": {"fp32": {8: 1e9, 512: 1e11}}})
    forward, _ = layer.phases("cpu")
    one_step = 2 * batch * size * 4 * size  # 8,192 FLOPs: n = 4,096^(1/3) = 16
    assert forward.matmul_flops == 2 * steps * one_step
    merged = steps * one_step  # the input's projection: 24 rows, 49,152 FLOPs
    assert hardware.matmul_rate("fp32", one_step) < hardware.matmul_rate("fp32", merged)
    products_s = merged / hardware.matmul_rate("fp32", merged) + steps * one_step / (
        hardware.matmul_rate("fp32", one_step)
    )
    vector_s = forward.other_flops / 5e11
    timed = phase_time(forward, hardware, "fp32")
    assert timed.compute_s == pytest.approx(products_s + vector_s)
    # Faster than the trace's per-step products; a GPU keeps those (not merged there).
    assert timed.compute_s < phase_time(layer.forward, hardware, "fp32").compute_s


def test_merged_products_by_hand():
    per_step = [Gemm("addmm", 8, 64, 512)] * 3 + [Gemm("addmm", 8, 128, 512)] * 3
    gradients = [Gemm("mm", 512, 8, 64)] * 3 + [Gemm("mm", 8, 512, 128)] * 2
    # rows grow with the steps; a merge takes at most its steps, and a shape found once stays
    merged = merged_products(per_step, ((8, 64, 512, 0, 3), (8, 32, 512, 0, 3)))
    assert merged == [Gemm("addmm", 8, 128, 512)] * 3 + [Gemm("addmm", 24, 64, 512)]
    assert merged_products(per_step, ((8, 64, 512, 0, 2),)) == [
        Gemm("addmm", 8, 64, 512),
        *[Gemm("addmm", 8, 128, 512)] * 3,
        Gemm("addmm", 16, 64, 512),
    ]
    # depth grows: a weight's gradient summed over the steps inside one product
    assert merged_products(gradients, ((512, 8, 64, 1, 3), (8, 512, 128, 1, 1))) == [
        *[Gemm("mm", 8, 512, 128)] * 2,
        Gemm("mm", 512, 24, 64),
    ]
    for before, merges in ((per_step, ((8, 64, 512, 0, 3),)), (gradients, ((512, 8, 64, 1, 3),))):
        after = merged_products(before, merges)
        assert sum(g.macs for g in after) == sum(g.macs for g in before)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("input_grad", [False, True])
def test_the_fused_kernel_merges_what_does_not_wait_on_the_step_before(batch_first, input_grad):
    """oneDNN: the input's projection (forward), the input's gradient where one is wanted and
    both weights' gradients (backward), each layer and direction; the hidden state's products
    stay per step."""
    lstm = nn.LSTM(10, 16, num_layers=2, bidirectional=True, batch_first=batch_first)
    x = torch.zeros(3, 7, 10) if batch_first else torch.zeros(7, 3, 10)  # 3 samples, 7 steps
    fused = cpu_fused_ops(lstm, (x.requires_grad_(input_grad),), {}, "fp32")
    # layer 0 reads 10 inputs, layer 1 both directions' 16 outputs: 32; 4 gates × 16 = 64
    assert fused.forward_merged == ((3, 10, 64, 0, 7),) * 2 + ((3, 32, 64, 0, 7),) * 2
    first = ((3, 64, 10, 0, 7),) if input_grad else ()
    assert fused.backward_merged == (
        (*first, (64, 3, 10, 1, 7), (64, 3, 16, 1, 7)) * 2
        + ((3, 64, 32, 0, 7), (64, 3, 32, 1, 7), (64, 3, 16, 1, 7)) * 2
    )


def traced_phases(size, hidden, steps, batch, input_grad, **options):
    """The traced LSTM layer's products as traced and as a CPU prices them, as shape counts."""
    _step, layer = traced_lstm(size, steps, batch, hidden, input_grad, **options)
    forward, backward = layer.phases("cpu")
    for phase, traced in ((forward, layer.forward), (backward, layer.backward)):
        assert sum(g.macs for g in phase.gemms) == sum(g.macs for g in traced.gemms)

    def shapes(gemms):
        return Counter((g.m, g.k, g.n) for g in gemms)

    return shapes(layer.forward.gemms), shapes(forward.gemms), shapes(backward.gemms)


@pytest.mark.parametrize("input_grad", [False, True])
def test_a_traced_deep_bidirectional_lstm_merges_by_layer_and_direction(input_grad):
    steps, batch = 5, 3  # 15 rows merged; 4 gates × 16 = 64
    _, forward, backward = traced_phases(
        10, 16, steps, batch, input_grad, num_layers=2, bidirectional=True
    )
    # each of the 4 layer-directions: one projection merged, its 5 hidden products per step
    assert forward == Counter({(15, 10, 64): 2, (15, 32, 64): 2, (3, 16, 64): 4 * steps})
    expected = Counter(
        {
            (64, 15, 10): 2,  # layer 0's input weight's gradient, 15 deep
            (64, 15, 32): 2,  # layer 1's
            (64, 15, 16): 4,  # every hidden weight's gradient
            (15, 64, 32): 2,  # layer 1's input gradient, 15 rows
            (3, 64, 16): 4 * (steps - 1),  # the hidden state's, per step (none for h0)
        }
    )
    if input_grad:
        expected[15, 64, 10] = 2  # layer 0's input gradient
    assert backward == expected


def test_without_an_input_gradient_the_hidden_states_products_stay_per_step():
    """Input and hidden of one size: the hidden state's gradient products share the shape an
    input gradient would have, and there is no input gradient to merge."""
    steps, batch = 5, 2
    _, _, backward = traced_phases(16, 16, steps, batch, input_grad=False)
    assert backward == Counter({(64, 10, 16): 2, (2, 64, 16): steps - 1})


def test_the_forward_projection_is_per_step_from_128_samples():
    """oneDNN merges the forward's input projection only under 128 samples (fp32)."""
    traced, forward, backward = traced_phases(8, 8, 3, 128, input_grad=True)
    assert forward == traced == Counter({(128, 8, 32): 6})
    assert backward[384, 32, 8] == 1  # the backward still merges: the input's gradient


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_inference_prices_the_forward_the_device_runs(kind):
    """Inference runs the same fused kernel on a CPU (its forward dispatches the ops counted
    for training: checked on real tensors under no_grad), so it is priced as training's forward
    is; a GPU keeps the trace's count."""
    lstm = nn.LSTM(8, 16, batch_first=True).eval()
    x = torch.randn(4, 6, 8)
    with torch.no_grad():
        recorder = Recorder()
        with recorder:
            lstm(x)
    assert (
        recorder.costs[(MODEL, "forward")].ops == cpu_fused_ops(lstm, (x,), {}, "fp32").forward_ops
    )
    step, _layer = traced_lstm(16, 6, 4)
    hardware = cpu(kind=kind)
    row = predict_inference(step, hardware, "fp32")
    priced = sum(
        phase_time(each.phases(kind)[0], hardware, "fp32").seconds
        for each in step.layers
        if each.name != LOSS
    )
    assert row.forward_s == pytest.approx(priced)
    as_traced = sum(
        phase_time(each.forward, hardware, "fp32").seconds
        for each in step.layers
        if each.name != LOSS
    )
    if kind == "cpu":  # 6 ops, not the trace's hundreds, and the projection merged
        assert row.forward_s < as_traced / 5
    else:
        assert row.forward_s == pytest.approx(as_traced)


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


def test_a_kernels_bound_is_the_longest_part_of_its_work():
    from dlscale.profiler.roofline import PhaseTime

    # Products 1 s, then the gates: FLOPs 0.5 s, bytes 1.2 s. Its work is 2.2 s and the bytes
    # its longest part, though compute (1.5 s with the gates' FLOPs) exceeds memory.
    assert PhaseTime(2.2, 1.5, 1.2, 0.0, kernel_products_s=1.0).bound == "memory"
    assert PhaseTime(3.7, 1.5, 1.2, 1.5, kernel_products_s=1.0).bound == "memory"  # work > 1.5
    assert PhaseTime(3.2, 2.5, 1.2, 0.0, kernel_products_s=2.0).bound == "compute"
    # The per-op cost beyond the whole work, not beyond its larger part.
    assert PhaseTime(4.5, 1.0, 1.0, 2.5, kernel_products_s=1.0).bound == "overhead"
    assert PhaseTime(3.5, 1.0, 1.0, 1.5, kernel_products_s=1.0).bound == "compute"
    assert PhaseTime(2.2, 1.5, 1.2, 0.0).bound == "compute"  # elsewhere: the larger of the two
