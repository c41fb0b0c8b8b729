"""`dlscale bench precision SPEC`: the same model trained at fp32 and bf16 (fp16 and tf32 on a GPU),
and the fp32 model quantized to int8 after training, measured side by side.

Each trained format: final validation accuracy, median training step, inference latency of one
batch of `--latency-batch` validation samples (the median of rounds, with their spread), the
model's bytes (its state dict as saved) and the activations a training step saves (the
profiler's count at that precision). Post-training int8 quantization with torch's
`torch.ao.quantization` on the CPU: dynamic (Linear weights int8, activations quantized on the
fly: `quantize_dynamic`) and static (weights and activations int8, calibrated on training
batches: FX graph mode with the x86 backend's default mapping), each evaluated for accuracy,
latency and bytes. A format that cannot be applied to the model says why instead of a figure.

Every latency is timed after all the training, in rounds that take each format in turn, so that
a change of the machine's load between formats' training runs does not enter their ratio, and a
change while they are timed shows in every format's rounds. A latency whose rounds never agreed
within NOISY_SPREAD is marked noisy, and so is a training step whose steps
spread over STEP_NOISY_SPREAD; no comparison is drawn from a noisy figure.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from dlscale.bench import io_verdict
from dlscale.errors import UserError, one_line
from dlscale.jobspec import SingleStrategy, Spec, load_spec
from dlscale.models.quantize import quantize_dynamic_int8
from dlscale.profiler.calibrate import (
    MAX_ROUNDS,
    ROUNDS,
    STABLE_SPREAD,
    relative_spread,
    settle_allocator,
)
from dlscale.train.device import autocast, resolve_device, synchronize
from dlscale.train.loop import Trainer
from dlscale.train.score import evaluate

SCHEMA = "dlscale.bench.precision/2"
LATENCY_TIME_S = 0.3  # timing one forward: at least this long, in rounds
LATENCY_BATCH = 32  # samples in the batch whose forward is timed, unless --latency-batch says
# A latency whose last rounds still differ by more than this (max / min − 1) after the most
# rounds the calibration runs was timed while the load changed: the calibration's own bar.
NOISY_SPREAD = STABLE_SPREAD
# Training steps are timed one by one: their 10th to 90th percentile, against the bar `bench io`
# holds repeated steps to.
STEP_NOISY_SPREAD = io_verdict.NOISY_SPREAD
CALIBRATION_BATCHES = 8


def model_bytes(model: nn.Module) -> int:
    """Bytes of the model's state dict as torch.save writes it (packed int8 weights included)."""
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.tell()


@dataclass
class Forward:
    """One format's forward, as its latency is timed."""

    model: nn.Module
    x: torch.Tensor
    device: torch.device
    precision: str
    tf32_products: bool = False

    def __call__(self) -> None:  # under `tf32()`, which a round enters once
        with torch.no_grad(), autocast(self.device, self.precision):
            self.model(self.x)

    def tf32(self):
        return _tf32(self.tf32_products)


def round_s(forward: Forward) -> float:
    """Seconds a call of one round of `forward`: LATENCY_TIME_S / ROUNDS of calls, 3 at least."""
    with forward.tf32():
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < LATENCY_TIME_S / ROUNDS or calls < 3:
            forward()
            calls += 1
        synchronize(forward.device)
    return (time.perf_counter() - start) / calls


def interleaved_latencies(forwards: list[Forward]) -> list[dict]:
    """Each forward's latency, timed in rounds that take every format in turn (a round of each
    lasts LATENCY_TIME_S / ROUNDS, 3 calls at least), until each format's last ROUNDS rounds
    agree within NOISY_SPREAD or MAX_ROUNDS have run: a change of load between formats then
    shows as a spread of every format's rounds, where timing one format after another hid it
    (each stable alone, their ratio wrong). Per format: the median of its last rounds, their
    spread, and whether that is noisy."""
    settle_allocator()
    for forward in forwards:
        with forward.tf32():
            for _ in range(3):  # warm-up
                forward()
            synchronize(forward.device)
    rounds: list[list[float]] = [[] for _ in forwards]

    def settled() -> bool:
        return all(relative_spread(each[-ROUNDS:]) <= NOISY_SPREAD for each in rounds)

    while len(rounds[0]) < ROUNDS or (not settled() and len(rounds[0]) < MAX_ROUNDS):
        for forward, times in zip(forwards, rounds, strict=True):
            times.append(round_s(forward))
    found = []
    for times in rounds:
        last = sorted(times[-ROUNDS:])
        spread = relative_spread(last)
        found.append(
            {
                "latency_s": last[len(last) // 2],
                "latency_spread": spread,
                "latency_noisy": spread > NOISY_SPREAD,
            }
        )
    return found


def step_spread(step_times: list[float]) -> dict:
    """The training steps' spread (90th over 10th percentile, less 1) and whether it is noisy."""
    if not step_times:
        return {"train_step_spread": None, "train_step_noisy": False}
    spread = io_verdict.relative_spread(step_times)
    return {"train_step_spread": spread, "train_step_noisy": spread > STEP_NOISY_SPREAD}


def latency_input(loader, samples: int) -> torch.Tensor:
    """The first `samples` validation inputs as one batch: the validation loader's batches are
    at least 256 samples, which is not the batch a latency is stated for."""
    parts, have = [], 0
    for batch in loader:
        parts.append(batch[0][: samples - have])
        have += len(parts[-1])
        if have == samples:
            return torch.cat(parts)
    raise UserError(
        f"--latency-batch {samples}: the validation set has only {have} samples; ask for fewer"
    )


def cpu_has_bf16_units() -> bool:
    """AVX-512 BF16 or AMX: the x86 instructions that compute in bf16 (else it is emulated)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def saved_activation_bytes(spec_path: str | Path, precision: str) -> int | None:
    from dlscale.profiler import trace_workload
    from dlscale.profiler.target import resolve

    try:
        return trace_workload(resolve(str(spec_path), precision=precision)).saved_activation_bytes
    except UserError:
        return None


def run_precision_bench(
    spec_path: str | Path, steps: int | None, latency_batch: int = LATENCY_BATCH
) -> dict:
    spec = load_spec(spec_path)
    if steps is not None and steps < 1:
        raise UserError(f"--steps: must be a positive integer (got {steps})")
    if latency_batch < 1:
        raise UserError(f"--latency-batch: must be a positive integer (got {latency_batch})")
    device = resolve_device(spec.device)
    formats = ["fp32", "bf16"] + (["fp16", "tf32"] if device.type == "cuda" else [])
    rows, timed, fp32, x = [], [], None, None
    with tempfile.TemporaryDirectory() as scratch:
        for name in formats:
            # tf32 (a GPU's): fp32 values, matrix products on Tensor Cores at 10-bit mantissas.
            precision = "fp32" if name == "tf32" else name
            with _tf32(name == "tf32"):
                trainer = _trainer(spec, steps, precision, Path(scratch) / name)
                if x is None:  # too few validation samples: one line before any training
                    x = latency_input(trainer.val_loader, latency_batch)
                record = trainer.run()
            model = trainer.module.eval()
            row = {
                "format": name,
                "kind": "trained",
                "val_accuracy": record["final"]["val_accuracy"],
                "train_step_s": record["final"]["median_step_s"],
                **step_spread(trainer.history.timing.step_times),
                "model_bytes": model_bytes(model),
                "activation_bytes": saved_activation_bytes(spec_path, precision),
            }
            rows.append(row)
            timed.append((row, model, device, precision, name == "tf32"))
            if name == "fp32":
                fp32 = trainer
        quantized = _quantized(fp32)
    rows += [row for row, _model in quantized]
    timed += [(row, model, torch.device("cpu"), "fp32", False) for row, model in quantized if model]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    forwards = [
        Forward(model, x.to(on), on, precision, tf32) for _, model, on, precision, tf32 in timed
    ]
    for (row, *_), found in zip(timed, interleaved_latencies(forwards), strict=True):
        row.update(found)
    return {
        "schema": SCHEMA,
        "spec": str(spec_path),
        "model": spec.model.name,
        "device": str(device),
        "steps": fp32.plan.total_steps,
        "batch_size": spec.batch_size,
        "latency_batch": len(x),
        "noisy_spread": NOISY_SPREAD,
        "step_noisy_spread": STEP_NOISY_SPREAD,
        "noisy": any(row.get("latency_noisy") or row.get("train_step_noisy") for row in rows),
        "load_average_1m": load,
        "cpu_bf16_units": cpu_has_bf16_units() if device.type == "cpu" else None,
        "rows": rows,
        "notes": _notes(rows, device),
    }


@contextlib.contextmanager
def _tf32(on: bool):
    """TF32 matrix products (cuBLAS and cuDNN) while `on`; as they were after."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def _trainer(spec: Spec, steps: int | None, precision: str, run_dir: Path) -> Trainer:
    changes: dict = {"precision": precision, "strategy": SingleStrategy()}
    if steps is not None:
        changes.update(steps=steps, epochs=None)
    return Trainer(spec.model_copy(update=changes), run_dir)


def _quantized(trainer: Trainer) -> list[tuple[dict, nn.Module | None]]:
    """int8 after training: dynamic, then static (FX), each on the CPU; each row with its model
    (None where torch could not quantize it) for the latency timed later."""
    cpu = torch.device("cpu")
    fp32 = copy.deepcopy(trainer.module).to(cpu).eval()
    found = []
    for kind, make in (("int8 dynamic", _dynamic), ("int8 static", _static)):
        row, model = {"format": kind, "kind": "post-training"}, None
        try:
            with warnings.catch_warnings():  # torch's x86 qconfig sets reduce_range, then warns
                warnings.filterwarnings("ignore", message="Please use quant_min and quant_max")
                model = make(fp32, trainer)
            _loss, accuracy = evaluate(model, trainer.val_loader, cpu, "fp32")
            row.update(
                val_accuracy=accuracy,
                train_step_s=None,
                **step_spread([]),
                model_bytes=model_bytes(model),
                activation_bytes=None,
            )
        except Exception as exc:  # a model torch cannot quantize this way: say why, go on
            row["error"] = f"{type(exc).__name__}: {one_line(exc)}"[:300]
            model = None
        found.append((row, model))
    return found


def _dynamic(model: nn.Module, trainer: Trainer) -> nn.Module:
    return quantize_dynamic_int8(model)


def _static(model: nn.Module, trainer: Trainer) -> nn.Module:
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    example = next(iter(trainer.val_loader))[0]
    mapping = get_default_qconfig_mapping("x86")
    prepared = prepare_fx(copy.deepcopy(model), mapping, (example,))
    with torch.no_grad():  # calibration: the observers see real activations' ranges
        for index, batch in enumerate(trainer.train_loader):
            if index >= CALIBRATION_BATCHES:
                break
            prepared(batch[0])
    return convert_fx(prepared)


def _notes(rows: list[dict], device) -> list[str]:
    """Plain statements of what was faster or smaller than fp32, and why where it is slower;
    a ratio of times only where neither time is noisy."""
    notes = []
    by = {row["format"]: row for row in rows if "latency_s" in row}
    fp32 = by.get("fp32")
    if fp32 is None:
        return notes
    noisy = _noise(by)
    if noisy:
        notes.append(noisy)
    emulated = device.type == "cpu" and not cpu_has_bf16_units()
    why = (
        "this CPU has no bf16 arithmetic (no AVX-512 BF16 or AMX): bf16 values are converted "
        "to fp32 to compute"
        if emulated
        else "autocast adds a cast around every matrix product, which a model this small does not "
        "earn back"
    )
    for name, row in by.items():
        if name == "fp32":
            continue
        compared = not (row["latency_noisy"] or fp32["latency_noisy"])
        latency = row["latency_s"] / fp32["latency_s"] if compared else None
        size = row["model_bytes"] / fp32["model_bytes"]
        line = f"{name}: {size:.2f}× fp32's bytes"
        if latency is not None:
            line = f"{name}: {latency:.2f}× fp32's inference latency, {size:.2f}× its bytes"
        step = None
        quiet = not (row["train_step_noisy"] or fp32["train_step_noisy"])
        if row.get("train_step_s") and fp32.get("train_step_s") and quiet:
            step = row["train_step_s"] / fp32["train_step_s"]
            line += f", {step:.2f}× its training step"
        kept, dense = row.get("activation_bytes"), fp32.get("activation_bytes")
        if kept and dense:  # what training saves for backward: bytes, never noisy
            line += f", {1 - kept / dense:.0%} fewer bytes of activations kept for backward"
        slower = (latency or 0) > 1 or (step or 0) > 1
        if name in ("bf16", "fp16") and slower:
            line += f"; slower where above 1: {why}"
        notes.append(line)
    return notes


def _noise(by: dict[str, dict]) -> str | None:
    """Which times were too noisy to compare, or None."""
    latencies = [name for name, row in by.items() if row["latency_noisy"]]
    steps = [name for name, row in by.items() if row["train_step_noisy"]]
    parts = []
    if latencies:
        parts.append(f"the latency rounds of {', '.join(latencies)} spread over {NOISY_SPREAD:.0%}")
    if steps:
        parts.append(
            f"the training steps of {', '.join(steps)} over {STEP_NOISY_SPREAD:.0%} (10th to "
            "90th percentile)"
        )
    if not parts:
        return None
    return (
        f"noisy: {'; '.join(parts)}: the machine's load changed while they were timed, and no "
        "ratio is drawn from them"
    )
