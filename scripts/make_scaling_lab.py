"""Writes examples/scaling-lab.ipynb, the scaling lab notebook, with its outputs cleared.

The notebook is made here rather than saved from a Jupyter session so that its text is
reproducible and reviewed as code; tests/examples/test_scaling_lab.py checks that the committed
file is what this script writes, then executes it. Run: .venv/bin/python scripts/make_scaling_lab.py
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "scaling-lab.ipynb"

INTRO = """\
# The scaling lab

Profile a model on this machine and on a catalogued GPU, train it, scale it over one and two
data-parallel workers, and plot what was measured: every step through `dlscale.api`, the same
verbs the `dlscale` command calls ([docs/api.md](../docs/api.md)). An MLP on the bundled 8×8
digits keeps it short: one to two minutes on two CPU cores shared with other work.

Made by `scripts/make_scaling_lab.py` and executed by `tests/examples/test_scaling_lab.py`."""

SETUP = """\
import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import yaml
from IPython.display import Image, display

from dlscale import api
from dlscale.api import bench, experiments, profiling
from dlscale.profiler.request import ProfileRequest

print("kernel:", sys.executable)
work = Path(tempfile.mkdtemp(prefix="scaling-lab-"))  # every file this notebook writes
print("work:", work)
spec = {
    "name": "lab-mlp",
    "model": {"name": "mlp", "kwargs": {"hidden": [128, 64]}},
    "data": {"name": "digits"},
    "batch_size": 64,
    "epochs": 3,
    "optimizer": {"name": "momentum", "lr": 0.05, "momentum": 0.9},
    "seed": 0,
}
spec_path = work / "lab.yaml"
spec_path.write_text(yaml.safe_dump(spec))
checked, warnings = api.validate(spec_path)
print(f"{checked.name}: {checked.model.name} on {checked.data.name}, hash {checked.spec_hash()}")"""

PROFILE_TEXT = """\
## 1. Profile: measured here, predicted on an A100

`api.estimate` times a few real training steps on this machine and extrapolates the whole run.
`profiling.profile` traces one step on the meta device (shapes only, nothing computed) and
predicts it on catalogue devices with the roofline model: no GPU is needed to ask about one."""

PROFILE = """\
here = api.estimate(spec_path, steps=10, warmup=3)
print(
    f"this machine: {here.step_s_median * 1e3:.2f} ms a step (measured, median of "
    f"{here.steps_measured}), {here.total_s:.1f} s for the {here.epochs} epochs"
)
profiled = profiling.profile(ProfileRequest(target=str(spec_path), hardware=("a100-40gb",)))
for report in profiled.reports:
    step_ms = report.prediction.step_s * 1e3
    fits = "fits" if report.verdict.fits else "does not fit"
    print(f"{report.hardware.name}: {step_ms:.3f} ms a step (predicted); it {fits}")"""

TRAIN_TEXT = """\
## 2. Train

`api.train` runs the spec with its strategy (here one process) and returns the run record, typed
(a `RunRecord`): its fields are what it also writes to `run.json`, and `record.to_json()` is
that file's content."""

TRAIN = """\
record = api.train(spec_path, out_dir=work / "train")
final = record.final
print(f"val_accuracy {final.val_accuracy:.4f} after {final.step} steps")
print(f"{final.train_samples_per_s:.0f} samples/s, {final.wall_s:.1f} s wall")

fig, ax = plt.subplots(figsize=(5, 3))
ax.plot([e.epoch for e in record.epochs], [e.val_accuracy for e in record.epochs], marker="o")
ax.set_xlabel("epoch")
ax.set_ylabel("validation accuracy")
ax.set_title(record.name)
plt.show()"""

SCALE_TEXT = """\
## 3. Scale

`experiments.scale` trains the spec 20 steps with one and with two ddp workers, one run after
the other, and measures throughput and scaling efficiency against the one-worker run (what
`dlscale scale SPEC --workers 1,2 --steps 20` prints). On two cores that other programs share,
the figures move from run to run."""

SCALE = """\
scaled = experiments.scale(spec_path, [1, 2], work / "scale", steps=20)
print(f"{'workers':>7}  {'samples/s':>10}  {'efficiency':>10}")
for row in scaled.rows:
    print(f"{row.workers:>7}  {row.samples_per_s:>10.0f}  {row.efficiency:>10.2f}")"""

PLOTS_TEXT = """\
## 4. Plot

The plots the command line writes: `bench.write_outputs` saves the scaling result as
`dlscale scale` does (scale.json and scale.png), and `profiling.profile_plots` the roofline and
per-layer plots of `dlscale profile --plot`."""

PLOTS = """\
json_path, png_path = bench.write_outputs("scale", scaled, work / "scale")
display(Image(filename=str(png_path)))
for path in profiling.profile_plots(profiled, work / "profile"):
    display(Image(filename=str(path)))"""


def notebook() -> nbformat.NotebookNode:
    """The scaling lab, each code cell tagged with its step (the test finds its outputs so)."""
    cells = [
        new_markdown_cell(INTRO),
        new_code_cell(SETUP, metadata={"tags": ["setup"]}),
        new_markdown_cell(PROFILE_TEXT),
        new_code_cell(PROFILE, metadata={"tags": ["profile"]}),
        new_markdown_cell(TRAIN_TEXT),
        new_code_cell(TRAIN, metadata={"tags": ["train"]}),
        new_markdown_cell(SCALE_TEXT),
        new_code_cell(SCALE, metadata={"tags": ["scale"]}),
        new_markdown_cell(PLOTS_TEXT),
        new_code_cell(PLOTS, metadata={"tags": ["plots"]}),
    ]
    for index, cell in enumerate(cells):
        cell.id = f"cell-{index}"  # stable ids: the file is the same on every run of this script
    kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return new_notebook(cells=cells, metadata={"kernelspec": kernel})


def main() -> None:
    nbformat.write(notebook(), NOTEBOOK)
    print(f"wrote {NOTEBOOK}")


if __name__ == "__main__":
    main()
