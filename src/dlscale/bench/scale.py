"""`dlscale scale`: the same spec with 1, 2, 4, ... data-parallel workers; throughput, efficiency.

Every run uses the same launcher and the `ddp` strategy (a 1-worker run included, so process
start-up and the loop are the same for all); each worker keeps the spec's batch size, so the global
batch grows with the workers (weak scaling). Scaling efficiency = throughput(N) / (N ×
throughput(1)), or against the smallest count tried when 1 is not among them.
"""

from __future__ import annotations

from dlscale.spec import DdpStrategy, Spec

SCHEMA = "dlscale.bench.scale/1"


def scaled_spec(spec: Spec, workers: int, steps: int | None) -> Spec:
    strategy = spec.strategy if isinstance(spec.strategy, DdpStrategy) else DdpStrategy(name="ddp")
    changes = {"strategy": strategy.model_copy(update={"workers": workers})}
    if steps is not None:
        changes.update(steps=steps, epochs=None)
    return spec.model_copy(update=changes)


def scale_row(workers: int, record: dict, run_dir: str) -> dict:
    """One run's figures for the scaling table."""
    final = record["final"]
    return {
        "workers": workers,
        "global_batch_size": record["plan"]["global_batch_size"],
        "samples_per_s": final["train_samples_per_s"],
        "per_worker_samples_per_s": final["per_worker_samples_per_s"],
        "allreduce_share": record.get("distributed", {}).get("allreduce_share", 0.0),
        "val_accuracy": final["val_accuracy"],
        "run_dir": run_dir,
    }


def scale_result(spec: Spec, spec_path: str, rows: list[dict], steps, cluster: str) -> dict:
    """Efficiency of every row against the first (smallest worker count): T(N) / (N/N0 · T(N0))."""
    base = rows[0]
    for row in rows:
        ideal = base["samples_per_s"] * row["workers"] / base["workers"]
        row["efficiency"] = row["samples_per_s"] / ideal if ideal else 0.0
    return {
        "schema": SCHEMA,
        "spec": spec_path,
        "model": spec.model.name,
        "per_worker_batch_size": spec.batch_size,
        "steps": steps,
        "cluster": cluster,
        "baseline_workers": base["workers"],
        "rows": rows,
    }
