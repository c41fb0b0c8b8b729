"""The profiler against references: hand counts, FlopCounterMode, and real autograd on CPU."""

from collections import Counter
from contextlib import nullcontext

import pytest
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from dlscale.errors import UserError
from dlscale.hardware.device import Hardware
from dlscale.models import ZOO, build_model
from dlscale.profiler import attention, profile, trace_workload
from dlscale.profiler.advice import verdict
from dlscale.profiler.attention import FusedAttention
from dlscale.profiler.memory import training_memory
from dlscale.profiler.recorder import LOSS, PhaseCost
from dlscale.profiler.roofline import phase_time, predict
from dlscale.profiler.target import resolve
from dlscale.profiler.trace import trace_step


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


def adam(params):
    return torch.optim.Adam(params)


def trace(build, sample, batch, optimizer=sgd, precision="fp32"):
    return trace_step(build, sample, batch, precision, optimizer, "sgd")


def rows(step_trace):
    return {layer.name: layer for layer in step_trace.layers}


def test_linear_counts_by_hand():
    """Linear(4→3) then Linear(3→2), batch 2: every number below is worked out on paper."""
    step = trace(lambda: nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)), torch.zeros(4), 2)
    first, second = rows(step)["0"], rows(step)["1"]
    assert first.forward.matmul_flops == 2 * 2 * 4 * 3  # 2·B·in·out (FLOPs = 2 × MACs)
    assert first.backward.matmul_flops == 2 * 2 * 4 * 3  # weight gradient only: x needs none
    assert second.backward.matmul_flops == 2 * (2 * 2 * 3 * 2)  # input and weight gradients
    assert (first.params, first.weight_bytes) == (15, 60)
    assert (first.input_bytes, first.output_bytes, first.working_set_bytes) == (32, 24, 116)
    assert first.output_shape == [2, 3]
    assert step.params == 15 + 8 and step.batch_bytes == 2 * 4 * 4 + 2 * 8


def test_conv_counts_by_hand():
    step = trace(lambda: nn.Conv2d(1, 2, 3), torch.zeros(1, 5, 5), 1)
    (conv, _loss) = step.layers  # a lone module is the root: its row is "(model)"
    macs = (2 * 3 * 3) * (1 * 3 * 3)  # outputs × (in_channels × kernel)
    assert conv.forward.matmul_flops == 2 * macs and conv.params == 2 * 9 + 2
    assert conv.backward.matmul_flops == 2 * macs  # weight gradient only
    # Each convolution's shape, which sets its speed: 2·1·3·3 weights, 3×3 output pixels.
    assert conv.forward.convs == [(2 * macs, 18, 9)] and conv.backward.convs == [(2 * macs, 18, 9)]


def test_saved_activations_by_hand():
    """x (5×4) for the first weight gradient and the ReLU output (5×8), once; weights excluded."""
    build = lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))  # noqa: E731
    step = trace(build, torch.zeros(4), 5)
    logits_and_loss = rows(step)[LOSS].saved_bytes  # log-softmax output and the targets
    assert step.saved_activation_bytes - logits_and_loss == 5 * 4 * 4 + 5 * 8 * 4


def test_elementwise_ops_are_counted_apart_and_optimizer_state_measured():
    step = trace(lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU()), torch.zeros(4), 3, adam)
    relu = rows(step)["1"]
    assert relu.forward.matmul_flops == 0 and relu.forward.other_flops == 3 * 8
    assert step.optimizer_state_bytes == 2 * (4 * 8 + 8) * 4  # Adam: two moments per weight
    assert step.optimizer.other_flops > 0 and step.uncounted_ops == {}


def zoo_sample(name):
    entry = ZOO[name]
    dtype = torch.long if entry.input_kind == "tokens" else torch.float32
    return torch.zeros(entry.example_input_shape, dtype=dtype)


SMALL_KWARGS = {"vgg11": {"num_classes": 10}, "vgg16": {"num_classes": 10}}


def _as_registered(formula):
    """A registry formula as FlopCounterMode takes it in `custom_mapping`: already shape-aware."""

    def count(*args, **kwargs):
        return formula(*args, **kwargs)

    count._get_raw = True
    return count


# FlopCounterMode's registry lacks the CPU's fused attention kernel: it is given the formula the
# tracer applies (its own for the CUDA flash kernel, checked by hand below).
CPU_ATTENTION = {
    getattr(torch.ops.aten, name): _as_registered(attention.cpu_formula(name))
    for name in (attention.CPU_FORWARD, attention.CPU_BACKWARD)
}


def flop_counter_mode(model, x, backward: bool) -> FlopCounterMode:
    """FlopCounterMode over the ops a traced step runs (attention as the CPU runs it)."""
    counter = FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION)
    with counter, FusedAttention():
        logits = model(x)
        targets = torch.empty(logits.shape[:-1], dtype=torch.long, device="meta")
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
        )
        if backward:
            loss.backward()
    return counter


@pytest.mark.parametrize("name", list(ZOO))
def test_matmul_flops_equal_flop_counter_mode_across_the_zoo(name):
    """Totals equal FlopCounterMode's; so does each module's forward share.

    FlopCounterMode's per-module backward figures are not compared: its ModuleTracker keeps
    several modules active at once in backward (residual blocks, attention) and credits each of
    them. Our backward attribution follows autograd nodes, so it is checked against the rule
    instead: a conv or linear layer's backward is twice its forward (input and weight gradients),
    or once when its input needs no gradient.
    """
    batch = 2
    build = lambda: build_model(name, SMALL_KWARGS.get(name, {}))  # noqa: E731
    step = trace(build, zoo_sample(name), batch)
    with torch.device("meta"):
        model = build()
        x = zoo_sample(name).to("meta").expand(batch, *zoo_sample(name).shape).contiguous()
    total = flop_counter_mode(model, x, backward=True).get_total_flops()
    ours = sum(r.forward.matmul_flops + r.backward.matmul_flops for r in step.layers)
    assert ours == total > 0
    forward = flop_counter_mode(model, x, backward=False).get_flop_counts()
    root = type(model).__name__
    for layer in step.layers:
        key = f"{root}.{layer.name}"
        if layer.leaf and key in forward:
            assert layer.forward.matmul_flops == sum(forward[key].values()), layer.name
        if layer.type in ("Linear", "Conv2d") and layer.forward.matmul_flops:
            ratio = layer.backward.matmul_flops / layer.forward.matmul_flops
            # torch's formula for a grouped convolution's weight gradient does not divide by the
            # groups (it counts groups × the work); we count as FlopCounterMode, the reference.
            groups = getattr(model.get_submodule(layer.name), "groups", 1)
            assert ratio in (groups, 1.0 + groups), (layer.name, ratio)
    first_conv_or_linear = next(r for r in step.layers if r.type in ("Linear", "Conv2d"))
    if ZOO[name].input_kind != "tokens":  # the first layer's input is data: weight grad only
        assert (
            first_conv_or_linear.backward.matmul_flops == first_conv_or_linear.forward.matmul_flops
        )


def real_saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """What autograd saves on a real CPU run: unique storages, parameters excluded."""
    params = {StorageWeakRef(p.untyped_storage()).cdata for p in model.parameters()}
    seen, keep, total = set(), [], 0

    def pack(tensor):
        nonlocal total
        storage = StorageWeakRef(tensor.untyped_storage()).cdata
        if storage not in seen and storage not in params:
            seen.add(storage)
            keep.append(tensor)
            total += tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(x)
        targets = torch.zeros(logits.shape[:-1], dtype=torch.long)
        nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return total


GPT_SMALL = {"n_layer": 1, "d_model": 32, "n_head": 2, "vocab_size": 50}


@pytest.mark.parametrize(
    ("name", "kwargs", "shape", "tokens", "backend"),
    [
        ("lenet", {}, (1, 28, 28), False, None),
        ("mlp", {"input_size": 20, "hidden": [32, 16], "dropout": 0.1}, (20,), False, None),
        ("resnet18", {"num_classes": 10, "small_input": True}, (3, 16, 16), False, None),
        # The CPU's own choice (its fused flash kernel, which saves the output and log-sum-exp),
        # and the math path a user can force (which saves the T × T attention weights too).
        ("gpt", GPT_SMALL, (16,), True, None),
        ("gpt", GPT_SMALL, (16,), True, SDPBackend.MATH),
    ],
)
def test_saved_activation_bytes_match_real_autograd_on_cpu(name, kwargs, shape, tokens, backend):
    sample = torch.zeros(shape, dtype=torch.long if tokens else torch.float32)
    with sdpa_kernel([backend]) if backend is not None else nullcontext():
        step = trace(lambda: build_model(name, kwargs), sample, 3)
        torch.manual_seed(0)
        model = build_model(name, kwargs)
        x = sample.expand(3, *shape).contiguous()
        assert step.saved_activation_bytes == real_saved_bytes(model, x)


class Encoder(nn.Module):
    """A user's transformer layer: nn.MultiheadAttention calls attention from inside torch."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        return self.head(self.layer(x))


def test_a_user_transformer_layer_is_traced_as_the_cpu_runs_it():
    step = trace(Encoder, torch.zeros(16, 32), 3)
    products = 2 * (3 * 4 * 16 * 16 * 8)  # 2 × (batch · heads) · queries · keys · head size
    assert rows(step)["layer.self_attn"].forward.attention == [(2 * products, 16, False)]
    torch.manual_seed(0)
    assert step.saved_activation_bytes == real_saved_bytes(Encoder(), torch.zeros(3, 16, 32))


class Attention(nn.Module):
    """Self-attention over 4 heads of 8, in one of the forms torch fuses or not on a CPU."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form
        self.project = nn.Linear(32, 32)
        self.bias = nn.Parameter(torch.zeros(1, 4, 16, 16))  # a learnable additive mask

    def forward(self, x):  # (batch, 16, 32)
        batch, length = x.shape[:2]
        q = k = v = self.project(x).view(batch, length, 4, 8).transpose(1, 2)
        options = {}
        if self.form == "learnable mask":
            options["attn_mask"] = self.bias
        elif self.form == "boolean mask":
            options["attn_mask"] = torch.ones(length, length, dtype=torch.bool).tril()
        elif self.form == "grouped query":
            k = v = q[:, :2]
            options["enable_gqa"] = True
        elif self.form == "transposed keys":
            k = k.transpose(-1, -2).contiguous().transpose(-1, -2)
        elif self.form == "one batch of keys":
            k = v = k[:1]
        elif self.form == "dropout":
            options["dropout_p"] = 0.5
        out = nn.functional.scaled_dot_product_attention(q, k, v, **options)
        return out.transpose(1, 2).reshape(batch, length * 32)


class _OpNames(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "form",
    [
        "plain",
        "learnable mask",
        "boolean mask",
        "grouped query",
        "transposed keys",
        "one batch of keys",
        "dropout",
    ],
)
def test_attention_takes_the_kernel_the_cpu_takes(form):
    """The trace fuses exactly where a real CPU step does, and saves what it saves."""
    step = trace(lambda: Attention(form), torch.zeros(16, 32), 2)
    traced_fused = bool(rows(step)["(model)"].forward.attention)
    torch.manual_seed(0)
    model, x, ops = Attention(form), torch.randn(2, 16, 32), _OpNames()
    with ops:
        model(x).sum().backward()
    assert traced_fused == (attention.CPU_FORWARD in ops.names)
    assert traced_fused == (form in ("plain", "boolean mask", "grouped query"))
    assert step.uncounted_ops == {}
    torch.manual_seed(0)
    assert step.saved_activation_bytes == real_saved_bytes(Attention(form), x)


def test_attention_name_is_restored_when_multi_head_attention_fails():
    broken = lambda: nn.MultiheadAttention(32, 4, batch_first=True, kdim=16, vdim=16)  # noqa: E731
    before = nn.functional.scaled_dot_product_attention
    with pytest.raises(AssertionError, match="key weights"), FusedAttention():
        x = torch.zeros(2, 16, 32, device="meta")
        with torch.device("meta"):
            broken()(x, x, x, need_weights=False)  # keys of 32 where 16 were declared
    assert nn.functional.scaled_dot_product_attention is before is attention.SDPA


def test_attention_is_traced_as_the_cpu_runs_it_and_belongs_to_its_module():
    """One fused kernel a phase, not the math path; its backward sits in the attention module."""
    build = lambda: build_model("gpt", GPT_SMALL)  # noqa: E731
    fused = rows(trace(build, torch.zeros(16, dtype=torch.long), 2))["blocks.0.attn"]
    # Forward: 2 products of (2·2 heads) × 16 queries × 16 keys × 16 per head, as 2 × MACs.
    products = 2 * (2 * 2 * 16 * 16 * 16)
    assert fused.forward.attention == [(2 * products, 16, True)]  # GPT's attention is causal
    assert fused.backward.attention == [(5 * products, 16, True)]  # recomputes the scores
    assert "_safe_softmax" not in fused.forward.bytes_by_op
    with sdpa_kernel([SDPBackend.MATH]):
        math = rows(trace(build, torch.zeros(16, dtype=torch.long), 2))["blocks.0.attn"]
    assert math.forward.attention == [] and "_safe_softmax" in math.forward.bytes_by_op
    assert math.forward.matmul_flops == 2 * products
    assert math.backward.matmul_flops == 4 * products  # attributed to attention, not (model)


def device(**overrides) -> Hardware:
    fields = {
        "name": "toy",
        "display_name": "toy",
        "kind": "gpu",
        "vendor": "x",
        "peak_flops": {"fp32": 100e12, "bf16": 400e12},
        "memory_bytes": 10 * 2**30,
        "memory_bandwidth_bytes_per_s": 1e12,
        "host_link_bytes_per_s": 10e9,
        "compute_efficiency": 0.5,
        "memory_efficiency": 0.5,
        "op_overhead_s": 1e-6,
    }
    return Hardware(**{**fields, **overrides})


def test_phase_time_is_the_roofline_by_hand():
    cost = PhaseCost(matmul_flops=int(1e12), other_flops=0, bytes=int(1e9), ops=10)
    fp32 = phase_time(cost, device(), "fp32")
    assert fp32.compute_s == pytest.approx(1e12 / 50e12) and fp32.memory_s == pytest.approx(2e-3)
    assert fp32.seconds == pytest.approx(0.02 + 10e-6) and fp32.bound == "compute"
    bf16 = phase_time(cost, device(), "bf16")  # matrix products on the bf16 units
    assert bf16.compute_s == pytest.approx(1e12 / 200e12)
    memory_bound = phase_time(PhaseCost(0, int(1e6), int(1e10), 1), device(), "fp32")
    assert memory_bound.bound == "memory" and memory_bound.seconds == pytest.approx(0.02 + 1e-6)
    tiny = phase_time(PhaseCost(10, 0, 10, 5), device(), "fp32")
    assert tiny.bound == "overhead"


def test_measured_conv_grid_sets_each_convolution_rate():
    """Rates interpolate in log weight and log pixels; each conv of a phase pays its own."""
    grid = [[100, 10, 1e9], [100, 1000, 3e9], [10000, 10, 5e9], [10000, 1000, 9e9]]
    hw = device(kind="cpu", measured={"conv_flops_per_s": {"forward": grid, "backward": grid}})
    assert hw.conv_rate("fp32", 1e6, 100, 100) == pytest.approx(2e9)  # half way in log pixels
    assert hw.conv_rate("fp32", 1e6, 1000, 1000) == pytest.approx(6e9)  # half way in log weight
    assert hw.conv_rate("fp32", 1e6, 1, 1) == pytest.approx(1e9)  # clamped to the grid
    # Beyond the largest output, on a CPU: the largest output's rate (its cores are busy).
    assert hw.conv_rate("fp32", 1e6, 100, 1e5) == pytest.approx(3e9)
    assert hw.conv_rate("fp32", 1e6, 100, 1e9) == pytest.approx(3e9)
    # On a GPU: the last two sizes' trend, 1e9 a decade of pixels at weight 100 (1e9 at 10, 3e9
    # at 1000), up to the grid's best (9e9); never falling.
    gpu = device(kind="gpu", measured={"conv_flops_per_s": {"forward": grid, "backward": grid}})
    assert gpu.conv_rate("fp32", 1e6, 100, 100) == pytest.approx(2e9)  # inside: as a CPU's
    assert gpu.conv_rate("fp32", 1e6, 100, 1e5) == pytest.approx(5e9)
    assert gpu.conv_rate("fp32", 1e6, 100, 1e9) == pytest.approx(9e9)
    assert gpu.conv_rate("fp32", 1e6, 10000, 1e5) == pytest.approx(9e9)  # already the best
    falling = [[100, 10, 4e9], [100, 1000, 3e9]]
    down = device(kind="gpu", measured={"conv_flops_per_s": {"forward": falling}})
    assert down.conv_rate("fp32", 1e6, 100, 1e5) == pytest.approx(3e9)
    assert hw.conv_rate("bf16", 1e6, 1000, 1000) == device().matmul_rate("bf16", 1e6)
    cost = PhaseCost(
        matmul_flops=int(3e9), matmul_ops=2, convs=[(int(1e9), 100, 10), (int(2e9), 10000, 1000)]
    )
    assert phase_time(cost, hw, "fp32").compute_s == pytest.approx(1e9 / 1e9 + 2e9 / 9e9)


def test_measured_attention_curve_sets_fused_attention_apart_from_other_products():
    """Fused attention at its rate by keys per query, causal or full; linear layers at the
    matmul's."""
    causal = {"forward": [[64, 1e9], [1024, 4e9]], "backward": [[64, 2e9], [1024, 8e9]]}
    full = {"forward": [[64, 1e9], [1024, 2e9]], "backward": [[64, 1e9], [1024, 2e9]]}
    hw = device(kind="cpu", measured={"attention_flops_per_s": {"causal": causal, "full": full}})
    assert hw.attention_rate("fp32", 1e6, 256, True) == pytest.approx(2.5e9)  # half way in log
    assert hw.attention_rate("fp32", 1e6, 256, True, "backward") == pytest.approx(5e9)
    assert hw.attention_rate("fp32", 1e6, 256, False) == pytest.approx(1.5e9)
    assert hw.attention_rate("fp32", 1e6, 16, True) == pytest.approx(1e9)  # clamped to the curve
    assert hw.attention_rate("bf16", 1e6, 256, True) == device().matmul_rate("bf16", 1e6)
    cost = PhaseCost(matmul_flops=int(3e9), matmul_ops=3, attention=[(int(1e9), 64, True)])
    linear_rate = hw.matmul_rate("fp32", 1e9)  # the other 2e9 FLOPs: two products of 1e9
    assert phase_time(cost, hw, "fp32").compute_s == pytest.approx(1.0 + 2e9 / linear_rate)


def test_optimizer_update_runs_at_the_rate_measured_for_its_working_set():
    # Measured: 4× the stream bandwidth at 1 MB of working set, 1× at 100 MB.
    measured = {"op_efficiency": {"add_": 1.0}, "optimizer_efficiency": [[1e6, 4.0], [1e8, 1.0]]}
    hw = device(kind="cpu", measured=measured)
    cost = PhaseCost(bytes=int(1e9), ops=1, bytes_by_op=Counter(add_=int(1e9)))
    assert phase_time(cost, hw, "fp32").memory_s == pytest.approx(1e-3)  # a layer's add_
    for working_set, share in ((1e6, 4.0), (1e7, 2.5), (1e3, 4.0), (1e9, 1.0)):
        memory_s = phase_time(cost, hw, "fp32", working_set_bytes=working_set).memory_s
        assert memory_s == pytest.approx(1e-3 / share)  # half way at 1e7; clamped outside
    no_curve = device(kind="cpu", measured={"op_efficiency": {"add_": 0.5}})
    assert phase_time(cost, no_curve, "fp32", working_set_bytes=1e6).memory_s == pytest.approx(2e-3)


def test_the_updates_streaming_points_price_as_one_rate():
    """Working sets ≥ 4× the last-level cache stream from memory: the curve's points there are
    one rate measured again, priced at their median (32 MiB cache: 256 MiB and 1 GiB stream,
    64 MiB does not); without a known cache, or with one streaming point, as measured."""
    mib = 2**20
    curve = [[mib, 0.8], [64 * mib, 1.7], [256 * mib, 1.1], [1024 * mib, 1.8]]
    cost = PhaseCost(bytes=int(1e9), ops=1, bytes_by_op=Counter(add_=int(1e9)))

    def share(measured, working_set):
        hw = device(kind="cpu", measured=measured)
        return 1e-3 / phase_time(cost, hw, "fp32", working_set_bytes=working_set).memory_s

    cached = {"optimizer_efficiency": curve, "last_level_cache_bytes": 32 * mib}
    assert share(cached, 256 * mib) == pytest.approx(1.45)
    assert share(cached, 1024 * mib) == pytest.approx(1.45)
    assert share(cached, 2048 * mib) == pytest.approx(1.45)  # clamped beyond, as before
    assert share(cached, 64 * mib) == pytest.approx(1.7)
    unknown = {"optimizer_efficiency": curve}
    assert share(unknown, 256 * mib) == pytest.approx(1.1)
    one = {"optimizer_efficiency": curve[:3], "last_level_cache_bytes": 32 * mib}
    assert share(one, 256 * mib) == pytest.approx(1.1)


def test_optimizer_is_priced_per_parameter_tensor_on_a_cpu_and_whole_on_a_gpu():
    step = trace(lambda: nn.Linear(64, 64), torch.zeros(64), 8, optimizer=adam)
    weight, bias = step.optimizer_tensors
    # Each tensor's parameter, gradient and Adam's two moments, 4 bytes an element.
    assert (weight.working_set_bytes, bias.working_set_bytes) == (16 * 64 * 64, 16 * 64)
    # The steady-state update: the first step's state allocation is not traced.
    # A CPU trainer's fused kernel: one op a tensor, the step counters' add with the first.
    assert (weight.cost.ops, bias.cost.ops) == (2, 1) and step.optimizer.ops == 3
    assert weight.cost.bytes + bias.cost.bytes == step.optimizer.bytes
    assert sum(step.optimizer.bytes_by_op.values()) == step.optimizer.bytes
    # param, gradient and two moments read, param and moments written; the step counter read
    assert weight.cost.bytes_by_op["_fused_adam_"] == 28 * 64 * 64 + 4

    curve = [[16 * 64, 4.0], [16 * 64 * 64, 1.0]]  # the bias stays cached, the weight streams
    cpu = device(kind="cpu", measured={"optimizer_efficiency": curve})
    expected = phase_time(weight.cost, cpu, "fp32", working_set_bytes=16 * 64 * 64).seconds
    expected += phase_time(bias.cost, cpu, "fp32", working_set_bytes=16 * 64).seconds
    assert predict(step, cpu).optimizer_s == pytest.approx(expected)
    whole = phase_time(step.optimizer, cpu, "fp32", working_set_bytes=16 * (64 * 64 + 64))
    assert predict(step, cpu).optimizer_s < whole.seconds
    # foreach kernels on a GPU take all tensors at once: one working set, the model's.
    gpu = device(measured={"optimizer_efficiency": curve})
    footprint = 16 * (64 * 64 + 64)
    assert step.optimizer_working_set_bytes == footprint
    foreach = phase_time(step.optimizer_foreach, gpu, "fp32", working_set_bytes=footprint)
    assert predict(step, gpu).optimizer_s == pytest.approx(foreach.seconds)


def test_step_prediction_adds_up_and_copies_the_batch_over_the_host_link():
    step = trace(lambda: nn.Sequential(nn.Linear(64, 64), nn.ReLU()), torch.zeros(64), 128)
    hw = device()
    result = predict(step, hw, dataset_size=128 * 10)
    parts = result.forward_s + result.backward_s + result.optimizer_s + result.h2d_s
    assert result.step_s == pytest.approx(parts + result.loop_s)
    assert result.h2d_s == pytest.approx(step.batch_bytes / 10e9)
    assert result.steps_per_epoch == 10 and result.epoch_s == pytest.approx(10 * result.step_s)
    assert predict(step, device(kind="cpu")).h2d_s == 0.0


def test_the_batch_copy_is_priced_from_the_memory_the_loader_leaves_it_in():
    """Batch 128 × 64 fp32 inputs and 128 int64 labels: 33,792 bytes a step, by hand."""
    step = trace(lambda: nn.Linear(64, 64), torch.zeros(64), 128)
    assert step.batch_bytes == 128 * 64 * 4 + 128 * 8
    local = device(measured={"host_link": {"pageable_h2d_bytes_per_s": 2e9}})
    pinned, pageable = predict(step, local), predict(step, local, pinned=False)
    assert pinned.h2d_s == pytest.approx(33_792 / 10e9) and pinned.h2d_memory == "pinned"
    assert pageable.h2d_s == pytest.approx(33_792 / 2e9) and pageable.h2d_memory == "pageable"
    catalogue = predict(step, device(), pinned=False)  # no pageable rate: said, not guessed
    assert catalogue.h2d_s == pytest.approx(33_792 / 10e9)
    assert catalogue.h2d_memory.startswith("pageable, priced as pinned")


def test_verdicts_fit_split_and_largest_batch():
    step = trace(lambda: nn.Linear(1000, 1000), torch.zeros(1000), 100, adam)
    memory = training_memory(step)
    assert memory.static_bytes == (1000 * 1000 + 1000) * 4 * 4  # weights, grads, two moments
    roomy = device()
    ok = verdict(memory, predict(step, roomy), roomy, {"": "Linear"})
    assert ok.fits and ok.advice[0].startswith("fits")
    expected = int((roomy.memory_bytes * 0.9 - memory.static_bytes) // memory.per_sample_bytes)
    assert ok.max_batch == expected
    small = device(memory_bytes=8 * 2**20)  # 8 MiB: the 16 MB of static state cannot fit
    no = verdict(memory, predict(step, small), small, {"": "Linear"})
    assert not no.fits and no.max_batch == 0 and "split it across ≥ 3 devices" in no.advice[0]
    # One layer cannot be cut into 3 stages: its weights are split instead.
    assert "strategy: {name: tensor, degree: 3}" in no.advice[0]


def test_a_data_set_that_does_not_fit_is_told_where_to_stream_it_from_and_how_fast():
    step = trace(lambda: nn.Linear(1000, 10), torch.zeros(1000), 100)
    memory = training_memory(step)
    gpu = device(memory_bytes=64 * 2**20)
    room = int(gpu.memory_bytes * 0.9) - memory.total_bytes
    prediction = predict(step, gpu)
    assert not any("stream" in n for n in verdict(memory, prediction, gpu, {}, room).advice)
    (note,) = [n for n in verdict(memory, prediction, gpu, {}, room + 1).advice if "stream" in n]
    assert note.startswith("the data set (") and "does not fit beside the model" in note
    # The three formats read from disk, each with the spec line that reads it.
    assert "WebDataset shards (`dlscale data convert`; data: {name: webdataset, urls: " in note
    assert "data: {name: hf, path: DIR}" in note and "data: {name: images, path: DIR}" in note
    # What the device consumes: a batch per predicted step, in samples and in bytes.
    samples_per_s = 100 / prediction.step_s
    megabytes_per_s = memory.batch_bytes / prediction.step_s / 1e6
    assert f"{samples_per_s:,.0f} samples/s ({megabytes_per_s:,.1f} MB/s" in note
    assert "host memory" in note  # a GPU's data can still sit in the host's memory
    cpu = device(kind="cpu", memory_bytes=64 * 2**20)
    cpu_notes = verdict(memory, predict(step, cpu), cpu, {}, room + 1).advice
    assert not any("host memory" in n for n in cpu_notes)  # there, it is the device's memory


def test_bad_inputs_are_one_line_errors():
    with pytest.raises(UserError, match=r"cannot take samples of shape \(1, 8, 8\)"):
        trace_workload(resolve("lenet", input_shape=[1, 8, 8]))
    with pytest.raises(UserError, match="unknown model 'lenet7'"):
        resolve("lenet7")
    with pytest.raises(UserError, match="--batch must be a positive"):
        resolve("lenet", batch_size=0)
    with pytest.raises(UserError, match="--input-shape must be positive"):
        resolve("lenet", input_shape=[1, 0, 28])


def test_a_spec_file_supplies_batch_precision_optimizer_and_data(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: t\nmodel: {name: lenet}\ndata: {name: digits, image_size: 28}\n"
        "batch_size: 48\nprecision: bf16\noptimizer: {name: sgd}\n"
    )
    result = profile(resolve(str(spec)), [device()])
    assert result.trace.batch_size == 48 and result.trace.precision == "bf16"
    assert result.trace.optimizer_name == "sgd" and result.memory.optimizer_state_bytes == 0
    assert result.workload.dataset_size == 1437
    assert result.reports[0].prediction.steps_per_epoch == 1437 // 48
    # bf16 halves the float activations; max-pool's int64 indices keep their size
    fp32 = profile(resolve(str(spec), precision="fp32"), [])
    assert result.memory.activations_bytes < 0.7 * fp32.memory.activations_bytes
    # The batch's copy as the spec's loader leaves it: pinned unless it says not to pin.
    assert result.workload.pinned and result.reports[0].prediction.h2d_memory == "pinned"
    spec.write_text(spec.read_text() + "loader: {pin_memory: false}\n")
    local = device(measured={"host_link": {"pageable_h2d_bytes_per_s": 2e9}})
    pageable = profile(resolve(str(spec)), [local]).reports[0].prediction
    assert pageable.h2d_memory == "pageable"
    assert pageable.h2d_s == pytest.approx(result.trace.batch_bytes / 2e9)
