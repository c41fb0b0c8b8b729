"""The command line as a person uses it: exit codes, one-line errors, every example spec."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlscale.cli.main import app
from tests.conftest import EXAMPLES

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def write_spec(folder: Path, text: str) -> Path:
    path = folder / "job.yaml"
    path.write_text(text)
    return path


GOOD = "name: t\nmodel: {name: lenet}\ndata: {name: digits, image_size: 28}\nbatch_size: 32\n"


def test_models_lists_the_zoo_with_parameter_counts():
    result = run("models", "--json")
    assert result.exit_code == 0
    rows = {row["name"]: row["parameters"] for row in json.loads(result.stdout)}
    assert rows["lenet"] == 41_282 and rows["resnet50"] == 25_557_032
    assert set(rows) >= {"mlp", "alexnet", "vgg11", "vgg16", "resnet18", "gpt", "lstm"}
    table = run("models")
    assert table.exit_code == 0 and "138,357,544" in table.stdout


def test_validate_accepts_a_good_spec(tmp_path: Path):
    result = run("validate", write_spec(tmp_path, GOOD))
    assert result.exit_code == 0 and "valid" in result.stdout


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("batch_size: -1\n", "batch_size: Input should be greater than 0"),
        ("colour: blue\n", "unknown field 'colour'"),
        ("epochs: many\n", "epochs: Input should be a valid integer"),
        ("model: {name: lenet5}\n", "unknown model 'lenet5'; the zoo has: lenet, mlp"),
        ("model: {name: lenet, kwargs: {width: 3}}\n", "does not take argument 'width'"),
        ("model: {name: 'nosuchpkg.models:build'}\n", "cannot import module 'nosuchpkg.models'"),
        ("data: {name: npz, path: missing.npz}\n", "data.path: file not found"),
        ("data: {name: npz, path: .}\n", "is a folder, not a file"),
        (
            "strategy: {name: tensor, plan: {conv1: diagonal}}\n",
            "strategy.plan: 'diagonal' (conv1) is not a split style (choose from: colwise, ",
        ),
        (
            "device: cpu\nstrategy: {name: ddp, workers: 2, backend: nccl}\n",
            "strategy.backend nccl connects CUDA GPUs only (device is cpu)",
        ),
        (
            "device: cpu\nstrategy: {name: tensor, backend: nccl}\n",
            "strategy.backend nccl connects CUDA GPUs only (device is cpu)",
        ),
        (
            "strategy: {name: tensor, plan: megatron}\n",
            "strategy.plan: 'auto', or a mapping of module name: split style (got 'megatron')",
        ),
        ("data: {name: npz, path: /dev/null}\n", "/dev/null is not a regular file"),
    ],
)
def test_validate_rejects_bad_specs_with_one_line_and_exit_2(tmp_path, change, expected):
    lines = [line for line in GOOD.splitlines(keepends=True) if not line.startswith(change[:5])]
    result = run("validate", write_spec(tmp_path, "".join(lines) + change))
    assert result.exit_code == 2
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_missing_spec_file_is_a_usage_error(tmp_path: Path):
    result = run("train", tmp_path / "absent.yaml")
    assert result.exit_code == 2 and "spec file not found" in result.stderr


@pytest.mark.parametrize(
    ("path", "expected"),
    [("folder", "is a folder, not a spec file"), ("/dev/null", "is not a regular file")],
)
def test_a_spec_path_that_is_no_file_says_what_it_is(tmp_path: Path, path: str, expected: str):
    """A folder or a device given as the spec is named for what it is, not 'not found'."""
    (tmp_path / "folder").mkdir()
    target = tmp_path / path if path == "folder" else Path(path)
    for command in ("train", "validate"):
        result = run(command, target)
        assert result.exit_code == 2 and expected in result.stderr, result.output
        assert "not found" not in result.stderr


def test_impossible_shape_is_one_line_before_training(tmp_path: Path):
    spec = GOOD.replace("image_size: 28", "image_size: 8")  # LeNet needs 28×28
    result = run("train", write_spec(tmp_path, spec), "--out", tmp_path / "run")
    assert result.exit_code == 2
    assert "model 'lenet' cannot take this data's samples of shape (1, 8, 8)" in result.stderr


def test_fp16_on_cpu_is_refused(tmp_path: Path):
    spec = GOOD + "precision: fp16\ndevice: cpu\n"
    result = run("train", write_spec(tmp_path, spec), "--out", tmp_path / "run")
    assert result.exit_code == 2 and "fp16 needs a CUDA GPU" in result.stderr


def test_resume_without_checkpoint_and_rerun_into_a_used_folder(tmp_path: Path):
    spec = write_spec(tmp_path, GOOD + "steps: 3\n")
    result = run("train", spec, "--out", tmp_path / "empty", "--resume")
    assert result.exit_code == 2 and "nothing to resume" in result.stderr
    assert run("train", spec, "--out", tmp_path / "run").exit_code == 0
    again = run("train", spec, "--out", tmp_path / "run")
    assert again.exit_code == 2 and "pass --resume" in again.stderr


@pytest.mark.heavy
def test_lenet_digits_example_reaches_95_percent(tmp_path: Path):
    """The demo job, end to end through the CLI: progress, summary, run.json, checkpoints."""
    result = run("train", EXAMPLES / "lenet-digits.yaml", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert "validation accuracy" in result.stdout and "samples/s" in result.stdout
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["status"] == "completed" and record["final"]["val_accuracy"] >= 0.95
    assert len(record["epochs"]) == 20 and record["final"]["step"] == 20 * 44
    assert record["final"]["peak_memory_bytes"] > 0 and record["final"]["wall_s"] > 0
    assert len(list((tmp_path / "checkpoints").glob("step-*.pt"))) == 2


@pytest.mark.parametrize(
    ("example", "minimum_accuracy"),
    # The GPT's ceiling is ~46%: each token of its Markov chain has two likely successors.
    [("mlp-digits.yaml", 0.93), ("gpt-synthetic.yaml", 0.40)],
)
def test_other_examples_train(tmp_path: Path, example: str, minimum_accuracy: float):
    result = run("train", EXAMPLES / example, "--out", tmp_path)
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["final"]["val_accuracy"] >= minimum_accuracy
    # The wall time is the trainer's: it says so (the command's start-up is not in it).
    said = " ".join(result.stdout.split())
    assert f"{record['final']['wall_s']:.1f} s in the trainer, from its setup" in said


def test_every_example_spec_validates():
    examples = sorted(EXAMPLES.glob("*.yaml"))
    assert len(examples) >= 3
    for spec in examples:
        assert run("validate", spec).exit_code == 0, spec


def test_console_script_is_installed():
    dlscale = Path(sys.executable).parent / "dlscale"
    done = subprocess.run([dlscale, "--version"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.startswith("dlscale ")


SWEEP = GOOD + "sweep:\n  grid:\n    optimizer.lr: [0.01, 0.1]\n"


@pytest.mark.parametrize(
    ("text", "args", "expected"),
    [
        (GOOD, (), "no sweep section to run"),
        (
            GOOD + "sweep:\n  grid:\n    optimizer.lrr: [0.1]\n",
            (),
            "sweep trial optimizer.lrr=0.1: unknown field 'optimizer.lrr'",
        ),
        (GOOD + "sweep:\n  kfold: 3\n  ensemble: 2\n", (), "kfold or ensemble, not both"),
        (SWEEP, ("--parallel", "0"), "--parallel must be at least 1"),
        (
            GOOD + "sweep:\n  random:\n    trials: 2\n    space:\n"
            "      optimizer.lr: {normal: [0, 0.1]}\n",
            (),
            "(allowed here: log_uniform, uniform, int, choice)",  # the keys a spec writes
        ),
        (SWEEP, ("--resume", "--out", "{tmp}/none"), "nothing to resume"),
    ],
)
def test_sweep_refuses_bad_input_in_one_line(tmp_path: Path, text: str, args, expected: str):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = run("sweep", write_spec(tmp_path, text), *args)
    assert result.exit_code == 2, result.output
    assert expected in result.output and "Traceback" not in result.output


def test_sweep_will_not_write_over_another_sweep(tmp_path: Path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "sweep.json").write_text('{"spec_hash": "x"}')
    spec = write_spec(tmp_path, SWEEP)
    result = run("sweep", spec, "--out", tmp_path / "out")
    assert result.exit_code == 2 and "already holds a sweep: pass --resume" in result.output
    result = run("sweep", spec, "--out", tmp_path / "out", "--resume")
    assert result.exit_code == 2 and "holds a sweep of a different spec" in result.output


def test_sweep_will_not_write_into_a_folder_of_other_files(tmp_path: Path):
    """The defect: a folder holding a user's results.csv and best.yaml had both replaced."""
    out = tmp_path / "userstuff"
    out.mkdir()
    (out / "results.csv").write_text("important\n")
    result = run("sweep", write_spec(tmp_path, SWEEP), "--out", out)
    assert result.exit_code == 2, result.output
    assert f"{out} holds files and no sweep" in " ".join(result.stderr.split())
    assert sorted(p.name for p in out.iterdir()) == ["results.csv"]
    assert (out / "results.csv").read_text() == "important\n"


@pytest.mark.parametrize(
    ("broken", "content"),
    [("sweep.json", '{"broken'), ("sweep.json", ""), ("trials/t000/trial.json", "garbage")],
)
def test_a_sweep_resumed_from_a_corrupt_file_says_which_in_one_line(
    tmp_path: Path, broken: str, content: str
):
    """The defect: a torn sweep.json or trial.json made --resume a JSONDecodeError traceback."""
    spec = write_spec(tmp_path, SWEEP)
    out = tmp_path / "out"
    (out / "trials" / "t000").mkdir(parents=True)
    from dlscale.jobspec import load_spec

    state = {"spec_hash": load_spec(spec).spec_hash(), "spec": str(spec), "started_at": "x"}
    (out / "sweep.json").write_text(json.dumps(state))
    (out / broken).write_text(content)
    result = run("sweep", spec, "--out", out, "--resume")
    assert result.exit_code == 2, result.output
    assert f"{out / broken}: not readable as JSON" in " ".join(result.stderr.split())
    assert "Traceback" not in result.output


@pytest.mark.parametrize("kept", ["run.json", "errors.log"])
def test_an_out_folder_holding_a_runs_record_is_refused_and_kept(tmp_path: Path, kept: str):
    """The defect: only checkpoints were guarded; a failed run's record and errors.log, or a
    user's own run.json, were replaced by the next run into the folder without a word."""
    out = tmp_path / "run"
    out.mkdir()
    (out / kept).write_text('{"mine": 1}')
    spec = write_spec(tmp_path, GOOD + "steps: 1\ndevice: cpu\n")
    result = run("train", spec, "--out", out)
    assert result.exit_code == 2, result.output
    assert f"{out} already holds a run's {kept}" in " ".join(result.stderr.split())
    assert (out / kept).read_text() == '{"mine": 1}'
    assert sorted(p.name for p in out.iterdir()) == [kept]
