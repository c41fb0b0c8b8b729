"""The scaling lab notebook (examples/scaling-lab.ipynb) is what scripts/make_scaling_lab.py
writes, and it runs from top to bottom in a kernel on this interpreter, printing what it
measured: a validation accuracy, a scaling table of two rows, and its plots."""

import json
import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from scripts.make_scaling_lab import NOTEBOOK, notebook

ROOT = Path(__file__).resolve().parents[2]


def text_of(cell) -> str:
    """What a code cell printed (its stream outputs, joined)."""
    return "".join(out.get("text", "") for out in cell.outputs if out.output_type == "stream")


def tagged(executed, tag: str):
    (cell,) = [c for c in executed.cells if tag in c.metadata.get("tags", [])]
    return cell


def test_the_committed_notebook_is_what_the_script_writes_with_no_outputs():
    committed = nbformat.read(NOTEBOOK, as_version=4)
    made = notebook()
    assert [c.source for c in committed.cells] == [c.source for c in made.cells]
    assert [c.metadata for c in committed.cells] == [c.metadata for c in made.cells]
    code = [c for c in committed.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)


@pytest.mark.slow
def test_the_scaling_lab_runs_and_prints_its_figures(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path / "home"))  # the kernel inherits it
    lab = nbformat.read(NOTEBOOK, as_version=4)
    # kernel_name python3 is ipykernel's own spec: jupyter_client starts it with this very
    # interpreter (sys.executable), so the kernel imports the dlscale and torch under test.
    client = NotebookClient(
        lab, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(tmp_path)}}
    )
    executed = client.execute()

    setup = text_of(tagged(executed, "setup"))
    assert Path(re.search(r"kernel: (\S+)", setup).group(1)) == Path(sys.executable)
    work = Path(re.search(r"work: (\S+)", setup).group(1))

    profiled = text_of(tagged(executed, "profile"))
    assert re.search(r"this machine: [\d.]+ ms a step \(measured", profiled)
    assert re.search(r"a100-40gb: [\d.]+ ms a step \(predicted\); it fits", profiled)

    trained = tagged(executed, "train")
    accuracy = float(re.search(r"val_accuracy ([\d.]+) after", text_of(trained)).group(1))
    recorded = json.loads((work / "train" / "run.json").read_text())["final"]["val_accuracy"]
    assert accuracy == round(recorded, 4)  # the figure printed is the run's own
    assert any("image/png" in out.get("data", {}) for out in trained.outputs)  # the curve

    table = text_of(tagged(executed, "scale")).splitlines()
    rows = [line.split() for line in table[1:]]
    assert [int(row[0]) for row in rows] == [1, 2]
    # Efficiency against the one-worker run, T(2) / (2 · T(1)), from the saved result's rates.
    saved = json.loads((work / "scale" / "scale.json").read_text())["rows"]
    one, two = saved[0]["samples_per_s"], saved[1]["samples_per_s"]
    assert [float(row[2]) for row in rows] == [1.0, round(two / (2 * one), 2)]

    plots = tagged(executed, "plots").outputs
    assert len([out for out in plots if "image/png" in out.get("data", {})]) >= 2
