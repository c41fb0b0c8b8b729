"""An async parameter-server job that loses an expendable worker at any moment, from its first
step to the main worker's final gather, still ends: exit 0 (no exception) and a complete record.

The defect: killed near the end, the job failed with `worker 0 failed: DistNetworkError:
Connection reset by peer` (the store's host had left while worker 0 still read the final
records from it) and run.json was left `running`.
"""

import json
import os
import signal
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from dlscale import api
from dlscale.jobspec import parse_spec
from dlscale.launch import local
from dlscale.train.checkpoint import list_checkpoints
from tests.conftest import RecordingReporter, alive

STEPS = 60
# Where worker 2 (the last process: servers 0 and 1, then workers 0..2) is killed: at a share of
# worker 0's steps, or once a key of the end-of-run protocol is in the store. Worker 2 is a
# straggler (worker 0 also validates and saves), so it is alive at each share. For the keys, it
# is also held back (SIGSTOP at half of worker 0's steps), so that it is still alive when worker
# 0 ends: at `summary/0` worker 0 waits for the servers' final answer (worker 2 is killed while
# stopped); for `summary/2` it is let go then and killed as it settles its last push; at
# `final/1` (worker 0 reads the final records) and `gathered` (the teardown) the servers have
# dropped it as silent (`heartbeat_timeout_s`), and it is killed while worker 0 gathers.
KILL_POINTS = [0.0, 0.15, 0.3, 0.45, 0.6, 0.75, "summary/0", "summary/2", "final/1", "gathered"]
# How much slower worker 2 computes (it sleeps factor − 1 times its step's compute): at a share
# of worker 0's steps it must still be running, and worker 0's steps also wait on its pushes,
# validate and save, so at 3 a loaded machine let it finish first (the run ended before 0.6 or
# 0.75, once in 8 runs beside three busy loops; the fresh-clone suites' misses had another
# cause: see Killer). It is killed at that share, so slower costs nothing. At the store's keys
# it is held by SIGSTOP instead, and must finish once let go.
STRAGGLER = {True: 50.0, False: 3.0}
SAVE_EVERY = 3  # worker 0 saves every 3 steps: where it is, whatever its progress events say


class Killer(RecordingReporter):
    """SIGKILLs worker 2 once worker 0 is at `point` of the run, or once the key `point`
    appears in the job's store (watched from a thread).

    Where worker 0 is: its progress events come at most every 0.1 s (`PROGRESS_EVERY_S`), and on
    an idle machine its 60 steps took little more, so an event past a late share often never
    came (the run ended before kill point 0.6 or 0.75, in fresh-clone suites); its checkpoints,
    every `SAVE_EVERY` steps and each saved before it goes on, are watched from a thread too."""

    def __init__(self, point: float | str, port: int, pids: list[int], run_dir: Path):
        super().__init__()
        self.point, self.port, self.pids, self.run_dir = point, port, pids, run_dir
        self.killed: int | None = None  # its pid, once the signal reached it alive
        self.held = False
        self.seen = 0  # the furthest step of worker 0's heard of
        self.lock = threading.Lock()
        self.missed: list[str] = []  # why a signal did not go, for the failure's message
        self.done = threading.Event()
        threading.Thread(target=self._watch_checkpoints, daemon=True).start()
        if isinstance(point, str):
            threading.Thread(target=self._watch_store, daemon=True).start()

    def step(self, step, epoch, loss, samples_per_s):
        super().step(step, epoch, loss, samples_per_s)
        self.reached(step)

    def finish(self, record):
        super().finish(record)
        self.done.set()

    def reached(self, step: int) -> None:
        with self.lock:
            self.seen = max(self.seen, step)
            if isinstance(self.point, float) and step >= max(1, self.point * STEPS):
                self.signal(signal.SIGKILL)
            elif isinstance(self.point, str) and not self.held and step >= STEPS / 2:
                self.held = True
                self.signal(signal.SIGSTOP)

    def signal(self, number: int) -> None:
        if self.killed is None and self.pids and alive(self.pids[4]):
            os.kill(self.pids[4], number)
            if number == signal.SIGKILL:
                self.killed = self.pids[4]
        elif self.killed is None and len(self.missed) < 3:
            state = _state(self.pids[4]) if self.pids else "no pids yet"
            self.missed.append(f"signal {number} at step {self.seen}: {self.pids} {state}")

    def _watch_checkpoints(self) -> None:
        deadline = time.monotonic() + 120
        while not self.done.is_set() and time.monotonic() < deadline:
            saved = [step for step, _ in list_checkpoints(self.run_dir)]
            if saved and max(saved) > self.seen:
                self.reached(max(saved))
            time.sleep(0.001)

    def _watch_store(self) -> None:
        # Connected before training starts: a store client's own retries back off for seconds,
        # longer than this run trains.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:  # server 0 has not opened the store yet
                time.sleep(0.01)
        client = dist.TCPStore(
            "127.0.0.1", self.port, is_master=False, timeout=timedelta(seconds=30)
        )
        # The keys as the job's processes see them: init_process_group wraps the store for its
        # default group (named "0") the same way.
        store = dist.PrefixStore("0/", dist.PrefixStore("default_pg", client))
        deadline = time.monotonic() + 120
        if self.point == "summary/2":
            self._await(store, "summary/0", deadline)
            self.signal(signal.SIGCONT)
        self._await(store, self.point, deadline)
        self.signal(signal.SIGKILL)

    @staticmethod
    def _await(store, key: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                if store.check([f"ps/{key}"]):
                    return
            except Exception:  # the job ended (its store went with it) without the key
                return
            time.sleep(0.002)  # worker 2 exits moments after its summary: look often


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS, ids=str)
def test_async_job_survives_losing_a_worker_at_any_point(tmp_path: Path, point, monkeypatch):
    port = local.free_port()
    spec = parse_spec(
        {
            "name": "ps-kill-points",
            "model": {"name": "mlp"},
            "data": {"name": "synthetic", "shape": [1, 8, 8], "num_samples": 2000},
            "batch_size": 16,
            "steps": STEPS,
            "checkpoint": {"every_steps": SAVE_EVERY},
            "optimizer": {"name": "sgd", "lr": 0.05},
            "strategy": {
                "name": "ps",
                "mode": "async",
                "workers": 3,
                "servers": 2,
                "port": port,
                "straggler": {"worker": 2, "factor": STRAGGLER[isinstance(point, float)]},
                "heartbeat_timeout_s": 5 if point in ("final/1", "gathered") else 15,
            },
        }
    )
    pids: list[int] = []  # the job's processes in rank order, as the launcher started them

    class Watched(local.Silence):
        def __init__(self, size, warn_after_s, started):
            super().__init__(size, warn_after_s, started)
            pids.extend(started)

    monkeypatch.setattr(local, "Silence", Watched)
    killer = Killer(point, port, pids, tmp_path)
    record = api.train(spec, out_dir=tmp_path, reporter=killer)  # raises on a failed job

    if killer.killed is None:
        # Only at summary/2 can the kill miss: worker 2 exits moments after handing in its
        # summary, and on a loaded machine it may be gone before the watcher sees the key (about
        # 1 run in 5 here). Then the record must show it completed, as checked below.
        assert point == "summary/2", (
            f"the run ended before kill point {point}: {killer.missed}, "
            f"workers {record.workers}, dropped {record.ps['dropped_workers']}, "
            f"warnings {record.warnings}"
        )
    saved = json.loads((tmp_path / "run.json").read_text())
    assert saved["status"] == "completed"
    assert saved == json.loads(json.dumps(record.to_json()))
    assert saved["workers"][0]["steps"] == STEPS
    assert saved["final"]["val_accuracy"] is not None
    assert len(saved["ps"]["per_server"]) == 2
    assert (tmp_path / "checkpoints" / f"step-{STEPS:08d}.pt").exists()
    if saved["ps"]["dropped_workers"]:  # killed before it was done
        assert saved["ps"]["dropped_workers"] == [2]
        assert saved["workers"][2] == {"rank": 2, "status": "died"}
    else:  # killed once it had handed in its summary
        assert saved["workers"][2]["steps"] == STEPS
    if saved["ps"]["dropped_workers"]:  # it died before it was done: the launcher says so
        killed = f"worker 2 (pid {killer.killed}) was killed by SIGKILL"
        assert any(killed in warning for warning in saved["warnings"]), saved["warnings"]
    assert killer.killed is None or not alive(killer.killed)
