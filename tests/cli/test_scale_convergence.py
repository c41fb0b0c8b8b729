"""`dlscale scale --lr-scaling / --target-accuracy`: every count trained to the end, its
accuracy, and when it reached the target, beside throughput; the rule and its one-line errors."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlscale.bench.scale import convergence, lr_factor
from dlscale.cli.main import app
from dlscale.jobspec import parse_spec

SPEC = """name: converge
model: {name: mlp, kwargs: {hidden: [32]}}
data: {name: digits}
batch_size: 32
epochs: 3
optimizer: {name: sgd, lr: 0.05}
seed: 0
"""


def test_the_learning_rate_grows_with_the_global_batch_by_the_rule():
    assert lr_factor("none", 4, 1) == 1.0
    assert lr_factor("linear", 4, 1) == 4.0 and lr_factor("linear", 4, 2) == 2.0
    assert lr_factor("sqrt", 4, 1) == pytest.approx(2.0)


def test_convergence_reads_the_first_epoch_at_the_target():
    spec = parse_spec(
        {
            "name": "c",
            "model": {"name": "mlp"},
            "data": {"name": "digits"},
            "batch_size": 16,
            "optimizer": {"name": "sgd", "lr": 0.2},
        }
    )
    epochs = [
        {"epoch": e, "step": 10 * e, "val_accuracy": a, "elapsed_s": 1.5 * e}
        for e, a in ((1, 0.5), (2, 0.91), (3, 0.88), (4, 0.95))
    ]
    record = {"plan": {"global_batch_size": 32}, "epochs": epochs, "final": {"val_accuracy": 0.95}}
    found = convergence(record, spec, 0.9)
    assert (found["epochs_to_target"], found["time_to_target_s"]) == (2, 3.0)
    assert found["samples_to_target"] == 20 * 32 and found["epochs"] == 4
    assert [p["samples"] for p in found["curve"]] == [320, 640, 960, 1280]
    assert convergence(record, spec, 0.99)["epochs_to_target"] is None  # not reached
    assert convergence(record, spec, None)["lr"] == 0.2


def test_scale_returns_a_typed_record_of_the_document_it_writes():
    """`experiments.scale` returns a ScaleResult: scale.json's keys as fields, each row typed
    with its convergence apart, `to_json` the document unchanged; the command's tables read
    it. Two runs built by hand: 100 and 150 samples/s at 1 and 2 workers (efficiency 0.75)."""
    import yaml
    from rich.console import Console

    from dlscale.bench.experiment_records import ScaleResult
    from dlscale.bench.scale import add_predictions, scale_result, scale_row
    from dlscale.cli.scale_view import convergence_table, scale_table

    spec = parse_spec(yaml.safe_load(SPEC))
    rows = []
    for workers, rate in ((1, 100.0), (2, 150.0)):
        epochs = [{"epoch": 1, "step": 4, "val_accuracy": 0.6, "elapsed_s": 2.0}]
        record = {
            "plan": {"global_batch_size": 32 * workers},
            "final": {
                "train_samples_per_s": rate,
                "per_worker_samples_per_s": rate / workers,
                "val_accuracy": 0.6,
            },
            "epochs": epochs,
        }
        row = scale_row(workers, record, f"out/workers-{workers}")
        row.update(convergence(record, spec, 0.5))
        rows.append(row)
    document = scale_result(spec, "spec.yaml", rows, None, "local", 1)
    document.update(lr_scaling="linear", target_accuracy=0.5, convergence=True)
    document = add_predictions(document, None, None)
    typed = ScaleResult.from_json(document)
    assert typed.to_json() == document
    one, two = typed.rows
    assert (one.workers, two.workers) == (1, 2) and two.efficiency == pytest.approx(0.75)
    assert two.convergence.epochs_to_target == 1 and two.convergence.samples_to_target == 256
    assert two.predicted_samples_per_s is None and typed.predicted_on is None
    console = Console(width=200, record=True)
    console.print(scale_table(typed, "local"))
    console.print(convergence_table(typed))
    text = console.export_text()
    assert "75%" in text and "150" in text and "target 50.0%" in text and "256" in text


@pytest.mark.slow
def test_scale_trains_each_count_to_the_end_and_reports_its_convergence(tmp_path: Path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    args = [
        "scale",
        str(spec),
        "--workers",
        "1,2",
        "--lr-scaling",
        "linear",
        "--target-accuracy",
        "0.5",
        "--out",
        str(tmp_path / "out"),
    ]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "convergence: learning rate scaled 'linear', target 50.0%" in result.output
    data = json.loads((tmp_path / "out" / "scale.json").read_text())
    assert data["lr_scaling"] == "linear" and data["target_accuracy"] == 0.5
    one, two = data["rows"]
    assert (one["lr"], two["lr"]) == (0.05, pytest.approx(0.1))  # linear in the global batch
    assert (one["global_batch_size"], two["global_batch_size"]) == (32, 64)
    for row in (one, two):
        assert row["epochs"] == 3 and len(row["curve"]) == 3  # the whole spec, not 50 steps
        run = json.loads(Path(row["run_dir"], "run.json").read_text())
        assert run["spec"]["optimizer"]["lr"] == pytest.approx(row["lr"])
        assert row["final_val_accuracy"] == run["final"]["val_accuracy"]
        assert row["curve"][-1]["samples"] == run["final"]["step"] * row["global_batch_size"]
        reached = [p for p in row["curve"] if p["val_accuracy"] >= 0.5]
        assert row["epochs_to_target"] == (reached[0]["epoch"] if reached else None)
    assert (tmp_path / "out" / "scale.png").stat().st_size > 20_000  # three panels


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--lr-scaling", "cubic"], "--lr-scaling must be one of none, linear, sqrt"),
        (["--target-accuracy", "95"], "--target-accuracy is a fraction in (0, 1]"),
    ],
)
def test_bad_convergence_options_are_one_line(tmp_path: Path, extra, message):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    args = ["scale", str(spec), "--workers", "1", *extra, "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "out").exists()


def test_a_tensor_degree_has_no_global_batch_to_scale_the_rate_for(tmp_path: Path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC + "strategy: {name: tensor, degree: 2}\n")
    args = [
        "scale",
        str(spec),
        "--workers",
        "1,2",
        "--lr-scaling",
        "linear",
        "--out",
        str(tmp_path / "out"),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "does not change the global batch" in result.output


def test_scale_says_when_the_spec_s_strategy_runs_as_ddp_workers():
    """The defect: `scale` of a ps, pipeline or hybrid spec ran ddp workers, its table and
    JSON (`strategy: ddp`, `note: null`) saying nothing of the swap."""
    import yaml

    from dlscale.bench.scale import scale_result

    raw = yaml.safe_load(SPEC)
    rows = [{"workers": 1, "samples_per_s": 100.0}, {"workers": 2, "samples_per_s": 190.0}]
    same = scale_result(parse_spec(raw), "spec.yaml", [dict(r) for r in rows], None, "local", 1)
    assert same["note"] is None
    ps = parse_spec({**raw, "strategy": {"name": "ps", "mode": "async", "workers": 2}})
    swapped = scale_result(ps, "spec.yaml", [dict(r) for r in rows], None, "local", 1)
    assert swapped["strategy"] == "ddp"
    assert "strategy ps runs here as ddp workers" in swapped["note"]


def test_a_count_whose_global_batch_passes_the_data_is_refused_before_any_run(tmp_path):
    """The defect: `scale --workers 1,2,4` of batch 500 on digits (1,437 training samples) ran
    the 1- and 2-worker runs, then refused the 4-worker one, keeping no scale.json, and the
    folder it left refused a rerun."""
    import yaml

    from dlscale.api import experiments
    from dlscale.errors import UserError

    raw = yaml.safe_load(SPEC)
    raw.update(batch_size=500, data={"name": "digits"})
    spec = tmp_path / "big.yaml"
    spec.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    with pytest.raises(UserError, match="larger than the training set"):
        experiments.scale(spec, [1, 2, 4], out, steps=2)
    with pytest.raises(UserError, match="--workers: 2 is given twice"):  # run once, silently
        experiments.scale(spec, [1, 2, 2], out, steps=2)
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("command", ["scale", "compare"])
def test_an_out_holding_earlier_results_is_refused_before_any_run(tmp_path, command):
    """The defect: a user's scale.json / compare.png in --out were replaced without a word
    (a bench's --out holding its results is refused)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "busy"
    out.mkdir()
    (out / f"{command}.png").write_text("mine")
    args = ["--workers", "1", "--steps", "2"] if command == "scale" else ["--strategies", "single"]
    said = CliRunner().invoke(app, [command, str(spec), *args, "--out", str(out)])
    assert said.exit_code == 2 and f"already holds {command}.png" in said.output, said.output
    assert sorted(p.name for p in out.iterdir()) == [f"{command}.png"]
    assert (out / f"{command}.png").read_text() == "mine"


def test_scale_prints_its_document_as_json(tmp_path: Path):
    """The defect: `scale` had no --json (compare, profile and the benches have it): a script had
    to read scale.json from the folder. With it, stdout is scale.json's document, one object;
    the per-count lines and where the files went are on stderr."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "out"
    args = ["scale", str(spec), "--workers", "1", "--steps", "2", "--json", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed == json.loads((out / "scale.json").read_text())
    assert [row["workers"] for row in printed["rows"]] == [1]
    said = " ".join(result.stderr.split())
    assert "1 worker(s):" in said and f"wrote {out / 'scale.json'}" in said, said


def test_an_interrupted_scale_says_what_it_kept_and_how_to_run_again(tmp_path: Path, capsys):
    """The defect: Ctrl-C in `scale`'s second count said only `interrupted`; the first count's
    run stayed in --out with no word, and a rerun into that folder was refused (its run.json).
    The stop now names what finished, where it is, and what a rerun needs."""
    import typer

    from dlscale.api.experiments import train_in_turn
    from dlscale.cli.errors import user_errors

    def done(run_dir: Path) -> dict:
        run_dir.mkdir()
        (run_dir / "run.json").write_text("{}")
        return {"workers": 1}

    def stopped(run_dir: Path) -> dict:
        raise KeyboardInterrupt

    out = tmp_path / "out"

    @user_errors
    def scale() -> None:
        train_in_turn(out, {"workers-1": done, "workers-2": stopped, "workers-4": done}, None)

    with pytest.raises(typer.Exit) as stop:
        scale()
    said = " ".join(capsys.readouterr().err.split())
    assert stop.value.exit_code == 130
    assert said == (
        f"interrupted: after 1 of 3 runs (workers-1), kept in {out} (a rerun into that folder is "
        "refused until it is removed)"
    )
    # Stopped in its first run, whose folder (its run.json, written as it starts) stays.
    started = tmp_path / "started"

    def started_then_stopped(run_dir: Path) -> dict:
        run_dir.mkdir()
        (run_dir / "run.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as first:
        train_in_turn(started, {"workers-1": started_then_stopped, "workers-2": done}, None)
    assert first.value.hint == (
        f"before its first run ended, whose folder stays in {started} (a rerun into that folder "
        "is refused until it is removed)"
    )
