"""`dlscale compare`: one spec trained with several parallel strategies; accuracy against time.

Every run keeps the spec's model, data, batch size per worker, optimizer and seed; only the
strategy changes (and the length, with `--epochs`). `ddp` is synchronous data parallel;
`averaging`, `async` and `downpour` are the parameter-server modes; `pipeline` splits the model
into `--workers` stages; `hybrid` runs `--workers` / 2 replicas of a 2-stage pipeline (the spec's
own pipeline settings are kept where it has them); `tensor` splits layers over `--workers`
devices (its plan and data_parallel kept where the spec has them); `single` is one process.
Each strategy's spec section builds itself at `--workers` (jobspec/strategy.py: `compared`).

Time to accuracy: the target is TARGET_FRACTION (0.95) × the best final validation accuracy among
the runs, and a run's time to it is the `elapsed_s` (seconds since that run's start) of the first
epoch end whose validation accuracy reached it, or None ("not reached").
"""

from __future__ import annotations

from pydantic import TypeAdapter

from dlscale.errors import UserError, once_each
from dlscale.jobspec import STRATEGY_KINDS, Spec, StrategySpec, parse_spec

SCHEMA = "dlscale.bench.compare/1"
# name -> the strategy section it runs, in the spec's order (the ps modes by their own names).
COMPARED = {name: section for kind in STRATEGY_KINDS for name, section in kind.variants().items()}
STRATEGY_CHOICES = tuple(COMPARED)
TARGET_FRACTION = 0.95
TARGET_RULE = "0.95 × the best final validation accuracy (each run's curve's last point)"

_CURVE_KEYS = ("epoch", "elapsed_s", "val_accuracy", "val_loss", "train_loss")


def check_strategy(name: str) -> str:
    """`name` if it is a strategy compare knows; else a one-line UserError listing them."""
    if name not in STRATEGY_CHOICES:
        raise UserError(f"unknown strategy '{name}' (choose from: {', '.join(STRATEGY_CHOICES)})")
    return name


def parse_strategies(text: str) -> list[str]:
    """'ddp, async' -> ['ddp', 'async']: checked, in order; a name given twice is refused (it
    would run once: `--workers 2,2` is refused as well)."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise UserError(
            f"--strategies: give strategy names, e.g. ddp,async (choose from: "
            f"{', '.join(STRATEGY_CHOICES)})"
        )
    try:
        checked = [check_strategy(name) for name in names]
    except UserError as exc:
        raise UserError(f"--strategies: {exc}") from None
    once_each("--strategies", checked)
    return checked


def compare_spec(spec: Spec, strategy_name: str, workers: int, epochs: int | None) -> Spec:
    """The user's spec with strategy `strategy_name` at `workers` workers (and `epochs`, if given).

    The user's own ddp or ps settings (backend, servers, local_steps, n_fetch, ...) are kept when
    the spec already uses that strategy; otherwise the strategy's defaults apply.
    """
    check_strategy(strategy_name)
    if workers < 1:
        raise UserError(f"--workers: {workers} is below the minimum of 1")
    if epochs is not None and epochs < 1:
        raise UserError(f"--epochs: {epochs} is below the minimum of 1")
    raw = spec.model_dump(mode="json", exclude_unset=True)
    raw["strategy"] = COMPARED[strategy_name].compared(workers, spec.strategy, spec.batch_size)
    if epochs is not None:
        raw["epochs"] = epochs
        raw.pop("steps", None)
    return parse_spec(raw, source=f"--strategies {strategy_name}")


def time_to_accuracy(curve: list[dict], target: float | None) -> dict | None:
    """The first epoch end at or above `target`: {'elapsed_s', 'epoch'}; None if none reached it."""
    if target is None:
        return None
    for point in curve:
        accuracy = point.get("val_accuracy")
        if accuracy is not None and accuracy >= target:
            return {"elapsed_s": point["elapsed_s"], "epoch": point["epoch"]}
    return None


def trainers(strategy: dict) -> int:
    """The processes that trained, from a record's strategy section: a pipeline's stages and a
    tensor group's shards as well as data-parallel workers (a ps job's servers train nothing)."""
    return TypeAdapter(StrategySpec).validate_python(strategy).trainers


def compare_row(name: str, record: dict, run_dir: str, total_s: float | None = None) -> dict:
    """One run's figures: final accuracy, wall time, throughput, and its per-epoch curve.

    `wall_s` is the record's own (its main worker's); `total_s`, when the caller measured it
    around the whole run, is the same clock for every strategy: start-up, training and the final
    evaluation. The accuracy shown is the curve's last point, so that the table, the target and
    the plot all read one curve.
    """
    final = record["final"]
    curve = [{key: point.get(key) for key in _CURVE_KEYS} for point in record["epochs"]]
    last = curve[-1] if curve else {"val_accuracy": None, "val_loss": None}
    row = {
        "strategy": name,
        "workers": trainers(record["spec"]["strategy"]),
        "val_accuracy": last["val_accuracy"],
        "val_loss": last["val_loss"],
        "wall_s": final["wall_s"],
        "total_s": total_s if total_s is not None else final["wall_s"],
        "samples_per_s": final["train_samples_per_s"],
        "steps": final["step"],
        "global_batch": (record.get("plan") or {}).get("global_batch_size"),
        "run_dir": run_dir,
        "ps": None,
        "curve": curve,
    }
    if "ps" in record:
        ps = record["ps"]
        row["ps"] = {key: ps[key] for key in ("mode", "updates_per_s", "mean_staleness")}
    return row


def batch_note(rows: list[dict]) -> str | None:
    """A word where the strategies trained different global batches (ddp's workers each a
    batch, a pipeline's stages or a tensor group one between them): their accuracies after the
    same epochs came from different numbers of steps."""
    batches = {row["global_batch"] for row in rows if row.get("global_batch") is not None}
    if len(batches) < 2:
        return None
    named = ", ".join(
        f"{row['strategy']} {row['global_batch']}" for row in rows if row.get("global_batch")
    )
    return (
        f"global batches differ ({named}): the same epochs are a different number of steps, "
        "so accuracy differs by that as well as by strategy"
    )


def compare_result(
    spec: Spec, spec_path: str, rows: list[dict], workers: int, epochs: int | None, cluster: str
) -> dict:
    """The table rows with time to the target accuracy, and every run's curve (for the plot)."""
    finals = [row["val_accuracy"] for row in rows if row["val_accuracy"] is not None]
    best = max(finals) if finals else None
    target = TARGET_FRACTION * best if best is not None else None
    table, curves = [], {}
    for row in rows:
        reached = time_to_accuracy(row["curve"], target)
        table.append(
            {
                **{key: value for key, value in row.items() if key != "curve"},
                "time_to_target_s": reached["elapsed_s"] if reached else None,
                "epochs_to_target": reached["epoch"] if reached else None,
            }
        )
        curves[row["strategy"]] = row["curve"]
    timed = [row for row in table if row["time_to_target_s"] is not None]
    fastest = min(timed, key=lambda row: row["time_to_target_s"])["strategy"] if timed else None
    return {
        "schema": SCHEMA,
        "spec": spec_path,
        "model": spec.model.name,
        "data": spec.data.name,
        "per_worker_batch_size": spec.batch_size,
        "workers": workers,
        "epochs": epochs if epochs is not None else spec.epochs,
        "steps": None if epochs is not None else spec.steps,
        "cluster": cluster,
        "strategies": [row["strategy"] for row in rows],
        "best_val_accuracy": best,
        "target_fraction": TARGET_FRACTION,
        "target_rule": TARGET_RULE,
        "target_accuracy": target,
        "fastest_to_target": fastest,
        "rows": table,
        "curves": curves,
    }
