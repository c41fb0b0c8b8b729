"""The optimizer update the tracer prices is the one a CPU trainer runs: torch's fused kernel,
one call over every tensor, moving each tensor's bytes once (train/step.py build_optimizer),
and torch's per-tensor loop of kernels for an optimizer without a fused kernel."""

from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from dlscale.jobspec import OptimizerSpec
from dlscale.profiler.trace import trace_step
from dlscale.train.step import build_optimizer

# Dispatched by a step but moving no data: the profiler's markers around the step, and a step
# count read back to the host (`.item()`), which the tracer counts as free.
MARKERS = {"_record_function_enter_new", "_record_function_exit", "_local_scalar_dense"}


class Dispatches(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _real_step_ops(make_optimizer) -> Counter:
    model = nn.Linear(64, 32)
    optimizer = make_optimizer(model.parameters())
    for _ in range(2):  # the first step allocates the state; the tracer prices the next
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(8, 64)).sum().backward()
        with Dispatches() as real:
            optimizer.step()
    return Counter({op: n for op, n in real.ops.items() if op not in MARKERS})


def _trace(make_optimizer, name: str):
    return trace_step(lambda: nn.Linear(64, 32), torch.zeros(64), 8, "fp32", make_optimizer, name)


def _spec(name: str):
    return lambda params: build_optimizer(params, OptimizerSpec(name=name))


def test_a_cpu_trainers_adam_is_one_fused_call_and_the_tracer_prices_that_call():
    ran = _real_step_ops(_spec("adam"))
    # One call for the step counters (+1 each), one fused kernel over weight and bias.
    assert ran == Counter(_foreach_add_=1, _fused_adam_=1)
    step = _trace(_spec("adam"), "adam")
    weight, bias = step.optimizer_tensors
    # The kernel walks its tensors one by one: one op each; the counters' add goes with the
    # first tensor. Each tensor keeps its own bytes.
    assert (weight.cost.ops, bias.cost.ops) == (2, 1)
    assert step.optimizer.ops == ran.total() + 1 == 3
    # 28 bytes a fp32 parameter: parameter, gradient and both moments read, parameter and
    # moments written, in one pass (the loop's kernels made 8 passes and 2 temporaries); and
    # the tensor's step counter read (4 bytes).
    assert weight.cost.bytes_by_op["_fused_adam_"] == 28 * 64 * 32 + 4
    assert bias.cost.bytes_by_op["_fused_adam_"] == 28 * 32 + 4
    # The working set is still one tensor's: its parameter, gradient and two moments.
    assert weight.working_set_bytes == 4 * 4 * 64 * 32
    # The update's arithmetic, one FLOP an element a pass (lerp, mul, addcmul, sqrt, div, add,
    # addcdiv) and the two counters: what a report's optimizer_flops says on any device.
    assert step.optimizer_flops == 7 * (64 * 32 + 32) + 2


@pytest.mark.parametrize(
    ("name", "kernel", "per_param", "counters"),
    [
        ("sgd", "_fused_sgd_", 12, 0),  # parameter and gradient read, parameter written
        ("momentum", "_fused_sgd_", 20, 0),  # and the momentum buffer read and written
        ("adamw", "_fused_adamw_", 28, 2),
        ("adagrad", "_fused_adagrad_", 20, 2),  # parameter, gradient, sum of squares; 2 written
    ],
)
def test_every_optimizer_a_spec_names_is_traced_as_its_fused_kernel(
    name, kernel, per_param, counters
):
    ran = _real_step_ops(_spec(name))
    assert ran[kernel] == 1
    step = _trace(_spec(name), name)
    # the kernel once a tensor (weight, bias), and the call's other dispatches (counters' add)
    assert step.optimizer.ops == 2 + ran.total() - ran[kernel]
    # and each tensor's step counter read, where the optimizer keeps one (4 bytes)
    assert step.optimizer.bytes_by_op[kernel] == per_param * (64 * 32 + 32) + 4 * counters
    assert step.uncounted_ops == {}


def test_an_optimizer_without_a_fused_kernel_is_traced_as_torchs_loop():
    # RMSprop has no fused kernel: per tensor, step += 1, v.mul_, v.addcmul_, sqrt, add_ eps,
    # p.addcdiv_: 6 kernels, each its own pass.
    ran = _real_step_ops(torch.optim.RMSprop)
    per_tensor = Counter(add_=2, mul_=1, addcmul_=1, sqrt=1, addcdiv_=1)
    assert ran == Counter({op: 2 * n for op, n in per_tensor.items()})
    step = _trace(torch.optim.RMSprop, "rmsprop")
    assert step.optimizer.ops == ran.total() == 12
    for tensor in step.optimizer_tensors:
        assert set(tensor.cost.bytes_by_op) == set(per_tensor) and tensor.cost.ops == 6
