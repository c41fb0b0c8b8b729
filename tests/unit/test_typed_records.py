"""The runs' typed records round-trip through their files: what a tiny real train, sweep and
predict wrote reads back (`Model.model_validate`) to the very same document, key for key and in
order, which is also what the verb returned; and a key the schema lacks is refused, at the top
of the document and in the records inside it."""

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import BaseModel, ValidationError

from dlscale import api
from dlscale.api import inference
from dlscale.infer.record import PredictResult
from dlscale.jobspec import parse_spec
from dlscale.sweep.record import SweepResult
from dlscale.train.record import RunRecord

SPEC = {
    "name": "typed",
    "model": {"name": "mlp", "kwargs": {"hidden": [8]}},
    "data": {"name": "synthetic", "shape": [20], "num_classes": 4, "num_samples": 200},
    "batch_size": 16,
    "steps": 2,
    "optimizer": {"name": "sgd", "lr": 0.05},
    "device": "cpu",
}


def read_back(model: type[BaseModel], path: Path) -> dict:
    """The file's document, once the model has read it back to the same text (the same keys in
    the same order, the same values, an int still an int and a float still a float)."""
    document = json.loads(path.read_text())
    again = model.model_validate(document).to_json()
    assert json.dumps(again, indent=2) == json.dumps(document, indent=2)
    return document


def assert_strict(model: type[BaseModel], document: dict, inside: list[tuple]) -> None:
    """A key the schema lacks is refused at the top, and in the record at each path of
    `inside` (keys and list indices down from the top)."""
    for path in [(), *inside]:
        changed = copy.deepcopy(document)
        record = changed
        for key in path:
            record = record[key]
        record["not_in_the_schema"] = 1
        with pytest.raises(ValidationError, match="not_in_the_schema\n  Extra inputs are not"):
            model.model_validate(changed)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[RunRecord, Path]:
    run_dir = tmp_path_factory.mktemp("train") / "run"
    return api.train(parse_spec(SPEC), out_dir=run_dir), run_dir


def test_the_run_record_is_run_json_and_refuses_an_unknown_key(trained):
    record, run_dir = trained
    document = read_back(RunRecord, run_dir / "run.json")
    assert record.to_json() == document and record.final.step == 2
    assert_strict(RunRecord, document, [("final",), ("timing",), ("epochs", 0), ("steps", 1)])


@pytest.mark.slow  # its trial runs in a pool slot: a process of its own
def test_the_sweep_result_is_results_json_and_refuses_an_unknown_key(tmp_path: Path):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "sweep": {"grid": {"optimizer.lr": [0.05, 0.1]}}}))
    result = api.sweep(spec, tmp_path / "sweep", parallel=1)
    document = read_back(SweepResult, tmp_path / "sweep" / "results.json")
    assert result.to_json() == document
    assert [trial.status for trial in result.trials] == ["completed", "completed"]
    assert result.failure is None and result.plots
    inside = [("trials", 0), ("trials", 0, "runs", 0), ("trials", 1, "runs", 0, "curve", 0)]
    assert_strict(SweepResult, document, [*inside, ("counts",), ("best",), ("evaluation",)])
    # A results.json written while the sweep ran has no plots and no failure yet: it reads back
    # without them, as it was.
    running = {key: value for key, value in document.items() if key not in ("plots", "failure")}
    assert SweepResult.model_validate(running).to_json() == running


def test_the_predict_result_is_its_json_file_and_refuses_an_unknown_key(trained, tmp_path):
    record, run_dir = trained
    x = np.random.default_rng(0).standard_normal((5, 20)).astype(np.float32)
    np.savez(tmp_path / "inputs.npz", x=x, y=np.array([0, 1, 2, 3, 0]))
    out = tmp_path / "predictions.json"
    result = inference.predict(run_dir, [tmp_path / "inputs.npz"], device="cpu", out=out)
    document = read_back(PredictResult, out)
    assert result.out == str(out) and result.counted == 5 and len(result.rows) == 5
    assert result.to_json() == {**document, "out": str(out)}  # the file does not name itself
    assert result.run_val_accuracy == record.final.val_accuracy
    assert_strict(PredictResult, document, [("rows", 0), ("inputs", 0)])
