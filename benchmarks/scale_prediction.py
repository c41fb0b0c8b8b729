"""The scaling model against measurement on this machine: `dlscale scale` (ddp over gloo with 1
and 2 workers) and a `ps` run (async, 2 workers, 1 server), predicted beside measured.

The prediction is what `dlscale profile --devices` computes: the roofline on the `local` entry
(measured first, by `dlscale bench machine --quick` into a scratch DLSCALE_HOME) for one
worker's step, at the threads each worker gets, plus the scaling model's communication over the
`local-gloo` link that the same bench measured (two local processes, gloo all-reduces fitted to
latency + bytes / bandwidth). Goal: every predicted / measured ratio within ±20%.

Beside it, the communication model alone: ddp 2 and ps 2 predicted from the MEASURED 1-worker
step of the same round (the scaling model's `single_step_s`), so that the one-device
prediction's error (the loop's own per-step cost, a calibration taken on a busy machine) does
not hide the error of what the model adds for two workers.

    .venv/bin/python benchmarks/scale_prediction.py [--rounds 3] [--steps 60]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "examples" / "mlp-digits.yaml"
GOAL = 0.20


def ps_spec(steps: int):
    from dlscale.jobspec import load_spec

    spec = load_spec(SPEC)
    # gloo: the link the model prices (on one host `auto` would pick shared memory)
    strategy = {"name": "ps", "mode": "async", "workers": 2, "servers": 1, "data_plane": "gloo"}
    data = spec.model_dump(mode="json") | {"strategy": strategy, "steps": steps, "epochs": None}
    from dlscale.jobspec import parse_spec

    return parse_spec(data)


def predict_ps(threads: int) -> float:
    """The ps run's samples/s, as `dlscale scale` predicts its ddp rows."""
    from dlscale.bench.scale import predicted_rows
    from dlscale.hardware.catalogue import get_hardware
    from dlscale.hardware.links import measured_link

    local = get_hardware("local")
    link = measured_link(local.measured["link"])
    (row,) = predicted_rows(str(SPEC), [2], threads, local, link, strategy="ps")
    return row["samples_per_s"]


def from_measured_one(one_worker_samples_per_s: float) -> dict[str, float]:
    """ddp 2's and ps 2's samples/s as the scaling model predicts them from the MEASURED
    one-worker step (its `single_step_s`): the communication model alone, whatever the
    one-device prediction's error. That step is ddp's with one worker, DDP's own work in it;
    the model adds that work to a ddp point itself (`reducer_s`), so it is taken out first:
    the one-device step the points start from is the measured one less it."""
    from dlscale.hardware.catalogue import get_hardware
    from dlscale.hardware.links import measured_link
    from dlscale.profiler import trace_workload
    from dlscale.profiler.request import ScalingRequest
    from dlscale.profiler.scaling import predict_scaling
    from dlscale.profiler.target import resolve

    local = get_hardware("local")
    link = measured_link(local.measured["link"])
    trace = trace_workload(resolve(str(SPEC)))
    (alone,) = predict_scaling(trace, local, ScalingRequest((1,), strategies=("ddp",)), link)
    one_step_s = trace.batch_size / one_worker_samples_per_s - alone.detail["reducer_s"]
    request = ScalingRequest((2,), strategies=("ddp", "ps"))
    points = predict_scaling(trace, local, request, link, single_step_s=one_step_s)
    return {f"{p.strategy} 2": p.samples_per_s for p in points}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="dlscale-bench-home-")
    os.environ["DLSCALE_HOME"] = home
    from dlscale import api
    from dlscale.api.bench import bench_machine, save_local_hardware
    from dlscale.api.experiments import scale

    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"calibrating this machine into {home} (dlscale bench machine --quick) ...")
    calibration = bench_machine(quick=True)
    save_local_hardware(calibration)
    for problem in calibration.get("unreliable") or []:
        print(f"calibration UNRELIABLE (bench machine says): {problem}")
    ratios: dict[str, list[float]] = {"ddp 1": [], "ddp 2": [], "ps 2": []}
    measured: dict[str, list[float]] = {key: [] for key in ratios}
    predicted: dict[str, float] = {}
    comm_measured: list[float] = []
    # Scaling efficiency against the same round's 1 worker, measured and predicted: the
    # communication model's share of the error, apart from the one-worker step's.
    efficiency: dict[str, list[tuple[float, float]]] = {"ddp 2": [], "ps 2": []}
    comm_only: dict[str, list[float]] = {"ddp 2": [], "ps 2": []}
    for round_index in range(args.rounds):
        with tempfile.TemporaryDirectory() as out:
            result = scale(SPEC, [1, 2], Path(out) / "scale", steps=args.steps)
            threads = result.threads_per_worker
            for row in result.rows:
                key = f"ddp {row.workers}"
                if row.workers == 2:  # where the error comes from: the all-reduce in a step
                    step_s = row.global_batch_size / row.samples_per_s
                    comm_measured.append(row.allreduce_share * step_s)
                ratios[key].append(row.predicted_over_measured)
                measured[key].append(row.samples_per_s)
                predicted[key] = row.predicted_samples_per_s
            record = api.train(ps_spec(args.steps), Path(out) / "ps")
            ps_measured = record.final.train_samples_per_s
            predicted["ps 2"] = predict_ps(threads)
            measured["ps 2"].append(ps_measured)
            ratios["ps 2"].append(predicted["ps 2"] / ps_measured)
            one_measured, one_predicted = measured["ddp 1"][-1], predicted["ddp 1"]
            for key, value in from_measured_one(one_measured).items():
                comm_only[key].append(value / measured[key][-1])
            for key in efficiency:
                efficiency[key].append(
                    (
                        measured[key][-1] / (2 * one_measured),
                        predicted[key] / (2 * one_predicted),
                    )
                )
        print(
            f"round {round_index + 1}: "
            + ", ".join(f"{key} {values[-1]:.2f}" for key, values in ratios.items())
        )
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print()
    print(
        "| run | measured samples/s (median) | predicted samples/s | predicted / measured "
        f"(median, rounds) | within ±{GOAL:.0%} |"
    )
    print("|---|---|---|---|---|")
    met = True
    for key, values in ratios.items():
        median = statistics.median(values)
        ok = abs(median - 1) <= GOAL
        met &= ok
        rounds = " ".join(f"{v:.2f}" for v in values)
        print(
            f"| {key} | {statistics.median(measured[key]):,.0f} | {predicted[key]:,.0f} | "
            f"{median:.2f} ({rounds}) | {'yes' if ok else 'no'} |"
        )
    print(
        "\n| 2 workers | measured efficiency vs 1 worker (median; rounds) | predicted | "
        "predicted − measured (points) |"
    )
    print("|---|---|---|---|")
    for key, pairs in efficiency.items():
        got = statistics.median(m for m, _ in pairs)
        guess = statistics.median(g for _, g in pairs)
        rounds = " ".join(f"{m:.0%}" for m, _ in pairs)
        print(f"| {key} | {got:.0%} ({rounds}) | {guess:.0%} | {(guess - got) * 100:+.0f} |")
    print(
        "\n| 2 workers, from the measured 1-worker step | predicted / measured (median; rounds) "
        f"| within ±{GOAL:.0%} |"
    )
    print("|---|---|---|")
    for key, values in comm_only.items():
        median = statistics.median(values)
        rounds = " ".join(f"{v:.2f}" for v in values)
        ok = "yes" if abs(median - 1) <= GOAL else "no"
        print(f"| {key} | {median:.2f} ({rounds}) | {ok} |")
    from dlscale.hardware.catalogue import get_hardware
    from dlscale.hardware.links import measured_link
    from dlscale.profiler.collectives import TORCH_DDP, allreduce_s, bucket_allreduce_s
    from dlscale.profiler.target import resolve

    link = measured_link(get_hardware("local").measured["link"])
    workload = resolve(str(SPEC))
    from dlscale.profiler import trace_workload

    grads = trace_workload(workload).trainable_params * 4
    alone_ms = allreduce_s(grads, 2, link, 1, None)[0] * 1e3
    inside_ms = bucket_allreduce_s(grads, 2, link, 1, None, TORCH_DDP)[0] * 1e3
    print(
        f"\nddp 2's all-reduce of {grads:,} bytes over local-gloo ({link.bytes_per_s / 1e9:.2f} "
        f"GB/s, {link.latency_s * 1e6:.0f} µs a hop): {alone_ms:.2f} ms alone, {inside_ms:.2f} ms "
        f"predicted inside training (contention ×{link.contention:.2f}); measured in the training "
        f"steps {statistics.median(comm_measured) * 1e3:.2f} ms"
    )
    local = get_hardware("local")
    from dlscale.profiler.request import ScalingRequest
    from dlscale.profiler.scaling import predict_scaling

    (alone,) = predict_scaling(
        trace_workload(workload), local, ScalingRequest((1,), strategies=("ddp",)), link
    )
    probe = local.measured.get("loop") or {}
    print(
        f"DDP's own work a step: {alone.detail['reducer_s'] * 1e3:.2f} ms predicted, of which "
        f"{local.ddp_fixed_step_s * 1e3:.2f} ms fixed (bench machine: its tiny model "
        f"{probe.get('ddp_probe_step_s', math.nan) * 1e3:.2f} ms under DDP, "
        f"{probe.get('ddp_bare_step_s', math.nan) * 1e3:.2f} ms bare)"
    )
    # The contention bench machine measured (an all-reduce beside a compute burst / alone)
    # against what the training steps show: their all-reduce over the fit's time alone.
    probe = get_hardware("local").measured["link"]
    low, high = probe.get("contention_quartiles", [math.nan, math.nan])
    in_training = [seconds * 1e3 / alone_ms for seconds in comm_measured]
    print(
        f"contention: measured by bench machine ×{link.contention:.2f} (quartiles ×{low:.2f}–"
        f"{high:.2f}); in the training steps ×{statistics.median(in_training):.2f} ("
        + " ".join(f"{ratio:.2f}" for ratio in in_training)
        + ")"
    )
    print(f"goal (every median ratio within ±{GOAL:.0%}): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
