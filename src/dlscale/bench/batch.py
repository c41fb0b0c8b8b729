"""`bench batch`: training throughput vs batch size until memory runs out, measured and predicted.

Each batch size is profiled first (meta device: nothing allocated). A batch whose predicted
training memory exceeds the budget (a share of the device's free memory) is not run: on this
machine running out of memory would take the whole machine down, not just the benchmark. On a GPU
an allocation failure ends the sweep too. The roofline on `local` gives the predicted curve.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import torch

from dlscale import profiler
from dlscale.bench.machine import bench_device
from dlscale.errors import UserError
from dlscale.free_memory import available_memory_bytes
from dlscale.hardware.catalogue import get_hardware, local_entry_path
from dlscale.hardware.trust import calibration
from dlscale.jobspec import Spec, parse_spec
from dlscale.profiler.estimate import measure_steps
from dlscale.profiler.target import resolve
from dlscale.train.loop import Trainer

SCHEMA = "dlscale.bench.batch/1"
DEFAULT_BATCHES = tuple(2**k for k in range(13))  # 1 … 4096
WARMUP_STEPS = 2


def synthetic_spec(
    model: str,
    kwargs: dict,
    shape: list[int],
    tokens: bool,
    batch: int,
    samples: int,
    device: str,
    sequence_classes: bool = False,
) -> Spec:
    """A spec training `model` on seeded synthetic data shaped like its real input."""
    if tokens:  # next-token targets, or one class a sequence (`sequence_classes`)
        data = {
            "name": "synthetic",
            "kind": "tokens",
            "task": "classification" if sequence_classes else "language_modeling",
            "seq_len": shape[0],
            "vocab_size": 256,
            "num_samples": samples,
        }
    else:
        data = {"name": "synthetic", "shape": shape, "num_classes": 10, "num_samples": samples}
    return parse_spec(
        {
            # a factory's package.module:factory is no spec name: its other characters as -
            "name": "bench-" + re.sub(r"[^A-Za-z0-9._-]", "-", model),
            "model": {"name": model, "kwargs": kwargs},
            "data": data,
            "batch_size": batch,
            "device": device,
        }
    )


def run_batch_bench(
    model: str = "lenet",
    batches: list[int] | None = None,
    kwargs: dict | None = None,
    steps: int = 5,
    memory_fraction: float = 0.5,
    device: str = "auto",
    input_shape: list[int] | None = None,
) -> dict:
    if not 0 < memory_fraction <= 0.9:
        raise UserError(f"--memory-fraction must be in (0, 0.9] (got {memory_fraction})")
    if Path(model).suffix in (".yaml", ".yml") or Path(model).is_file():
        raise UserError(
            f"--model {model}: a zoo model or package.module:factory, not a spec (its batch "
            "size is the spec's: `dlscale profile SPEC` says what fits)"
        )
    dev = bench_device(device)
    kwargs = dict(kwargs or {})
    probe = resolve(model, 1, input_shape, model_kwargs=kwargs)
    shape, tokens = list(probe.sample.shape), not probe.sample.is_floating_point()
    classes = tokens and _one_output_a_sequence(probe)  # an LSTM classifier, not a GPT
    if not tokens or classes:
        kwargs.setdefault("num_classes", 10)  # synthetic data has 10 classes
    local = get_hardware("local") if local_entry_path().is_file() else None
    budget = int(available_memory_bytes(dev) * memory_fraction)
    rows = []
    for batch in sorted(batches or DEFAULT_BATCHES):
        row = _batch_row(model, kwargs, shape, tokens, batch, steps, dev, local, budget, classes)
        rows.append(row)
        if row["status"] != "measured":
            break  # memory has run out (or would have): larger batches cannot do better
    return {
        "schema": SCHEMA,
        "model": model,
        "input_shape": shape,
        "device": str(dev),
        "memory_budget_bytes": budget,
        "predicted_on": "local" if local else None,
        "calibration": calibration(local) if local else None,
        "rows": rows,
    }


def _one_output_a_sequence(probe) -> bool:
    """Whether a token model answers once a sequence (a classifier: (B, classes)) rather than
    at every position (a language model: (B, T, vocabulary)), from a forward on the meta
    device (nothing allocated)."""
    with torch.device("meta"):
        module = probe.build()
        output = module(probe.sample.unsqueeze(0).to("meta"))
    return getattr(output, "ndim", 3) == 2


def _batch_row(model, kwargs, shape, tokens, batch, steps, dev, local, budget, classes) -> dict:
    workload = resolve(model, batch, shape, "fp32", "adam", tokens, kwargs)
    result = profiler.profile(workload, [local] if local else [])
    row = {
        "batch_size": batch,
        "predicted_memory_bytes": result.memory.total_bytes,
        "predicted_step_s": result.reports[0].prediction.step_s if local else None,
        "measured_step_s": None,
        "status": "measured",
    }
    if row["predicted_step_s"]:
        row["predicted_samples_per_s"] = batch / row["predicted_step_s"]
    if result.memory.total_bytes > budget:
        row["status"] = "over memory budget"
        return row
    samples = batch * (WARMUP_STEPS + steps + 1) * 5 // 4 + 1  # 80% of synthetic data trains
    spec = synthetic_spec(model, kwargs, shape, tokens, batch, samples, str(dev), classes)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            times = sorted(measure_steps(Trainer(spec, Path(scratch)), WARMUP_STEPS, steps))
    except torch.OutOfMemoryError:
        row["status"] = "out of memory"
        return row
    row["measured_step_s"] = times[len(times) // 2]
    row["measured_samples_per_s"] = batch / row["measured_step_s"]
    return row
