"""Faults that arrive after training started (issue 34, points 4 and 5): a loss that turns NaN
stops the run at once in one line naming the step, the loss and the last good checkpoint, with
the checkpoints before it kept; the user's model failing at some step, or training nothing, is
one line naming the module, the step and the error, with the traceback in the run folder's
log; an error in dlscale's own code keeps its traceback."""

import functools
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dlscale import api
from dlscale.cli.main import app
from dlscale.train import step as step_module
from dlscale.train.checkpoint import checkpoint_path, list_checkpoints

USER_MODELS = """
import torch
from torch import nn


class Flaky(nn.Module):
    \"\"\"Trains, then at its `at`-th training forward raises or returns NaN logits.\"\"\"

    def __init__(self, input_size, num_classes, at=25, how="raise"):
        super().__init__()
        self.linear = nn.Linear(input_size, num_classes)
        self.at, self.how, self.calls = at, how, 0

    def forward(self, x):
        out = self.linear(x.flatten(1))
        if self.training:
            self.calls += 1
            if self.calls >= self.at and self.how == "raise":
                raise KeyError("no such layer")
            if self.calls >= self.at:
                return out * float("nan")
        return out


def flaky(input_size, num_classes, at=25, how="raise"):
    return Flaky(input_size, num_classes, at, how)


class FailsToEvaluate(nn.Module):
    \"\"\"Passes the one-sample check (its first eval-mode forward), fails the evaluation.\"\"\"

    def __init__(self, input_size, num_classes):
        super().__init__()
        self.linear = nn.Linear(input_size, num_classes)
        self.evaluations = 0

    def forward(self, x):
        if not self.training:
            self.evaluations += 1
            if self.evaluations > 1:
                raise ValueError("no validation today")
        return self.linear(x.flatten(1))


def fails_to_evaluate(input_size, num_classes):
    return FailsToEvaluate(input_size, num_classes)


class Detached(nn.Module):
    def __init__(self, input_size, num_classes):
        super().__init__()
        self.linear = nn.Linear(input_size, num_classes)

    def forward(self, x):
        return self.linear(x.flatten(1)).detach()


def detached(input_size, num_classes):
    return Detached(input_size, num_classes)


class Nothing(nn.Module):
    def forward(self, x):
        return x.flatten(1)[:, :10] * 1.0


def nothing():
    return Nothing()
"""

SPEC = """
name: faults
model: {{name: "usermodels:{factory}", kwargs: {kwargs}}}
data: {{name: digits}}
batch_size: {batch}
steps: 40
device: cpu
optimizer: {{name: sgd, lr: 0.1}}
checkpoint: {{every_steps: 10, keep_last: 5}}
{strategy}
"""
DDP = "strategy: {name: ddp, workers: 2}"


@pytest.fixture
def folder(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "usermodels.py").write_text(textwrap.dedent(USER_MODELS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("usermodels", None)


def train(folder: Path, factory: str, kwargs: str = "{}", strategy: str = "") -> tuple:
    spec = folder / "job.yaml"
    batch = 32 if strategy else 64  # the same global batch: 22 steps an epoch either way
    spec.write_text(SPEC.format(factory=factory, kwargs=kwargs, batch=batch, strategy=strategy))
    out = folder / "run"
    result = CliRunner().invoke(app, ["train", str(spec), "--out", str(out)])
    return result, out


def one_line(result) -> str:
    assert "Traceback" not in result.output, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# ------------------------------------------------------------------ 4: NaN and infinities


@pytest.mark.parametrize("strategy", ["", DDP], ids=["single", "ddp"])
def test_a_loss_that_turns_nan_stops_the_run_at_once_keeping_the_checkpoints(folder, strategy):
    result, out = train(folder, "flaky", "{how: nan}", strategy)
    assert result.exit_code == 1, result.output
    line = one_line(result)
    good = checkpoint_path(out, 22)  # every 10 steps, and the epoch's end at 22
    assert line == (
        f"error: training diverged at step 25: the loss is nan; the last good checkpoint is "
        f"step 22 ({good})"
    )
    assert [step for step, _ in list_checkpoints(out)] == [10, 20, 22]
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "failed" and record["error"] == line.removeprefix("error: ")


def test_a_run_that_diverges_before_its_first_checkpoint_says_none_was_saved(folder):
    result, out = train(folder, "flaky", "{how: nan, at: 3}")
    assert result.exit_code == 1, result.output
    assert one_line(result) == (
        "error: training diverged at step 3: the loss is nan; no checkpoint was saved before it"
    )
    assert list_checkpoints(out) == []


# ------------------------------------------------------------------ 5: user code mid-run


@pytest.mark.parametrize("strategy", ["", DDP], ids=["single", "ddp"])
def test_a_model_that_raises_mid_run_is_one_line_with_the_traceback_in_the_log(folder, strategy):
    result, out = train(folder, "flaky", "{at: 25}", strategy)
    assert result.exit_code == 1, result.output
    log = out / "errors.log"
    assert one_line(result) == (
        "error: model 'usermodels:flaky' failed at step 25: KeyError: 'no such layer' "
        f"(usermodels.py, line 19); traceback in {log}"
    )
    logged = log.read_text()
    assert "Traceback (most recent call last)" in logged and "KeyError: 'no such layer'" in logged
    assert [step for step, _ in list_checkpoints(out)] == [10, 20, 22]
    assert json.loads((out / "run.json").read_text())["status"] == "failed"


def test_a_model_that_raises_in_evaluation_is_one_line_naming_the_step(folder):
    result, out = train(folder, "fails_to_evaluate")
    assert result.exit_code == 1, result.output
    assert one_line(result) == (
        "error: model 'usermodels:fails_to_evaluate' failed at step 22 (evaluating): "
        f"ValueError: no validation today (usermodels.py, line 41); traceback in "
        f"{out / 'errors.log'}"
    )
    assert [step for step, _ in list_checkpoints(out)] == [10, 20]


def test_a_model_whose_logits_are_detached_is_one_line(folder):
    result, out = train(folder, "detached")
    assert result.exit_code == 1, result.output
    assert one_line(result) == (
        "error: model 'usermodels:detached' failed at step 1: its loss does not depend on any "
        "trainable parameter (logits detached, or computed without the parameters)"
    )
    assert list_checkpoints(out) == []


@pytest.mark.parametrize("strategy", ["", "strategy: {name: tensor, degree: 2}"])
def test_a_model_without_trainable_parameters_is_refused_before_training(folder, strategy):
    result, out = train(folder, "nothing", strategy=strategy)
    assert result.exit_code == 2, result.output
    assert one_line(result) == (
        "error: model 'usermodels:nothing' has no trainable parameters: nothing to train"
    )
    assert not (out / "run.json").exists()
    validated = CliRunner().invoke(app, ["validate", str(folder / "job.yaml")])
    assert validated.exit_code == 2 and "has no trainable parameters" in validated.stderr


def test_an_error_in_dlscales_own_code_keeps_its_traceback(folder, monkeypatch):
    """Raised in torch, called by dlscale, with no frame of the user's file on the way: not
    the user's, so not one line (a function defined here would count as the user's code)."""
    bad_loss = functools.partial(torch.nn.functional.cross_entropy, reduction="bogus")
    monkeypatch.setattr(step_module, "compute_loss", bad_loss)
    (folder / "job.yaml").write_text(
        SPEC.format(factory="flaky", kwargs="{at: 1000}", batch=64, strategy="")
    )
    with pytest.raises(ValueError, match="bogus is not a valid value for reduction"):
        api.train(folder / "job.yaml", out_dir=folder / "run")
    assert not (folder / "run" / "errors.log").exists()
