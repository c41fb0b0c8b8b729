"""Tensor parallel (degree 2) against a 2-stage pipeline and 2 data-parallel workers: the same
model and global batch, throughput and bytes communicated per step, measured beside predicted,
and where each spends its step (a plot).

Model: the zoo's `gpt` (4 layers × 256, 4 heads, 64 tokens, vocabulary 256; 3.3M parameters)
on synthetic tokens, global batch 32, AdamW, `--steps` steps a run, CPU processes over gloo.
Rounds run the three strategies interleaved (the machine's load drifts); medians and the spread
over the rounds are printed with `uptime`.

- ddp: 2 workers × 16; moves the fp32 gradients (ring all-reduce inside backward). Predicted
  payload: trainable parameters × 4 bytes.
- pipeline: 2 stages, GPipe, 4 microbatches; moves each microbatch's activations forward and
  their gradients back (what the stages send, counted). Predicted: the profiler's split, its
  boundary tensor × 2 (profiler/scaling.py).
- tensor: degree 2, the auto plan (attention heads and MLP halves, Megatron pairs); moves
  activations inside forward and backward (every DTensor collective, metered). Predicted: the
  plan's collectives at this batch (profiler/tensor_plan.py).

    .venv/bin/python benchmarks/tensor_vs_pipeline.py [--steps 30] [--rounds 3] [--plot FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch

from dlscale.api import train
from dlscale.jobspec import parse_spec
from dlscale.models import build_model
from dlscale.profiler.memory import FP32_BYTES
from dlscale.profiler.request import ScalingRequest
from dlscale.profiler.scaling import predict_scaling
from dlscale.profiler.trace import trace_step
from dlscale.train.record import RunRecord
from dlscale.train.step import build_optimizer

GLOBAL_BATCH = 32
KWARGS = {"n_layer": 4, "d_model": 256, "n_head": 4, "vocab_size": 256, "context_length": 64}
STRATEGIES = {
    "ddp": ({"name": "ddp", "workers": 2}, GLOBAL_BATCH // 2),
    "pipeline": ({"name": "pipeline", "stages": 2, "microbatches": 4}, GLOBAL_BATCH),
    "tensor": ({"name": "tensor", "degree": 2}, GLOBAL_BATCH),
}


def make_spec(strategy: dict, batch: int, steps: int) -> dict:
    return {
        "name": f"tp-bench-{strategy['name']}",
        "model": {"name": "gpt", "kwargs": KWARGS},
        "data": {
            "name": "synthetic",
            "kind": "tokens",
            "task": "language_modeling",
            "seq_len": 64,
            "vocab_size": 256,
            "num_samples": (steps + 4) * GLOBAL_BATCH,
            "val_fraction": 0.02,
        },
        "batch_size": batch,
        "steps": steps,
        "optimizer": {"name": "adamw", "lr": 0.001},
        "device": "cpu",
        "strategy": strategy,
    }


def measured(name: str, record: RunRecord) -> dict:
    """Throughput, payload bytes per step and the main trainer's step split."""
    final, steps = record.final, max(1, record.final.step)
    if name == "ddp":
        payload = record.distributed["allreduce_payload_bytes_per_step"]
    elif name == "pipeline":
        stages = record.pipeline["per_stage"]
        payload = sum(stage["sent_bytes"] for stage in stages) / steps
    else:
        payload = record.tensor["comm_payload_bytes_per_step"]
    # The main trainer's figures beyond the common ones (its strategy's keys).
    main = (record.workers[0] if name != "pipeline" else record.workers[-1]).model_extra
    bubble = record.pipeline["bubble_measured"] if name == "pipeline" else 0.0
    return {
        "samples_per_s": final.train_samples_per_s,
        "payload": payload,
        "median_step_s": final.median_step_s,
        "split": {
            "data": main.get("data_wait_share", 0.0) + main.get("h2d_share", 0.0),
            "compute": main.get("compute_share", 0.0) * (1 - bubble),
            "bubble": main.get("compute_share", 0.0) * bubble,
            "communication": main.get("comm_wait_share", 0.0),
        },
        "overlapped_comm": (record.distributed or {}).get("allreduce_share", 0.0),
    }


def predicted_payloads() -> dict[str, float]:
    """Bytes one step moves, from the model alone (before any run)."""
    from dlscale.hardware.links import measured_link
    from dlscale.profiler.tensor_plan import plans_for

    factory = lambda: build_model("gpt", KWARGS)  # noqa: E731
    sample = torch.zeros(64, dtype=torch.long)
    trace = trace_step(
        factory,
        sample,
        GLOBAL_BATCH,
        "fp32",
        lambda p: build_optimizer(p, parse_spec(make_spec({"name": "single"}, 1, 1)).optimizer),
        "adamw",
    )
    link = measured_link({"bytes_per_s": 1e9, "latency_s": 1e-5})
    plans = plans_for(factory, sample, trace.params)
    request = ScalingRequest((2,), strategies=("pipeline", "tensor"))
    points = predict_scaling(trace, _any_hardware(), request, link, tensor_plans=plans)
    pipe = next(p for p in points if p.strategy == "pipeline")
    tensor = next(p for p in points if p.strategy == "tensor")
    micro = pipe.detail["microbatches"]
    return {
        "ddp": trace.trainable_params * FP32_BYTES,
        # Pipeline: each boundary sends a microbatch's activations and gets their gradients.
        "pipeline": 2 * sum(pipe.detail["boundary_bytes"]) * micro,
        "tensor": sum(e["payload_bytes"] for e in tensor.detail["collectives"].values()),
    }


def _any_hardware():
    from dlscale.hardware import get_hardware

    return get_hardware("i7-7700k")  # the payloads do not depend on the device


def plot(rows: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {
        "data": "#bbbbbb",
        "compute": "#4c72b0",
        "bubble": "#dd8452",
        "communication": "#c44e52",
    }
    fig, ax = plt.subplots(figsize=(10, 3.2))
    names = list(rows)
    for y, name in enumerate(names):
        step_ms = rows[name]["median_step_s"] * 1e3
        left = 0.0
        for part, colour in colours.items():
            width = rows[name]["split"][part] * step_ms
            ax.barh(y, width, left=left, color=colour, label=part if y == 0 else None)
            left += width
        hidden = rows[name]["overlapped_comm"] * step_ms
        if hidden:
            ax.barh(
                y,
                hidden,
                left=0,
                height=0.25,
                color="none",
                edgecolor="#c44e52",
                hatch="///",
                label="all-reduce hidden in backward",
            )
        ax.text(left, y, f" {rows[name]['samples_per_s']:,.0f} samples/s", va="center")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("median step (ms), split by where the main trainer spent it")
    ax.set_title(f"gpt 4×256, global batch {GLOBAL_BATCH}, 2 CPU processes (gloo)")
    ax.set_xlim(0, ax.get_xlim()[1] * 1.25)  # room for the throughput labels
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("DLSCALE_HOME", tempfile.mkdtemp(prefix="dlscale-bench-"))
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    predicted = predicted_payloads()
    runs: dict[str, list[dict]] = {name: [] for name in STRATEGIES}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for name, (strategy, batch) in STRATEGIES.items():
                spec = parse_spec(make_spec(strategy, batch, args.steps))
                record = train(spec, out_dir=Path(scratch) / f"{name}-{round_}")
                runs[name].append(measured(name, record))
    print(f"gpt {KWARGS}, global batch {GLOBAL_BATCH}, {args.steps} steps, {args.rounds} rounds")
    print(
        f"{'strategy':<9} {'samples/s median':>16} {'(min–max)':>14} {'bytes/step measured':>20} "
        f"{'predicted':>10} {'comm share':>10}"
    )
    medians = {}
    for name, found in runs.items():
        rates = [r["samples_per_s"] for r in found]
        medians[name] = min(found, key=lambda r: abs(r["samples_per_s"] - statistics.median(rates)))
        payload = statistics.median(r["payload"] for r in found)
        share = medians[name]["split"]["communication"] + medians[name]["overlapped_comm"]
        print(
            f"{name:<9} {statistics.median(rates):>16,.0f} "
            f"{min(rates):>6,.0f}–{max(rates):<7,.0f} {payload:>20,.0f} "
            f"{predicted[name]:>10,.0f} {share:>10.0%}"
        )
    base = statistics.median(r["samples_per_s"] for r in runs["ddp"])
    for name in ("pipeline", "tensor"):
        rate = statistics.median(r["samples_per_s"] for r in runs[name])
        print(f"{name} / ddp throughput: {rate / base:.2f}")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    if args.plot:
        plot(medians, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
