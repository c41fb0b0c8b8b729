"""A disk that fills up while a run saves: one line naming the real cause and the file, the
temp file gone, and the older checkpoints intact (and said to be)."""

import errno
import io
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dlscale import atomic
from dlscale.errors import UserError
from dlscale.train import checkpoint as ckpt
from dlscale.train.checkpoint import list_checkpoints, load_checkpoint
from tests.conftest import interrupt_next_create, worker_pids

DLSCALE = str(Path(sys.executable).parent / "dlscale")
SPEC = """
name: full
model: {{name: mlp, kwargs: {{hidden: [32]}}}}
data: {{name: digits}}
batch_size: 32
epochs: 100000
device: cpu
checkpoint: {{every_steps: 10, keep_last: 2}}
{strategy}
"""


class FillingDisk(io.RawIOBase):
    """A file on a disk with `free_bytes` left: the write that would pass it fails as a full
    disk does (ENOSPC), after writing what fitted."""

    def __init__(self, handle, free_bytes: int):
        self.handle, self.free_bytes = handle, free_bytes

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = bytes(data)
        if len(data) > self.free_bytes:
            self.handle.write(data[: self.free_bytes])
            self.free_bytes = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.free_bytes -= len(data)
        return self.handle.write(data)

    def fileno(self) -> int:
        return self.handle.fileno()

    def close(self) -> None:
        self.handle.close()
        super().close()


def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_older_ones_survive(
    tmp_path: Path, monkeypatch
):
    weights = {"model": {"w": torch.ones(10_000)}}
    ckpt.save_checkpoint(tmp_path, 10, weights, keep_last=2)
    real_fdopen = atomic.os.fdopen
    monkeypatch.setattr(
        atomic.os, "fdopen", lambda fd, mode: FillingDisk(real_fdopen(fd, mode), 1000)
    )
    with pytest.raises(UserError) as caught:
        ckpt.save_checkpoint(tmp_path, 20, weights, keep_last=2)
    message = str(caught.value)
    assert "\n" not in message and "unexpected pos" not in message
    assert f"cannot write {ckpt.checkpoint_path(tmp_path, 20)}: no space left on device" in message
    older = ckpt.checkpoint_path(tmp_path, 10)
    assert f"older checkpoints are intact (newest: step 10, {older})" in message
    assert [step for step, _ in list_checkpoints(tmp_path)] == [10]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000010.pt"]
    assert load_checkpoint(ckpt.checkpoint_path(tmp_path, 10))["step"] == 10


def test_a_failed_write_of_any_file_names_the_file_and_the_cause(tmp_path: Path):
    target = tmp_path / "results.json"
    target.write_text("old")

    def fail(handle):
        handle.write(b"half")
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(atomic.WriteFailed, match=f"cannot write {target}: input/output error"):
        atomic.write_atomic(target, fail)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == [target.name]


class InterruptedDisk(FillingDisk):
    """A file whose write is where Ctrl-C lands: inside torch.save, called back from its C++
    writer, which turns the KeyboardInterrupt into 'unexpected pos ...' (a RuntimeError)."""

    def write(self, data) -> int:
        if len(data) > self.free_bytes:
            raise KeyboardInterrupt
        return super().write(data)


def test_ctrl_c_inside_a_checkpoint_write_stays_an_interrupt(tmp_path: Path, monkeypatch):
    weights = {"model": {"w": torch.ones(10_000)}}
    ckpt.save_checkpoint(tmp_path, 10, weights, keep_last=2)
    real_fdopen = atomic.os.fdopen
    monkeypatch.setattr(
        atomic.os, "fdopen", lambda fd, mode: InterruptedDisk(real_fdopen(fd, mode), 1000)
    )
    # The run ends as interrupted (exit 130, resume hint), not with torch's error (exit 1).
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(tmp_path, 20, weights, keep_last=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000010.pt"]


def test_ctrl_c_while_a_checkpoint_loads_does_not_blame_the_file(tmp_path: Path, monkeypatch):
    path = ckpt.save_checkpoint(tmp_path, 10, {"model": {"w": torch.ones(3)}}, keep_last=2)

    def interrupted_in_cpp(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("PytorchStreamReader failed reading file data/0") from None

    monkeypatch.setattr(ckpt.torch, "load", interrupted_in_cpp)
    # --resume sets an unreadable checkpoint aside: an interrupted load must not look like one
    with pytest.raises(KeyboardInterrupt):
        load_checkpoint(path)


def limit_file_size(pids: list[int], limit_bytes: int) -> None:
    """From now on no file these processes write may grow past `limit_bytes` (EFBIG): a disk
    that fills up mid-run, without root or a small file system."""
    for pid in pids:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy",
    ["", pytest.param("strategy: {name: ddp, workers: 2}", marks=pytest.mark.heavy)],
    ids=["single", "ddp"],
)
def test_a_disk_that_fills_mid_run_stops_it_in_one_line(tmp_path: Path, strategy: str):
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC.format(strategy=strategy))
    out = tmp_path / "run"
    # SIGXFSZ would kill the writer before it could say why; ignored, the write fails with
    # EFBIG instead (an ignored signal stays ignored across exec, and in spawned workers).
    process = subprocess.Popen(
        [DLSCALE, "train", str(spec), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGXFSZ, signal.SIG_IGN),
    )
    try:
        deadline = time.monotonic() + 180
        while not list_checkpoints(out):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no checkpoint within 180 s"
            time.sleep(0.01)
        limit_file_size([process.pid, *worker_pids(process.pid)], 1000)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "file too large" in err and "are intact (newest: step" in err
    newest_step, newest = list_checkpoints(out)[-1]
    assert f"newest: step {newest_step}" in err
    assert load_checkpoint(newest)["step"] == newest_step
    assert not list((out / "checkpoints").glob("*.tmp"))


def test_ctrl_c_as_the_temp_file_is_created_leaves_no_temp_file(tmp_path: Path, monkeypatch):
    ckpt.save_checkpoint(tmp_path, 10, {"model": {"w": torch.ones(3)}}, keep_last=2)
    interrupt_next_create(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(tmp_path, 20, {"model": {"w": torch.ones(3)}}, keep_last=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000010.pt"]


def test_ctrl_c_as_a_shard_index_is_cached_leaves_no_temp_file(tmp_path: Path, monkeypatch):
    import numpy as np

    from dlscale.data import shard_cache

    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path / "home"))
    shard = tmp_path / "shard.tar"
    shard.write_bytes(b"\0" * 2048)
    interrupt_next_create(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        shard_cache.save(str(shard), shard.stat(), np.array([0, 512, 1024]))
    assert [p for p in (tmp_path / "home").rglob("*") if p.is_file()] == []
