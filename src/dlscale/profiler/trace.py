"""Trace one training step on the meta device: per-module FLOPs, bytes moved, saved activations.

Nothing real is allocated: the model, the batch and the optimizer live on the meta device, where
every aten op still runs its shape logic. A TorchDispatchMode sees every op of the forward pass,
the loss, the backward pass and the optimizer step:

- FLOPs of conv, linear, matmul and attention come from `torch.utils.flop_counter.flop_registry`,
  the formulas FlopCounterMode uses (FLOPs = 2 × MACs);
- forward ops belong to the innermost module running (module hooks keep the stack); backward ops
  belong to the module whose forward created the autograd node now executing (each module's
  forward hook claims the graph nodes its forward made). torch's ModuleTracker is not used for
  backward: with residual connections it keeps several modules "active" at once;
- other compute (elementwise, reductions, norms, pooling, losses) is counted separately at one
  FLOP per element of the op's largest tensor, and shown apart;
- every op moves the bytes of its tensor inputs and outputs (views move nothing);
- ops the tracer does not know are listed by name, never silently dropped;
- activations saved for backward are what autograd actually saves (saved-tensor hooks), counted
  once per storage, parameters excluded;
- the optimizer's step is traced in its steady state (after a first step allocates its state),
  both as a CPU trainer runs it, one parameter tensor at a time with each tensor's working set
  (torch's fused kernel, one pass a tensor, which dlscale's CPU training uses: train/step.py
  build_optimizer; torch's per-tensor loop of kernels for an optimizer without one), and as
  its multi-tensor (foreach) kernels, an accelerator's default. The fused kernels refuse meta
  tensors, so they are traced on fake CPU tensors, which hold no storage either.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_leaves, tree_map

from dlscale.profiler.attention import FusedAttention
from dlscale.profiler.inputs import example_inputs, logits_of
from dlscale.profiler.recorder import (
    LOSS,
    MODEL,
    OPTIMIZER,
    ModuleFailure,
    OpFailure,
    PhaseCost,
    Recorder,
    nbytes,
    storage_id,
)
from dlscale.profiler.recurrent import FusedCalls, cpu_fused_ops, merged_products


@dataclass
class LayerTrace:
    """One module's share of a training step. `own` rows are a container's own ops."""

    name: str
    type: str
    order: int
    leaf: bool
    params: int = 0
    weight_bytes: int = 0
    input_bytes: int = 0
    output_bytes: int = 0
    output_shape: list[int] | None = None
    calls: int = 0
    forward: PhaseCost = field(default_factory=PhaseCost)
    backward: PhaseCost = field(default_factory=PhaseCost)
    saved_bytes: int = 0
    # Where a CPU runs this layer as one fused kernel per layer (an fp32 LSTM): the ops it
    # dispatches and the bytes it does not move (profiler/recurrent.py); None: as traced
    cpu_fused: FusedCalls | None = None

    @property
    def working_set_bytes(self) -> int:
        return self.input_bytes + self.output_bytes + self.weight_bytes

    def phases(self, kind: str) -> tuple[PhaseCost, PhaseCost]:
        """Forward and backward as a device of `kind` runs them: on a CPU that fuses the layer,
        the same FLOPs (done inside the kernel) in fewer dispatched ops, the products that do
        not wait on the step before merged over the steps, without the backward's separate
        accumulation of per-step weight gradients, its bytes moved inside the kernel
        (`kernel_step_bytes`: profiler/recurrent.py, roofline.phase_time)."""
        fused = self.cpu_fused
        if kind != "cpu" or fused is None:
            return self.forward, self.backward
        by_op = Counter(self.backward.bytes_by_op)
        by_op["add"] -= fused.accumulation_bytes
        backward = replace(
            self.backward,
            ops=fused.backward_ops,
            bytes=self.backward.bytes - fused.accumulation_bytes,
            bytes_by_op=+by_op,
            gemms=merged_products(self.backward.gemms, fused.backward_merged),
            kernel_step_bytes=fused.kernel_weight_bytes,
        )
        forward = replace(
            self.forward,
            ops=fused.forward_ops,
            gemms=merged_products(self.forward.gemms, fused.forward_merged),
            kernel_step_bytes=fused.kernel_weight_bytes,
        )
        return forward, backward


@dataclass(frozen=True)
class TensorUpdate:
    """The optimizer's ops on one parameter tensor, as a CPU trainer runs them (fused)."""

    working_set_bytes: int  # the parameter, its gradient and its optimizer state
    cost: PhaseCost


@dataclass
class StepTrace:
    """Everything one traced training step tells us; the input of memory, roofline and advice."""

    layers: list[LayerTrace]  # modules that did work, in execution order, plus loss/optimizer
    module_types: dict[str, str]  # every module name -> class name (containers included)
    optimizer: PhaseCost  # a CPU trainer's update: tensor by tensor, fused where torch can
    optimizer_tensors: list[TensorUpdate]  # the same, one parameter tensor at a time
    optimizer_foreach: PhaseCost  # its GPU default: multi-tensor (foreach) kernels
    uncounted_ops: dict[str, int]
    batch_size: int
    input_shape: list[int]  # one sample
    batch_bytes: int  # the input batch and its targets, as copied to the device each step
    params: int
    trainable_params: int
    saved_activation_bytes: int
    optimizer_state_bytes: int
    precision: str
    optimizer_name: str
    # Every input the forward takes, one sample each (a model given --inputs may take several;
    # input_shape is the first's).
    input_shapes: list[list[int]] = field(default_factory=list)

    @property
    def optimizer_flops(self) -> int:
        """The update's arithmetic: one FLOP an element for each elementwise pass it makes, as
        its multi-tensor kernels count it, the same on any device (a CPU's fused kernel makes
        the passes inside one call, whose trace counts one FLOP an element)."""
        return self.optimizer_foreach.flops

    @property
    def optimizer_working_set_bytes(self) -> int:
        """What foreach kernels touch at once: every trainable tensor's parameter, gradient and
        optimizer state."""
        return sum(tensor.working_set_bytes for tensor in self.optimizer_tensors)


class _ModuleWatcher:
    """Module hooks: the forward stack, call order, input/output bytes and shapes, node claims."""

    def __init__(self, model: nn.Module, recorder: Recorder, precision: str):
        self.recorder = recorder
        self.precision = precision
        self.layers: dict[str, LayerTrace] = {}
        self.handles = []
        self.calls = 0
        self.boundaries: list[frozenset] = []  # per running module: its inputs' graph nodes
        for name, module in model.named_modules():
            name = name or MODEL
            own = list(module.parameters(recurse=False))
            self.layers[name] = LayerTrace(
                name=name,
                type=type(module).__name__,
                order=-1,
                leaf=next(module.children(), None) is None,
                params=sum(p.numel() for p in own),
                weight_bytes=sum(nbytes(p) for p in own),
            )
            self.handles.append(
                module.register_forward_pre_hook(self._pre_hook(name), with_kwargs=True)
            )
            self.handles.append(module.register_forward_hook(self._hook(name), with_kwargs=True))

    def _pre_hook(self, name: str):
        """Order is when a module starts: a container comes just before its children."""

        def hook(module, args, kwargs):
            layer = self.layers[name]
            if layer.order < 0:
                layer.order = self.calls
                self.calls += 1
            self.recorder.stack.append(name)
            tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            self.boundaries.append(frozenset(t.grad_fn for t in tensors if t.grad_fn is not None))

        return hook

    def _hook(self, name: str):
        def hook(module, inputs, kwargs, output):
            popped = self.recorder.stack.pop()
            assert popped == name, f"module stack out of order: {popped} != {name}"
            self.recorder.claim(output, name, self.boundaries.pop())
            layer = self.layers[name]
            outs = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor)]
            if layer.output_shape is None and outs:
                layer.output_shape = list(outs[0].shape)
            layer.calls += 1
            layer.input_bytes += sum(
                nbytes(t) for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)
            )
            layer.output_bytes += sum(nbytes(t) for t in outs)
            fused = cpu_fused_ops(module, inputs, kwargs, self.precision)
            if fused is not None:
                layer.cpu_fused = fused if layer.cpu_fused is None else layer.cpu_fused + fused

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def trace_step(
    build: Callable[[], nn.Module],
    sample: torch.Tensor,
    batch_size: int,
    precision: str,
    make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
    optimizer_name: str,
    input_requires_grad: bool = False,
    inputs: Callable[[int], Any] | None = None,
    inputs_label: str = "",
    fake: bool = False,
) -> StepTrace:
    """Run forward, loss, backward and one optimizer step of `build()` on the meta device.

    `sample` is one input (no batch dimension; float for images and features, int64 for tokens).
    Data needs no gradient; `input_requires_grad` traces a block as if it sat mid-network.
    Mixed precision is approximated by running the whole forward and backward in bf16/fp16
    (activations at 2 bytes, as autocast saves most of them); weights, gradients and optimizer
    state are kept in fp32, as mixed-precision training keeps them.
    """
    dtype = DTYPES[precision]
    # Fake tensors (what torch.compile traces with) when asked: libraries such as transformers
    # skip their value checks (`.item()` on an attention mask) for them, not for meta tensors.
    # They too hold no storage: nothing real is allocated either way.
    space = FakeTensorMode(allow_non_fake_inputs=True) if fake else nullcontext()
    device = "cpu" if fake else "meta"
    with space:
        with torch.device(device):
            model = build()
            if inputs is None:
                x = sample.to(device).expand(batch_size, *sample.shape).contiguous()
                args, kwargs = (x,), {}
        if inputs is not None:
            args, kwargs = example_inputs(inputs, batch_size, inputs_label, device)
        if dtype != torch.float32:
            model.to(dtype)

            def cast(value):
                is_float = isinstance(value, torch.Tensor) and value.is_floating_point()
                return value.to(dtype) if is_float else value

            args, kwargs = tree_map(cast, args), tree_map(cast, kwargs)
        given = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if input_requires_grad:
            for tensor in given:
                if tensor.is_floating_point():
                    tensor.requires_grad_(True)
        model.train()
        recorder = Recorder()
        watcher = _ModuleWatcher(model, recorder, precision)
        saved = _SavedTensors(model, recorder)
        try:
            with recorder, FusedAttention():
                with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
                    logits = logits_of(model(*args, **kwargs))
                    if not isinstance(logits, torch.Tensor) or logits.ndim < 2:
                        got = (
                            tuple(logits.shape)
                            if isinstance(logits, torch.Tensor)
                            else type(logits)
                        )
                        raise ValueError(f"it returned {got}, not logits (batch, ..., classes)")
                    recorder.scope = LOSS
                    targets = torch.empty(logits.shape[:-1], dtype=torch.long, device=device)
                    loss = torch.nn.functional.cross_entropy(
                        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)
                    )
                recorder.claim(loss, LOSS)
                loss.backward()
        except OpFailure as failure:
            failure.module_type = _type_of(watcher, failure.module)
            raise
        except (Exception, SystemExit) as exc:  # in Python code: the innermost module running
            if not recorder.stack:
                raise
            module = recorder.stack[-1]
            raise ModuleFailure(module, _type_of(watcher, module), exc) from exc
        finally:
            watcher.remove()
    # A CPU trainer updates one tensor after another (torch's fused kernel walks its list of
    # tensors in turn; its per-tensor loop runs all of one tensor's kernels before the next
    # tensor's): one optimizer per parameter gives each tensor's ops (SGD, Adam, AdamW and
    # Adagrad do the same ops on a tensor alone as among the others). Meta tensors hold no
    # values, so the same parameters serve the loop's and the foreach trace.
    trainable = _meta_trainable(build)
    tensors = _cpu_updates(trainable, make_optimizer)
    optimizer_cost = PhaseCost()
    for tensor in tensors:
        optimizer_cost.add(tensor.cost)
    foreach_cost, state_bytes = _trace_optimizer(trainable, make_optimizer, foreach=True)
    layers = _collect(watcher, recorder, saved)
    params = sum(p.numel() for p in model.parameters())
    return StepTrace(
        layers=layers,
        module_types={n: layer.type for n, layer in watcher.layers.items() if n != MODEL},
        optimizer=optimizer_cost,
        optimizer_tensors=tensors,
        optimizer_foreach=foreach_cost,
        uncounted_ops=dict(recorder.uncounted),
        batch_size=batch_size,
        input_shape=list(given[0].shape[1:]) if inputs is not None else list(sample.shape),
        batch_bytes=sum(nbytes(t) for t in given) + targets.numel() * 8,
        params=params,
        trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        saved_activation_bytes=saved.total_bytes,
        optimizer_state_bytes=state_bytes,
        precision=precision,
        optimizer_name=optimizer_name,
        input_shapes=(
            [list(t.shape[1:]) for t in given] if inputs is not None else [list(sample.shape)]
        ),
    )


def _type_of(watcher: _ModuleWatcher, module: str) -> str:
    layer = watcher.layers.get(module)
    return layer.type if layer is not None else "?"


class _SavedTensors:
    """Saved-tensor hooks: what autograd keeps for backward, once per storage, weights excluded."""

    def __init__(self, model: nn.Module, recorder: Recorder):
        self.recorder = recorder
        self.param_storages = {storage_id(p) for p in model.parameters()}
        self.seen: set[int] = set()
        self.keep: list[torch.Tensor] = []  # alive until the end, so storage ids stay unique
        self.by_layer: Counter[str] = Counter()
        self.total_bytes = 0

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = storage_id(tensor)
        if storage not in self.seen and storage not in self.param_storages:
            self.seen.add(storage)
            self.keep.append(tensor)
            size = tensor.untyped_storage().nbytes()
            self.total_bytes += size
            self.by_layer[self.recorder.current()[0]] += size
        return tensor

    @staticmethod
    def unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def meta_model_state(
    build: Callable[[], nn.Module],
    make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
) -> tuple[int, int, int]:
    """Parameters, trainable parameters and optimizer-state bytes of `build()`, as `trace_step`
    counts them, without the forward and backward passes: what memory checks need, cheaply."""
    with torch.device("meta"):
        model = build()
    trainable = [p for p in model.parameters() if p.requires_grad]
    _, state_bytes = _trace_optimizer(trainable, make_optimizer, foreach=True)
    params = sum(p.numel() for p in model.parameters())
    return params, sum(p.numel() for p in trainable), state_bytes


def _meta_trainable(build: Callable[[], nn.Module]) -> list[nn.Parameter]:
    """A fresh fp32 copy of the model's trainable parameters on the meta device."""
    with torch.device("meta"):
        model = build()
    return [p for p in model.parameters() if p.requires_grad]


def _cpu_updates(
    params: list[nn.Parameter],
    make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
) -> list[TensorUpdate]:
    """Each parameter tensor's update as a CPU trainer runs it: torch's fused kernel, traced on
    fake CPU copies of `params` (the kernels refuse meta tensors); torch's per-tensor loop where
    the optimizer has no fused kernel. The fused kernel is one call over every tensor, which it
    walks one by one, each tensor its own parallel loop: 3.3 µs a tensor on the 2-core
    development machine (64 tensors of 64 elements: 236 µs a step against 30 µs for one; a bare
    op's dispatch costs about as much), so each tensor counts one op, and the call's other
    dispatches (the step counters' add, the same for one tensor as for all) go with the first
    tensor. Each tensor's bytes are its own."""
    with FakeTensorMode():
        copies = [nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="cpu")) for p in params]
        first = _trace_optimizer(copies[:1], make_optimizer, fused=True) if copies else None
        fused = first is not None
        if fused:
            alone = [first] + [
                _trace_optimizer([c], make_optimizer, fused=True) for c in copies[1:]
            ]
    if not fused:
        alone = [_trace_optimizer([p], make_optimizer) for p in params]
    updates = []
    for index, (param, (cost, state)) in enumerate(zip(params, alone, strict=True)):
        if fused and index:  # the first keeps the call's dispatches; the rest one op each
            cost = replace(cost, ops=1)
        updates.append(TensorUpdate(2 * nbytes(param) + state, cost))
    return updates


def _trace_optimizer(
    params: list[nn.Parameter],
    make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
    foreach: bool = False,
    fused: bool = False,
):
    """A steady-state optimizer step on meta `params`: its ops, and the state the optimizer
    keeps. The first step, which allocates that state, runs untraced: training pays for it once.
    `fused`: as torch's fused kernel, on fake CPU `params` (inside their FakeTensorMode); None
    where the optimizer has none."""
    if not params:  # nothing to update
        return PhaseCost(), 0
    for p in params:
        p.grad = torch.empty_like(p)
    optimizer = make_optimizer(params)
    if fused and "fused" not in optimizer.defaults:
        return None
    for group in optimizer.param_groups:
        group["foreach"] = foreach
        if fused:
            group["fused"], group["foreach"] = True, None
    optimizer.step()
    recorder = Recorder()
    recorder.scope = OPTIMIZER
    with recorder:
        optimizer.step()
    cost = PhaseCost()
    for phase_cost in recorder.costs.values():
        cost.add(phase_cost)
    # The state beside each parameter, on its device (a fused kernel's step counters are 0-d
    # tensors there: not state that grows with the model)
    state_bytes = sum(
        nbytes(value)
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.device == params[0].device and value.dim() > 0
    )
    return cost, state_bytes


def _collect(watcher: _ModuleWatcher, recorder: Recorder, saved: _SavedTensors) -> list[LayerTrace]:
    """Rows that did work: leaves and containers' own ops in execution order, then the loss."""
    rows: list[LayerTrace] = []
    for name, layer in watcher.layers.items():
        forward = recorder.costs.get((name, "forward"), PhaseCost())
        backward = recorder.costs.get((name, "backward"), PhaseCost())
        if layer.order < 0 or (not layer.leaf and forward.ops + backward.ops == 0):
            continue  # never called, or a container with no ops of its own
        layer.forward, layer.backward = forward, backward
        layer.saved_bytes = saved.by_layer.get(name, 0)
        rows.append(layer)
    rows.sort(key=lambda layer: layer.order)
    loss = LayerTrace(name=LOSS, type="cross_entropy", order=len(rows), leaf=True)
    loss.forward = recorder.costs.get((LOSS, "forward"), PhaseCost())
    loss.backward = recorder.costs.get((LOSS, "backward"), PhaseCost())
    loss.saved_bytes = saved.by_layer.get(LOSS, 0)
    return [*rows, loss]
