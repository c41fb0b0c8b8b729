"""What a run prints, read as a person reads it (issue 17, point 17): the run's length, whole
paths in the summary, labels that say what the numbers are, help without type labels on flags,
and scaling efficiency measured like for like. (No warnings for settings a spec never made:
tests/strategies/test_record.py, for every strategy.)"""

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from dlscale import api
from dlscale.api.experiments import scale
from dlscale.bench.scale import scale_note
from dlscale.cli.main import app
from dlscale.cli.progress import RichReporter, ps_rows, summary_table
from dlscale.jobspec import parse_spec

runner = CliRunner()


def rendered(renderable, width: int = 80) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, highlight=False)
    console.print(renderable)
    return console.file.getvalue()


def start_line(**plan_changes) -> str:
    plan = {
        "name": "t",
        "model": "mlp",
        "parameters": 1000,
        "device": "cpu",
        "precision": "fp32",
        "train_samples": 1632,
        "val_samples": 165,
        "start_step": 0,
        "workers": 1,
        "strategy": "single",
        "steps_per_epoch": 51,
        "total_steps": 153,
        "epochs": 3,
        "batch_size": 32,
        "global_batch_size": 32,
        **plan_changes,
    }
    console = Console(file=io.StringIO(), width=400, color_system=None)
    reporter = RichReporter(console)
    reporter.start(plan)
    reporter.close()
    return console.file.getvalue().splitlines()[0]


def test_the_start_line_says_when_the_spec_caps_the_steps():
    assert "51 steps × 3 epochs = 153 steps" in start_line()
    assert "51 steps × 1 epoch = 51 steps" in start_line(total_steps=51, epochs=1)
    capped = start_line(total_steps=20, epochs=1)
    assert "20 steps (capped by the spec's steps; 51 per epoch)" in capped
    assert "×" not in capped
    over = start_line(total_steps=120, epochs=3)
    assert "120 steps over 3 epochs (capped by the spec's steps; 51 per epoch)" in over


def test_the_start_line_names_accumulated_micro_batches():
    line = start_line(batch_size=16, global_batch_size=64, accumulate=4)
    assert "batch 64 (4 accumulated micro-batches of 16 a step), 51 steps" in line
    assert "accumulated" not in start_line()


def test_the_summary_never_cuts_a_path(tmp_path: Path):
    out = tmp_path / ("a-folder-with-a-long-name-" * 4) / "run"
    spec = parse_spec(
        {
            "name": "t",
            "model": {"name": "mlp", "kwargs": {"hidden": [8]}},
            "data": {"name": "digits"},
            "batch_size": 32,
            "steps": 2,
            "device": "cpu",
        }
    )
    record = api.train(spec, out_dir=out)
    text = rendered(summary_table(record.to_json()), width=80)  # what the reporter is given
    assert "…" not in text
    joined = "".join(text.replace("│", " ").split())  # a folded path continues on the next line
    assert record.checkpoints[-1] in joined and f"{out}/run.json" in joined


def test_the_ps_summary_names_each_worker_with_its_wait():
    ps = {
        "mode": "async",
        "workers": 2,
        "servers": 1,
        "updates": 40,
        "updates_per_s": 10.0,
        "bytes_per_s": 1e6,
        "data_plane": "shared memory",
        "mean_staleness": 0.5,
        "max_staleness": 1,
        "per_server": [{"shard": 0, "elements": 100, "updates": 40}],
        "dropped_workers": [],
    }
    workers = [
        {"status": "completed", "rank": 0, "comm_wait_share": 0.123},
        {"status": "completed", "rank": 1, "comm_wait_share": 0.2},
    ]
    table = Table(show_header=False)
    table.add_column("what")
    table.add_column("value")
    ps_rows(table, {"ps": ps, "workers": workers})
    text = " ".join(rendered(table, width=200).split())
    assert "pull, push, average" not in text
    assert "worker 0 12.3%, worker 1 20.0% of its step time, waiting on pull and push" in text


def test_help_shows_no_type_label_on_flags():
    for command in ([], ["train"], ["profile"], ["bench", "machine"], ["hardware", "show"]):
        result = runner.invoke(app, [*command, "--help"], terminal_width=200)
        assert result.exit_code == 0, result.output
        assert "<bool>" not in result.stdout and "<list[Path]>" not in result.stdout, command
    assert "--resume" in runner.invoke(app, ["train", "--help"], terminal_width=200).stdout
    assert "<int>" in runner.invoke(app, ["scale", "--help"], terminal_width=200).stdout


def test_scale_comments_efficiency_above_100_percent():
    rows = [{"workers": 1, "efficiency": 1.0}, {"workers": 2, "efficiency": 0.8}]
    assert scale_note(rows) is None
    rows.append({"workers": 4, "efficiency": 1.31})
    note = scale_note(rows)
    assert note.startswith("4 workers: above 100%") and "noise" in note


@pytest.mark.slow
def test_scale_gives_every_worker_the_same_threads(tmp_path: Path):
    """The 1-worker baseline once took every core while N workers shared them: its efficiency
    then compared unlike runs (3929% on a busy machine)."""
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: t\nmodel: {name: mlp, kwargs: {hidden: [8]}}\ndata: {name: digits}\n"
        "batch_size: 16\ndevice: cpu\n"
    )
    result = scale(spec, [1, 2], tmp_path / "scale", steps=4)
    threads = [
        json.loads((Path(row.run_dir) / "run.json").read_text())["environment"]["torch_threads"]
        for row in result.rows
    ]
    assert threads[0] == threads[1] == result.threads_per_worker
