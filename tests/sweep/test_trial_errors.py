"""A sweep trial whose user model fails mid-training (issue 34, point 5): one line naming the
trial, the module, the step and the error; the traceback in that trial's own log, not on the
terminal; the other trials go on."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

DLSCALE = Path(sys.executable).parent / "dlscale"

USER_MODELS = """
from torch import nn


class Flaky(nn.Module):
    def __init__(self, input_size, num_classes):
        super().__init__()
        self.linear = nn.Linear(input_size, num_classes)
        self.calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == 5:
                raise KeyError("no such layer")
        return self.linear(x.flatten(1))


def flaky(input_size, num_classes):
    return Flaky(input_size, num_classes)
"""


@pytest.mark.slow
@pytest.mark.heavy
def test_a_trial_whose_model_fails_mid_run_is_one_line_with_its_traceback_logged(tmp_path):
    (tmp_path / "usermodels.py").write_text(textwrap.dedent(USER_MODELS))
    spec = {
        "name": "sw",
        "model": {"name": "mlp"},
        "data": {"name": "digits"},
        "batch_size": 64,
        "steps": 8,
        "device": "cpu",
        "sweep": {"grid": {"model.name": ["mlp", "usermodels:flaky"]}},
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    done = subprocess.run(
        [str(DLSCALE), "sweep", "sweep.yaml", "--out", str(out), "--parallel", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "Traceback" not in said, said
    log = out / "trials" / "t001" / "train" / "errors.log"
    error = (
        "model 'usermodels:flaky' failed at step 5: KeyError: 'no such layer' "
        f"(usermodels.py, line 15); traceback in {log}"
    )
    flat = "".join(said.split())  # as printed, wrapped at the terminal's width
    line = f"t001 model.name=usermodels:flaky: failed (train: {error})"
    assert "".join(line.split()) in flat, said
    logged = log.read_text()
    assert "Traceback (most recent call last)" in logged and "KeyError: 'no such layer'" in logged
    result = json.loads((out / "results.json").read_text())
    assert [t["status"] for t in result["trials"]] == ["completed", "failed"]
    assert result["trials"][1]["error"] == f"train: {error}"
