"""A run folder belongs to one process: a second run, sweep or bench into it is refused in one
line, and the first run's record and checkpoints stay its own."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlscale.cli.main import app
from dlscale.errors import UserError
from dlscale.launch.base import WorkerFailed
from dlscale.signals import Terminated
from dlscale.train.checkpoint import latest_checkpoint, load_checkpoint
from dlscale.train.ownership import LOCK_NAME, claim
from tests.conftest import default_sigint

DLSCALE = str(Path(sys.executable).parent / "dlscale")
# Many short epochs: run.json and checkpoints appear within a second, and the run goes on until
# the test stops it.
LONG = """
name: {name}
model: {{name: mlp, kwargs: {{hidden: [16]}}}}
data: {{name: digits}}
batch_size: 64
epochs: 100000
device: cpu
seed: {seed}
"""
SHORT = (
    "name: t\nmodel: {name: mlp, kwargs: {hidden: [8]}}\ndata: {name: digits}\n"
    "batch_size: 32\nsteps: 2\n"
)


def invoke(*args) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.slow
def test_two_runs_into_one_folder_at_once_one_is_refused(tmp_path: Path):
    out = tmp_path / "run"
    names = ("first", "second")
    processes = {}
    for seed, name in enumerate(names):
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(LONG.format(name=name, seed=seed))
        processes[name] = subprocess.Popen(
            [DLSCALE, "train", str(spec), "--out", str(out)],
            # stdout unread while the winner trains: a pipe would fill and block it
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_sigint,  # the winner is stopped with SIGINT
        )
    try:
        deadline = time.monotonic() + 120
        while all(p.poll() is None for p in processes.values()):
            assert time.monotonic() < deadline, "both runs are training into one folder"
            time.sleep(0.05)
        loser = next(name for name, p in processes.items() if p.poll() is not None)
        winner = next(name for name in names if name != loser)
        _, err = processes[loser].communicate(timeout=30)
        assert processes[loser].returncode == 2, err
        assert f"{out} is in use by another dlscale run (pid {processes[winner].pid})" in err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        # The winner goes on: its record (written as it starts) and then a checkpoint appear.
        # Stopped before its first checkpoint it would have none to check (a race while the
        # test waited for run.json alone, which is written first).
        while not (out / "run.json").exists() or latest_checkpoint(out) is None:
            assert processes[winner].poll() is None, processes[winner].communicate()[1]
            time.sleep(0.05)
        processes[winner].send_signal(signal.SIGINT)
        _, err = processes[winner].communicate(timeout=60)
        assert processes[winner].returncode == 130, err
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    record = json.loads((out / "run.json").read_text())
    assert record["name"] == winner
    assert load_checkpoint(latest_checkpoint(out))["spec_hash"] == record["spec_hash"]
    assert not (out / LOCK_NAME).exists()  # released at exit, even on Ctrl-C


def test_a_held_folder_refuses_resume_and_names_the_holder(tmp_path: Path):
    spec = tmp_path / "job.yaml"
    spec.write_text(SHORT)
    assert invoke("train", spec, "--out", tmp_path / "run").exit_code == 0
    with claim(tmp_path / "run"):
        result = invoke("train", spec, "--out", tmp_path / "run", "--resume")
    assert result.exit_code == 2
    assert f"in use by another dlscale run (pid {os.getpid()})" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_claim_is_released_and_an_empty_folder_it_made_is_removed(tmp_path: Path):
    folder = tmp_path / "new" / "run"
    with claim(folder):
        assert (folder / LOCK_NAME).read_text().split()[0] == str(os.getpid())
        with pytest.raises(UserError, match="in use by another dlscale run"), claim(folder):
            pass
    assert not folder.exists() and (tmp_path / "new").is_dir()
    with claim(folder):
        (folder / "run.json").write_text("{}")
    assert sorted(p.name for p in folder.iterdir()) == ["run.json"]  # no lock file left
    with claim(folder), pytest.raises(RuntimeError):
        raise RuntimeError("a failed run")
    with claim(folder):  # released on error too
        pass


@pytest.mark.parametrize(
    "command",
    [
        ("sweep", "{spec}", "--out", "{out}"),
        ("scale", "{spec}", "--workers", "1", "--steps", "2", "--out", "{out}"),
        ("compare", "{spec}", "--strategies", "ddp", "--workers", "2", "--out", "{out}"),
        ("bench", "matmul", "--sizes", "8", "--out", "{out}"),
    ],
)
def test_every_output_folder_is_owned_by_one_process(tmp_path: Path, command):
    spec = tmp_path / "job.yaml"
    spec.write_text(SHORT + "sweep:\n  grid:\n    optimizer.lr: [0.1]\n")
    out = tmp_path / "out"
    args = [a.format(spec=spec, out=out) for a in command]
    with claim(out):
        result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert f"{out} is in use by another dlscale run (pid {os.getpid()})" in result.stderr
    assert "Traceback" not in result.output


def test_a_failed_job_with_checkpoints_says_how_to_continue(tmp_path: Path):
    """A job stopped by a dead or failed process (any launcher) names the way back: --resume into
    the same folder, where there is something to resume; none where nothing was saved."""
    from dlscale.api.rundir import train_in_folder
    from dlscale.launch.base import WorkerFailed
    from dlscale.train.checkpoint import checkpoint_path

    def dies(run_dir: Path, resume_from, said) -> dict:
        raise WorkerFailed("worker 1 (pid 42) was killed by SIGKILL (out of memory, or killed)")

    def saves_then_dies(run_dir: Path, resume_from, said) -> dict:
        checkpoint_path(run_dir, 20).parent.mkdir(parents=True)
        checkpoint_path(run_dir, 20).write_bytes(b"")  # listed by its name; never loaded here
        dies(run_dir, resume_from, said)

    with pytest.raises(WorkerFailed) as bare:
        train_in_folder("x", tmp_path / "new", False, None, dies)
    assert str(bare.value).endswith("(out of memory, or killed)")
    with pytest.raises(WorkerFailed) as kept:
        train_in_folder("x", tmp_path / "saved", False, None, saves_then_dies)
    assert str(kept.value) == (
        "worker 1 (pid 42) was killed by SIGKILL (out of memory, or killed); its checkpoints "
        f"are kept: continue with --resume --out {tmp_path / 'saved'}"
    )
    assert kept.value.exit_code == 1


# ------------------------------------------------- folders inside a held folder

HOLD = (
    "import sys\n"
    "from dlscale.train.ownership import claim\n"
    "with claim(sys.argv[1]):\n"
    "    print('held', flush=True)\n"
    "    sys.stdin.read()\n"
)


def hold_elsewhere(folder: Path) -> subprocess.Popen:
    """Another process that holds `folder` until its stdin closes."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_run_folder_inside_a_live_runs_folder_is_refused(tmp_path: Path):
    spec = tmp_path / "job.yaml"
    spec.write_text(SHORT)
    outer = tmp_path / "outer"
    inner = outer / "sub" / "run"
    holder = hold_elsewhere(outer)
    try:
        result = invoke("train", spec, "--out", inner)
        resumed = invoke("train", spec, "--out", outer / "sub", "--resume")
    finally:
        holder.communicate("")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        f"error: {inner} is inside {outer.resolve()}, which is in use by another dlscale run "
        f"(pid {holder.pid}): wait for it to end, or choose another --out"
    )
    assert resumed.exit_code == 2 and "in use by another dlscale run" in resumed.stderr
    assert not inner.exists()
    assert invoke("train", spec, "--out", inner).exit_code == 0  # once the outer run ended


def test_compare_trains_inside_the_folder_it_holds(tmp_path: Path):
    """The holder of a folder may nest its own runs in it (compare, scale): no refusal."""
    spec = tmp_path / "job.yaml"
    spec.write_text(SHORT)
    with claim(tmp_path / "outer"):
        result = invoke("train", spec, "--out", tmp_path / "outer" / "run")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "stop, status, said",
    [
        (KeyboardInterrupt(), "interrupted", "stopped by Ctrl-C"),
        (Terminated(), "interrupted", "stopped by SIGTERM"),
        (WorkerFailed("worker 1 (pid 42) was killed by SIGKILL"), "failed", "worker 1 (pid 42)"),
        (UserError("no space left on device: run.json"), "failed", "no space left on device"),
        (RuntimeError("a defect\nits second line"), "failed", "a defect"),
    ],
)
def test_a_stopped_run_leaves_a_record_that_says_so(tmp_path: Path, stop, status, said):
    """A run.json written while the run went on must not say `running` for ever once it stopped:
    Ctrl-C, SIGTERM and a dead worker each leave their status and why."""
    from dlscale.api.rundir import train_in_folder
    from dlscale.atomic import write_json_atomic

    def stops(run_dir: Path, resume_from, said) -> dict:
        write_json_atomic(run_dir / "run.json", {"status": "running", "name": "x"})
        raise stop

    with pytest.raises(type(stop)):
        train_in_folder("x", tmp_path / "run", False, None, stops)
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == status and said in record["error"]
    assert record["name"] == "x"


@pytest.mark.parametrize("out_given", [True, False])
def test_a_run_stopped_before_its_first_checkpoint_does_not_say_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, out_given: bool
):
    """The defect: Ctrl-C before a run's first checkpoint said `continue later with --resume`,
    and --resume then found nothing. The stop names what is there instead: nothing to resume,
    and (with --out) the record a new run into that folder must not replace."""
    import typer

    from dlscale.api.rundir import train_in_folder
    from dlscale.atomic import write_json_atomic
    from dlscale.cli.errors import user_errors
    from dlscale.train.checkpoint import checkpoint_path

    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)

    def stops_early(run_dir: Path, resume_from, said) -> dict:
        write_json_atomic(run_dir / "run.json", {"status": "running", "name": "x"})
        raise KeyboardInterrupt

    def stops_after_saving(run_dir: Path, resume_from, said) -> dict:
        checkpoint_path(run_dir, 20).parent.mkdir(parents=True, exist_ok=True)
        checkpoint_path(run_dir, 20).write_bytes(b"")  # listed by its name; never loaded here
        raise KeyboardInterrupt

    @user_errors
    def train(start, out: Path | None, resume: bool = False) -> None:
        train_in_folder("x", out, resume, None, start)

    with pytest.raises(typer.Exit) as early:
        train(stops_early, tmp_path / "run" if out_given else None)
    said = " ".join(capsys.readouterr().err.split())
    assert early.value.exit_code == 130
    assert "--resume" not in said, said
    assert said.startswith("interrupted: stopped before its first checkpoint, nothing to resume")
    (record,) = tmp_path.rglob("run.json")
    if out_given:  # a new run into --out is refused while that record is there: say so
        assert f"remove {record}" in said, said
    else:  # a rerun makes a new folder
        assert "run.json" not in said, said

    with pytest.raises(typer.Exit) as saved:
        train(stops_after_saving, tmp_path / "saved" if out_given else None)
    assert saved.value.exit_code == 130
    said = " ".join(capsys.readouterr().err.split())
    # --resume alone takes the newest run of the name: the folder is named
    assert said.startswith("interrupted: continue later with --resume --out "), said
    (kept,) = list(tmp_path.rglob("step-*.pt"))
    assert Path(said.rsplit(" ", 1)[1]).resolve() == kept.parents[1], said  # relative if default


def test_a_run_stopped_before_its_folder_says_nothing_of_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Ctrl-C during train's checks (before any folder) said `continue later with --resume`:
    there is nothing anywhere to continue."""
    import dlscale.api as api_module

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(api_module, "check_run", stopped)
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: x\nmodel: {name: mlp}\ndata: {name: digits}\nbatch_size: 8\nsteps: 2\ndevice: cpu\n"
    )
    result = CliRunner().invoke(app, ["train", str(spec), "--out", str(tmp_path / "out")])
    assert result.exit_code == 130
    assert result.stderr.strip() == "interrupted", result.stderr
    assert not (tmp_path / "out").exists()
