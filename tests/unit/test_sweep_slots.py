"""How many trials of a sweep run at once (sweep/slots.py), and which folder a bare
`sweep --resume` continues (train/run_folder.py): pure arithmetic over a stand-in launcher."""

import os
from pathlib import Path

import pytest

from dlscale.errors import UserError
from dlscale.jobspec import parse_spec
from dlscale.launch.base import Resources
from dlscale.sweep.slots import trial_slots
from dlscale.train.run_folder import latest_sweep_dir

SWEEP = {
    "name": "s",
    "model": {"name": "mlp", "kwargs": {"hidden": 8}},
    "data": {"name": "digits"},
    "batch_size": 16,
    "epochs": 1,
    "sweep": {"grid": {"optimizer.lr": [0.01, 0.1, 0.2]}},  # 3 trials, one run each
}


class Cores:
    """A launcher with `free` cores: as many trials fit as their processes allow."""

    name = "local"

    def __init__(self, free: int):
        self.free = free

    def capacity(self, resources: Resources) -> int:
        return int(self.free // resources.cpus)


def test_slots_are_what_fits_what_was_asked_and_no_more_than_the_runs():
    spec = parse_spec(SWEEP)
    ddp = parse_spec({**SWEEP, "strategy": {"name": "ddp", "workers": 2}})
    assert trial_slots(spec, [spec], None, Cores(8)) == (3, Resources(cpus=1.0, gpus=0.0), None)
    assert trial_slots(spec, [spec], 2, Cores(8))[0] == 2
    slots, resources, warning = trial_slots(ddp, [ddp], 4, Cores(5))
    assert (slots, resources.cpus) == (2, 2.0)
    assert warning == "--parallel 4: 2 trial(s) of 2 process(es) fit (local); running 2 at a time"
    with pytest.raises(UserError, match=r"one trial needs 2 core\(s\); local does not"):
        trial_slots(ddp, [ddp], None, Cores(1))


def test_a_bare_resume_continues_the_newest_sweep_of_that_name_only(tmp_path: Path):
    def sweep_folder(name: str, mtime: int) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "sweep.json").write_text("{}")
        os.utime(folder / "sweep.json", (mtime, mtime))
        return folder

    sweep_folder("sweep-a-20260101-000000", 100)
    newest = sweep_folder("sweep-a-20260101-000000-2", 200)
    sweep_folder("sweep-a-b-20260101-000000", 300)  # the sweep named a-b, not a
    (tmp_path / "sweep-a-20260102-000000").mkdir()  # no sweep.json: nothing to continue
    assert latest_sweep_dir("a", tmp_path) == newest
    with pytest.raises(UserError, match="nothing to resume: no sweep of 'c'"):
        latest_sweep_dir("c", tmp_path)
