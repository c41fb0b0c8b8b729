"""`dlscale scale`: the same spec with 1, 2, 4, ... data-parallel workers; throughput, efficiency.

Every run uses the same launcher and the `ddp` strategy (a 1-worker run included, so process
start-up and the loop are the same for all); each worker keeps the spec's batch size, so the global
batch grows with the workers (weak scaling). A spec whose strategy is `tensor` scales its degree
instead: the same batch split over more devices (strong scaling). Scaling efficiency =
throughput(N) / (N × throughput(1)), or against the smallest count tried when 1 is not among them.

Every run gives each worker the same number of threads: the largest run's share of the cores.
The local launcher would otherwise give a lone worker every core and N workers 1/N of them
each, and the efficiency would compare unlike runs (a 1-worker baseline with 2 threads on a
busy 2-core machine ran 12× slower than 2 workers with 1 thread each: "1230%").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from dlscale.jobspec import Spec

SCHEMA = "dlscale.bench.scale/1"


def scaled_strategy(spec: Spec) -> str:
    """The strategy `scale` runs: its section says (a tensor-parallel spec's degree grows, any
    other runs as ddp's workers)."""
    return spec.strategy.scaled(1).name


def lr_factor(rule: str, workers: int, base_workers: int) -> float:
    """How much the learning rate grows with the global batch (N / N0 workers times larger):
    `linear` with it (Goyal et al., "Accurate, Large Minibatch SGD", 2017), `sqrt` with its
    square root (Krizhevsky, "One weird trick", 2014; Hoffer et al. 2017), `none` not at all."""
    ratio = workers / base_workers
    return {"none": 1.0, "linear": ratio, "sqrt": ratio**0.5}[rule]


def scaled_spec(spec: Spec, workers: int, steps: int | None, lr_factor: float = 1.0) -> Spec:
    changes = {"strategy": spec.strategy.scaled(workers)}
    if lr_factor != 1.0:
        changes["optimizer"] = spec.optimizer.model_copy(
            update={"lr": spec.optimizer.lr * lr_factor}
        )
    if steps is not None:
        changes.update(steps=steps, epochs=None)
    return spec.model_copy(update=changes)


def threads_for(workers: list[int], cores: int) -> int:
    """Threads each worker gets in every run: the largest run's share of the cores."""
    return max(1, cores // max(workers))


@contextlib.contextmanager
def local_cores(count: int, threads: int) -> Iterator[None]:
    """While a run of `count` local workers starts: the cores the launcher counts capped at
    count × threads (DLSCALE_CPUS, which it divides among the workers), so each gets `threads`."""
    saved = os.environ.get("DLSCALE_CPUS")
    os.environ["DLSCALE_CPUS"] = str(count * threads)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("DLSCALE_CPUS", None)
        else:
            os.environ["DLSCALE_CPUS"] = saved


def scale_note(rows: list[dict]) -> str | None:
    """A word on efficiencies above 100%. Each worker trains the baseline's batch with the
    baseline's threads, so it cannot honestly run faster than the baseline's one: above 100%
    is timing noise, such as a machine busier during the baseline run than after it."""
    above = [row for row in rows[1:] if row["efficiency"] > 1.0]
    if not above:
        return None
    counts = ", ".join(str(row["workers"]) for row in above)
    return (
        f"{counts} workers: above 100%, each worker ran faster than the baseline's one with the "
        "same batch and threads: timing noise (the machine was busier during the baseline); "
        "more --steps even it out"
    )


def run_as_note(spec: Spec) -> str | None:
    """A word where the spec's strategy is not the one `scale` runs (ps, pipeline, hybrid:
    ddp's workers, for data parallelism's scaling)."""
    ran, own = scaled_strategy(spec), spec.strategy.name
    if ran == own or own == "single":
        return None
    return (
        f"the spec's strategy {own} runs here as {ran} workers: scale measures data-parallel "
        f"scaling (`dlscale compare` sets {own} beside ddp)"
    )


def scale_row(workers: int, record: dict, run_dir: str) -> dict:
    """One run's figures for the scaling table."""
    final = record["final"]
    return {
        "workers": workers,
        "global_batch_size": record["plan"]["global_batch_size"],
        "samples_per_s": final["train_samples_per_s"],
        "per_worker_samples_per_s": final["per_worker_samples_per_s"],
        "allreduce_share": record.get("distributed", {}).get("allreduce_share")
        or record.get("tensor", {}).get("comm_share", 0.0),
        "val_accuracy": final["val_accuracy"],
        "run_dir": run_dir,
    }


def convergence(record: dict, spec: Spec, target: float | None) -> dict:
    """How a run converged: its learning rate, final accuracy and epochs; the first epoch end
    at or above `target` (its epoch, wall seconds and training samples seen); and its curve of
    validation accuracy against samples seen."""
    batch = record["plan"]["global_batch_size"]
    epochs = record["epochs"]
    curve = [
        {
            "samples": e["step"] * batch,
            "val_accuracy": e["val_accuracy"],
            "epoch": e["epoch"],
            "elapsed_s": e["elapsed_s"],
        }
        for e in epochs
    ]
    reached = None
    if target is not None:
        reached = next((p for p in curve if (p["val_accuracy"] or 0) >= target), None)
    return {
        "lr": spec.optimizer.lr,
        "final_val_accuracy": record["final"]["val_accuracy"],
        "epochs": epochs[-1]["epoch"] if epochs else 0,
        "epochs_to_target": reached["epoch"] if reached else None,
        "time_to_target_s": reached["elapsed_s"] if reached else None,
        "samples_to_target": reached["samples"] if reached else None,
        "curve": curve,
    }


def relative_efficiency(row: dict, base: dict) -> float:
    """T(N) / (N/N₀ · T(N₀)): `row`'s samples/s against `base`'s scaled by their workers."""
    ideal = base["samples_per_s"] * row["workers"] / base["workers"]
    return row["samples_per_s"] / ideal if ideal else 0.0


def scale_result(
    spec: Spec, spec_path: str, rows: list[dict], steps, cluster: str, threads: int
) -> dict:
    """Efficiency of every row against the first (smallest worker count): T(N) / (N/N0 · T(N0))."""
    base = rows[0]
    for row in rows:
        row["efficiency"] = relative_efficiency(row, base)
    return {
        "schema": SCHEMA,
        "spec": spec_path,
        "model": spec.model.name,
        "strategy": scaled_strategy(spec),
        "per_worker_batch_size": spec.batch_size,
        "steps": steps,
        "cluster": cluster,
        "baseline_workers": base["workers"],
        "threads_per_worker": threads,
        "note": "; ".join(n for n in (run_as_note(spec), scale_note(rows)) if n) or None,
        "rows": rows,
    }


def worker_step_s(prediction, calibrated_threads: int, threads: int) -> float:
    """One worker's predicted step when `local` was measured with `calibrated_threads` and the
    worker has `threads`: its ops `calibrated_threads / threads` times slower, the loop's own
    per-step cost (host Python on one core: `prediction.loop_s`) the same."""
    ops_s = prediction.step_s - prediction.loop_s
    return ops_s * calibrated_threads / threads + prediction.loop_s


def predicted_rows(
    spec_path: str, workers: list[int], threads: int, local, link, strategy: str = "ddp"
) -> list[dict]:
    """The roofline on `local` and the scaling model over the measured local link, for the
    same runs: samples/s and efficiency per worker count.

    `local` was calibrated with its measured thread count T; a worker here has `threads` t of
    them, so its compute is taken as T/t times slower (on a machine of T cores, each worker's
    threads are its own cores, and they do not share them with the others)."""
    from dlscale.profiler import trace_workload
    from dlscale.profiler.collectives import Framework
    from dlscale.profiler.request import ScalingRequest
    from dlscale.profiler.roofline import predict
    from dlscale.profiler.scaling import predict_scaling
    from dlscale.profiler.target import resolve
    from dlscale.profiler.tensor_plan import plans_for

    workload = resolve(spec_path)
    trace = trace_workload(workload)
    calibrated = int(local.measured.get("threads") or threads)
    step_s = worker_step_s(predict(trace, local), calibrated, threads)
    plans = (
        plans_for(workload.build, workload.sample, trace.params, workload.precision)
        if strategy == "tensor"
        else None
    )
    request = ScalingRequest(tuple(sorted(set(workers))), strategies=(strategy,))
    points = predict_scaling(
        trace,
        local,
        request,
        link,
        single_step_s=step_s,
        tensor_plans=plans,
        threads_per_device=threads,
    )
    if strategy == "tensor" and 1 in workers:  # one device: the whole model, as measured
        one = ScalingRequest((1,), strategies=("ddp",))
        # DDP's own work left out: one worker of the tensor strategy runs no DDP.
        alone = Framework("one worker, no DDP")
        points = (
            predict_scaling(trace, local, one, link, single_step_s=step_s, framework=alone) + points
        )
    rows = [
        {
            "workers": p.devices,
            "samples_per_s": p.samples_per_s,
            "step_s": p.step_s,
            "comm_s": p.comm_s,
        }
        for p in points
    ]
    # Efficiency as the measured rows have it (scale_result): against the smallest count's, not
    # against one device without the strategy (a ddp worker alone still pays DDP's own work, and
    # so does the measured run it is set beside).
    base = min(rows, key=lambda row: row["workers"])
    return [row | {"efficiency": relative_efficiency(row, base)} for row in rows]


def add_predictions(
    result: dict,
    predicted: list[dict] | None,
    link_name: str | None,
    calibration: dict | None = None,
) -> dict:
    """Predicted beside measured in each row, and their ratio (1.0: exact); `calibration`: the
    measurement of this machine the prediction rests on (hardware/trust.py)."""
    result["predicted_on"] = "local" if predicted else None
    result["calibration"] = calibration if predicted else None
    result["link"] = link_name
    by_workers = {row["workers"]: row for row in predicted or []}
    for row in result["rows"]:
        guess = by_workers.get(row["workers"])
        row["predicted_samples_per_s"] = guess["samples_per_s"] if guess else None
        row["predicted_efficiency"] = guess["efficiency"] if guess else None
        measured = row["samples_per_s"]
        row["predicted_over_measured"] = (
            guess["samples_per_s"] / measured if guess and measured else None
        )
    return result
