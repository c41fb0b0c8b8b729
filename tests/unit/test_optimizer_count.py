"""The optimizer update the tracer prices is the one a CPU runs: the same kernels, one parameter
tensor at a time (torch's Adam on a CPU takes its single-tensor path by default)."""

from collections import Counter

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from dlscale.profiler.trace import trace_step

# Dispatched by Adam's step but moving no data: the profiler's markers around the step, and
# each tensor's step count read back to the host (`.item()`), which the tracer counts as free.
MARKERS = {"_record_function_enter_new", "_record_function_exit", "_local_scalar_dense"}


class Dispatches(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_a_cpu_adam_step_dispatches_the_ops_the_tracer_prices():
    model = nn.Linear(64, 32)
    optimizer = torch.optim.Adam(model.parameters())
    for _ in range(2):  # the first step allocates the state; the tracer prices the next
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(8, 64)).sum().backward()
        with Dispatches() as real:
            optimizer.step()
    ran = Counter({op: n for op, n in real.ops.items() if op not in MARKERS})
    # Per tensor (weight, bias): step += 1, m.lerp_, v.mul_, v.addcmul_, sqrt, div, add_ eps,
    # p.addcdiv_: 8 kernels, none of them foreach on a CPU.
    per_tensor = Counter(add_=2, lerp_=1, mul_=1, addcmul_=1, sqrt=1, div=1, addcdiv_=1)
    assert ran == Counter({op: 2 * n for op, n in per_tensor.items()})
    step = trace_step(
        lambda: nn.Linear(64, 32), torch.zeros(64), 8, "fp32", torch.optim.Adam, "adam"
    )
    assert step.optimizer.ops == ran.total() == 16
    for tensor in step.optimizer_tensors:
        assert set(tensor.cost.bytes_by_op) == set(per_tensor) and tensor.cost.ops == 8
    # Bytes: the weight's 2,048 fp32 elements, 8 KiB a pass; lerp_ reads m and the gradient and
    # writes m (3 passes), addcmul_ reads v and the gradient twice and writes v (4), addcdiv_
    # reads p, m and the denominator and writes p (4), the others read and write one (2 each);
    # step += 1 is a one-element tensor (2 × 4 bytes + the scalar's 8).
    weight = step.optimizer_tensors[0].cost.bytes_by_op
    passes = {"lerp_": 3, "addcmul_": 4, "addcdiv_": 4, "mul_": 2, "sqrt": 2, "div": 2}
    assert {op: weight[op] for op in passes} == {op: n * 8192 for op, n in passes.items()}
