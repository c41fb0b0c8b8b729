"""`dlscale compare`: one spec under several strategies; time to a shared target accuracy."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dlscale.api import experiments
from dlscale.bench.compare import (
    compare_result,
    compare_row,
    compare_spec,
    parse_strategies,
    time_to_accuracy,
)
from dlscale.bench.experiment_records import CompareResult, CompareRow
from dlscale.bench.output import write_outputs
from dlscale.cli.main import app
from dlscale.errors import UserError
from dlscale.jobspec import DdpStrategy, PsStrategy, SingleStrategy, parse_spec
from tests.small_runs import SGD, base_spec, synthetic_images

BASE = base_spec(
    "compare-tiny",
    synthetic_images(400),
    batch_size=16,
    epochs=5,
    optimizer=SGD,
    device="cpu",
    seed=0,
)


def write_spec(folder: Path, **changes) -> Path:
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump({**BASE, **changes}))
    return path


# ------------------------------------------------------------------------- compare_spec


@pytest.mark.parametrize("mode", ["averaging", "async", "downpour"])
def test_each_ps_mode_becomes_a_ps_strategy(mode: str):
    spec = compare_spec(parse_spec(BASE), mode, 3, None)
    assert isinstance(spec.strategy, PsStrategy)
    assert spec.strategy.mode == mode and spec.strategy.workers == 3
    assert spec.strategy.servers == 1  # the defaults: the spec was not ps
    assert spec.epochs == 5 and spec.batch_size == 16 and spec.optimizer.name == "sgd"


def test_ddp_and_single():
    ddp = compare_spec(parse_spec(BASE), "ddp", 4, 2)
    assert isinstance(ddp.strategy, DdpStrategy) and ddp.strategy.workers == 4
    assert ddp.epochs == 2
    single = compare_spec(parse_spec(BASE), "single", 4, None)
    assert isinstance(single.strategy, SingleStrategy)


def test_the_users_ps_settings_are_kept_where_the_mode_uses_them():
    given = {"name": "ps", "mode": "downpour", "servers": 2, "n_fetch": 3, "n_push": 2}
    spec = parse_spec({**BASE, "strategy": given})
    downpour = compare_spec(spec, "downpour", 2, None).strategy
    assert (downpour.servers, downpour.n_fetch, downpour.n_push) == (2, 3, 2)
    averaging = compare_spec(spec, "averaging", 2, None)
    assert averaging.strategy.mode == "averaging" and averaging.strategy.servers == 2
    assert averaging.warnings() == []  # n_fetch/n_push are not carried where they would be ignored
    ddp_spec = parse_spec({**BASE, "strategy": {"name": "ddp", "timeout_s": 9}})
    ddp = compare_spec(ddp_spec, "ddp", 2, 1)
    assert ddp.strategy.timeout_s == 9 and ddp.strategy.workers == 2


def test_epochs_replace_a_steps_length():
    spec = parse_spec({**{k: v for k, v in BASE.items() if k != "epochs"}, "steps": 30})
    assert compare_spec(spec, "async", 2, 3).steps is None
    assert compare_spec(spec, "async", 2, 3).epochs == 3
    assert compare_spec(spec, "async", 2, None).steps == 30


def test_pipeline_and_hybrid_take_the_workers_as_processes():
    pipeline = compare_spec(parse_spec(BASE), "pipeline", 3, None).strategy
    assert (pipeline.name, pipeline.stages, pipeline.microbatches) == ("pipeline", 3, 4)
    hybrid = compare_spec(parse_spec(BASE), "hybrid", 4, None).strategy
    assert (hybrid.name, hybrid.stages, hybrid.data_parallel) == ("hybrid", 2, 2)
    own = parse_spec(
        {
            **BASE,
            "batch_size": 6,
            "strategy": {"name": "pipeline", "stages": 3, "schedule": "1f1b", "microbatches": 3},
        }
    )
    kept = compare_spec(own, "hybrid", 6, None).strategy
    assert (kept.stages, kept.data_parallel, kept.schedule, kept.microbatches) == (3, 2, "1f1b", 3)
    assert (
        compare_spec(
            parse_spec({**BASE, "batch_size": 6}), "pipeline", 2, None
        ).strategy.microbatches
        == 2
    )
    with pytest.raises(UserError, match="--workers 3: hybrid runs replicas of a 2-stage pipeline"):
        compare_spec(parse_spec(BASE), "hybrid", 3, None)


def test_unknown_strategy_and_bad_counts_are_one_line_errors():
    spec = parse_spec(BASE)
    with pytest.raises(UserError, match=r"unknown strategy 'hogwild' \(choose from: single, ddp"):
        compare_spec(spec, "hogwild", 2, None)
    with pytest.raises(UserError, match="--workers: 0 is below the minimum of 1"):
        compare_spec(spec, "ddp", 0, None)
    # Every strategy runs the one loop, so every precision and device reaches every one.
    assert compare_spec(parse_spec({**BASE, "precision": "bf16"}), "async", 2, None).precision == (
        "bf16"
    )
    assert parse_strategies(" ddp, async ") == ["ddp", "async"]
    # A strategy named twice was run once without a word (as --workers 2,2 is refused, so is it)
    with pytest.raises(UserError, match="--strategies: ddp is given twice"):
        parse_strategies("ddp,async,ddp")
    with pytest.raises(UserError, match="--strategies: unknown strategy 'ps'") as caught:
        parse_strategies("ddp,ps")
    assert "\n" not in str(caught.value)


# --------------------------------------------------------------------- time to accuracy


def record(accuracies: list[float], wall_s: float, ps: bool = False) -> dict:
    """A run record with one epoch end every 2 s at the given validation accuracies."""
    epochs = [
        {
            "epoch": i + 1,
            "step": 10 * (i + 1),
            "train_loss": 2.0 - 0.1 * i,
            "val_loss": 1.5 - 0.1 * i,
            "val_accuracy": accuracy,
            "samples_per_s": 100.0,
            "elapsed_s": 2.0 * (i + 1),
        }
        for i, accuracy in enumerate(accuracies)
    ]
    made = {
        "spec": {"strategy": {"name": "ps" if ps else "ddp", "workers": 2}},
        "epochs": epochs,
        "final": {
            "step": 10 * len(epochs),
            "val_accuracy": accuracies[-1],
            "val_loss": epochs[-1]["val_loss"],
            "wall_s": wall_s,
            "train_samples_per_s": 500.0,
        },
    }
    if ps:
        made["ps"] = {"mode": "async", "updates_per_s": 40.0, "mean_staleness": 0.5}
    return made


def test_time_to_accuracy_is_the_first_epoch_end_at_or_above_the_target():
    curve = record([0.5, 0.8, 0.7, 0.9], 9.0)["epochs"]
    assert time_to_accuracy(curve, 0.8) == {"elapsed_s": 4.0, "epoch": 2}
    assert time_to_accuracy(curve, 0.85) == {"elapsed_s": 8.0, "epoch": 4}
    assert time_to_accuracy(curve, 0.95) is None
    assert time_to_accuracy(curve, None) is None


def test_target_is_95_percent_of_the_best_final_accuracy():
    rows = [
        compare_row("ddp", record([0.6, 0.85, 0.9, 1.0], 9.0), "out/ddp"),
        compare_row("async", record([0.7, 0.96], 5.0, ps=True), "out/async"),
        compare_row("averaging", record([0.3, 0.5], 5.0, ps=True), "out/averaging"),
    ]
    assert rows[1]["ps"] == {"mode": "async", "updates_per_s": 40.0, "mean_staleness": 0.5}
    result = compare_result(parse_spec(BASE), "spec.yaml", rows, 2, 4, "local")
    assert result["best_val_accuracy"] == 1.0
    assert result["target_accuracy"] == pytest.approx(0.95)
    assert "0.95 × the best final" in result["target_rule"]
    by_name = {row["strategy"]: row for row in result["rows"]}
    assert by_name["ddp"]["time_to_target_s"] == 8.0 and by_name["ddp"]["epochs_to_target"] == 4
    assert by_name["async"]["time_to_target_s"] == 4.0
    assert by_name["averaging"]["time_to_target_s"] is None
    assert result["fastest_to_target"] == "async"
    assert "curve" not in by_name["ddp"]
    assert [p["val_accuracy"] for p in result["curves"]["async"]] == [0.7, 0.96]
    assert set(result["curves"]["ddp"][0]) == {
        "epoch",
        "elapsed_s",
        "val_accuracy",
        "val_loss",
        "train_loss",
    }


def test_the_target_and_the_table_come_from_the_curves_the_plot_draws():
    """The defect: a ps run's final accuracy (then measured on a model assembled after its last
    epoch end) set the target, while its time to target was read from worker 0's curve, so
    every row said 'not reached' while the plot showed the curves crossing the target."""
    assembled = record([0.7, 0.9], 5.0, ps=True)
    assembled["final"]["val_accuracy"] = 0.99  # not a point of its curve
    rows = [
        compare_row("async", assembled, "out/async"),
        compare_row("ddp", record([0.6, 0.88], 9.0), "out/ddp"),
    ]
    result = compare_result(parse_spec(BASE), "spec.yaml", rows, 2, 2, "local")
    for row in result["rows"]:
        assert row["val_accuracy"] == result["curves"][row["strategy"]][-1]["val_accuracy"]
    assert result["best_val_accuracy"] == 0.9
    assert result["fastest_to_target"] is not None  # the best run reaches its own 95%


def test_the_typed_record_is_the_document_written():
    """`experiments.compare` returns a CompareResult: its fields are compare.json's keys, its
    rows typed, and `to_json` gives the document back unchanged."""
    rows = [
        compare_row("ddp", record([0.6, 0.9], 5.0), "ddp"),
        compare_row("async", record([0.5, 0.7], 4.0, ps=True), "async"),
    ]
    document = compare_result(parse_spec(BASE), "spec.yaml", rows, 2, 2, "local")
    typed = CompareResult.from_json(document)
    assert typed.to_json() == document and set(asdict(typed)) == set(document)
    assert [row.strategy for row in typed.rows] == ["ddp", "async"]
    assert typed.rows[1].ps == {"mode": "async", "updates_per_s": 40.0, "mean_staleness": 0.5}
    assert typed.rows[0].val_accuracy == 0.9
    assert typed.fastest_to_target == document["fastest_to_target"]


def test_the_plot_draws_four_panels(tmp_path: Path):
    rows = [
        compare_row("ddp", record([0.6, 0.9], 5.0), "ddp"),
        compare_row("async", record([0.5, 0.7], 4.0, ps=True), "async"),
    ]
    result = compare_result(parse_spec(BASE), "spec.yaml", rows, 2, 2, "local")
    json_path, png_path = write_outputs("compare", result, tmp_path)
    assert json.loads(json_path.read_text())["strategies"] == ["ddp", "async"]
    assert png_path.stat().st_size > 10_000


# --------------------------------------------------------------------------------- CLI


def test_cli_table_and_json_from_a_result(tmp_path: Path, monkeypatch):
    rows = [
        compare_row("ddp", record([0.6, 0.9], 5.0), str(tmp_path / "ddp")),
        compare_row("async", record([0.5, 0.7], 4.0, ps=True), str(tmp_path / "async")),
    ]
    result = compare_result(parse_spec(BASE), "spec.yaml", rows, 2, 2, "local")
    calls = []

    def fake_compare(spec, strategies, workers, out, epochs, cluster, address, on_run):
        calls.append((strategies, workers, epochs))
        for row in rows:
            on_run(row)
        return CompareResult.from_json(result)

    monkeypatch.setattr(experiments, "compare", fake_compare)
    args = ["compare", "spec.yaml", "--strategies", "ddp,async", "--epochs", "2"]
    shown = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "table")])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    assert "ddp" in text and "async" in text and "not reached" in text
    assert "90.0%" in text and "target accuracy 85.5%" in text
    assert (tmp_path / "table" / "compare.png").exists()
    printed = CliRunner().invoke(app, [*args, "--json", "--out", str(tmp_path / "json")])
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.stdout)["strategies"] == ["ddp", "async"]
    assert calls == [(["ddp", "async"], 2, 2)] * 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategies", "ddp,hogwild"], "unknown strategy 'hogwild'"),
        (["--workers", "0"], "--workers: 0 is below the minimum of 1"),
        (["--epochs", "0"], "--epochs: 0 is below the minimum of 1"),
    ],
)
def test_cli_bad_options_are_one_line_exit_2(tmp_path: Path, args: list[str], message: str):
    spec = write_spec(tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["compare", str(spec), *args, "--out", str(out)])
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_cli_missing_spec_is_one_line_exit_2(tmp_path: Path):
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "spec file not found" in result.stderr


@pytest.mark.slow
def test_compare_ddp_and_async_end_to_end(tmp_path: Path):
    spec = write_spec(tmp_path)
    out = tmp_path / "out"
    args = ["compare", str(spec), "--strategies", "ddp,async", "--workers", "2", "--epochs", "2"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "ddp" in text and "async" in text and "target accuracy" in text
    data = json.loads((out / "compare.json").read_text())
    assert data["strategies"] == ["ddp", "async"]
    assert [row["workers"] for row in data["rows"]] == [2, 2]
    assert [len(data["curves"][name]) for name in ("ddp", "async")] == [2, 2]
    assert data["rows"][1]["ps"]["mode"] == "async" and data["rows"][0]["ps"] is None
    best = max(row["val_accuracy"] for row in data["rows"])
    assert data["target_accuracy"] == pytest.approx(0.95 * best)
    assert (out / "compare.png").stat().st_size > 10_000
    assert (out / "ddp" / "run.json").exists() and (out / "async" / "run.json").exists()


def test_rows_carry_their_global_batch_and_a_note_says_when_they_differ():
    """The defect: ddp trained a global batch of 64 beside pipeline, hybrid and tensor at 32,
    the table showing neither batch nor steps, so the accuracies read as the strategies'."""
    from dlscale.bench.compare import batch_note

    ddp = {**record([0.7, 0.8], 5.0), "plan": {"global_batch_size": 64}}
    pipeline = {**record([0.8, 0.9], 5.0), "plan": {"global_batch_size": 32}}
    rows = [compare_row("ddp", ddp, "ddp"), compare_row("pipeline", pipeline, "pipeline")]
    assert [row["global_batch"] for row in rows] == [64, 32]
    note = batch_note(rows)
    assert "global batches differ" in note and "ddp 64" in note and "pipeline 32" in note
    assert batch_note([rows[0], compare_row("async", ddp, "async")]) is None
    assert CompareRow.from_json({**rows[0], "time_to_target_s": None, "epochs_to_target": None})


@pytest.mark.parametrize(
    ("strategies", "warmed"), [(["averaging", "ddp"], True), (["single"], False)]
)
def test_the_workers_start_up_is_paid_before_the_first_timed_run(
    tmp_path: Path, monkeypatch, strategies, warmed
):
    """The defect: compare's wall column charged the first strategy the fork server's imports
    (ddp 4.1 s first, 0.2 s second, in either order): the server is made ready once the folder
    is held and checked, before the first run is timed, where any strategy forks workers; a
    run in this process forks none."""
    from dlscale.launch import start

    seen: list[str] = []
    monkeypatch.setattr(start, "warmed_up", lambda: seen.append("warmed up"))
    real_turns = experiments.train_in_turn

    def turns(out, runs, on_run, ready=None):
        def first(run_dir: Path) -> dict:
            seen.append("run")
            raise KeyboardInterrupt  # enough: the order is known

        return real_turns(out, dict.fromkeys(runs, first), on_run, ready)

    monkeypatch.setattr(experiments, "train_in_turn", turns)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(BASE))
    with pytest.raises(KeyboardInterrupt):
        experiments.compare(spec, strategies, 2, tmp_path / "out")
    assert seen == (["warmed up", "run"] if warmed else ["run"])
    # A folder holding an earlier run is refused before the wait, not after it
    seen.clear()
    (tmp_path / "held" / strategies[0]).mkdir(parents=True)
    (tmp_path / "held" / strategies[0] / "run.json").write_text("{}")
    with pytest.raises(UserError, match=r"already holds a run's run\.json"):
        experiments.compare(spec, strategies, 2, tmp_path / "held")
    assert seen == []


def test_a_repeated_strategy_is_refused_by_the_api_too(tmp_path: Path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(BASE))
    with pytest.raises(UserError, match="--strategies: ddp is given twice"):
        experiments.compare(spec, ["ddp", "async", "ddp"], 2, tmp_path / "out")
    assert not (tmp_path / "out").exists()
