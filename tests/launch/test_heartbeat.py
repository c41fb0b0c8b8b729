"""The launcher's view of worker heartbeats: who is silent, what the user is told, whom a
failure blames (in-process; tests/faults/test_silent_worker.py stops a real ddp worker)."""

import queue
import signal
import subprocess
import time

import pytest

from dlscale.errors import RunFailed, UserError
from dlscale.launch import local
from dlscale.launch.base import READY
from dlscale.launch.heartbeat import HEARTBEAT, Silence, process_state


@pytest.fixture
def stopped_pid():
    """A real process the kernel holds stopped, as SIGSTOP leaves a worker."""
    sleeper = subprocess.Popen(["sleep", "60"])
    sleeper.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while process_state(sleeper.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    yield sleeper.pid
    sleeper.send_signal(signal.SIGCONT)
    sleeper.kill()
    sleeper.wait()


def quiet_for(silence: Silence, rank: int, seconds: float) -> None:
    silence.last_beat[rank] = time.monotonic() - seconds


def started(size: int, pids=None, warn_after_s: float = 5.0, warnings=None):
    """A Silence whose workers have all beaten and reported READY; events go to `warnings`."""
    silence = Silence(size, warn_after_s, pids)
    sink = [] if warnings is None else warnings
    on_event = silence.watch(lambda kind, args: sink.append((kind, args[0])))
    for rank in range(size):
        on_event(HEARTBEAT, (rank,))
        on_event(READY, (rank,))
    sink.clear()
    return silence, on_event


def test_a_silent_worker_is_named_once_and_again_when_it_beats():
    events = []
    silence, on_event = started(3, warnings=events)
    on_event("warn", ("from a worker",))  # other events pass through; beats do not
    assert events == [("warn", "from a worker")]
    quiet_for(silence, 1, 6.0)
    quiet_for(silence, 2, 4.0)  # below the threshold: not yet
    for _ in range(3):  # still silent: said once is enough
        silence.check([0, 1, 2], on_event)
    assert events[1:] == [("warn", "waiting for worker 1: no heartbeat for 6 s")]
    on_event(HEARTBEAT, (1,))
    silence.check([0, 1, 2], on_event)
    assert events[2:] == [("warn", "worker 1 sends heartbeats again")]


def test_ready_is_passed_on_and_a_worker_still_starting_or_finished_is_not_waited_for():
    events = []
    silence = Silence(2, warn_after_s=2.0)
    on_event = silence.watch(lambda kind, args: events.append((kind, args[0])))
    on_event(HEARTBEAT, (0,))
    on_event(READY, (1,))
    assert events == [(READY, 1)]  # the launcher counts READY too
    quiet_for(silence, 0, 60.0)  # silent, but still importing and building: not yet READY
    silence.check([0], on_event)
    assert events == [(READY, 1)]
    quiet_for(silence, 1, 60.0)
    assert silence.blame("worker 0 failed: x", 0, [0]) is None  # 1 has finished


def test_a_stopped_process_is_said_to_be_stopped_with_how_to_resume_it(stopped_pid):
    silence = Silence(2, warn_after_s=5.0, pids=[None, stopped_pid])
    silence.started -= 7.0  # stopped before its first beat: named all the same
    events = []
    silence.check([0, 1], lambda kind, args: events.append(args[0]))
    assert events == [
        f"waiting for worker 1 (pid {stopped_pid}): no heartbeat in the 7 s since it started, "
        f"its process is stopped (SIGSTOP? `kill -CONT {stopped_pid}` resumes it)"
    ]


def test_a_failure_blames_the_silent_peer_not_the_worker_whose_wait_timed_out(stopped_pid):
    failure = "worker 0 failed: RuntimeError: Timed out waiting 60000ms"
    silence, _ = started(3, pids=[None, None, stopped_pid])
    blamed = silence.blame(failure, 0, [0, 1, 2])  # 2 is stopped: named even if it just beat
    assert str(blamed).startswith(f"worker 2 (pid {stopped_pid}) stopped responding: no heart")
    assert f", its process is stopped (SIGSTOP?); then {failure}" in str(blamed)
    silence, _ = started(3)
    assert silence.blame(failure, 0, [0, 1, 2]) is None  # everyone beats: the failure is 0's own
    quiet_for(silence, 2, 30.0)
    quiet_for(silence, 0, 30.0)  # the failed worker's own silence proves nothing
    blamed = silence.blame(failure, 0, [0, 1, 2])
    assert str(blamed) == f"worker 2 stopped responding: no heartbeat for 30 s; then {failure}"
    assert blamed.exit_code == 1


def test_the_warning_threshold_is_a_spec_setting_above_the_beat_interval():
    from dlscale.jobspec import parse_spec

    base = {"name": "t", "model": {"name": "lenet"}, "data": {"name": "digits"}, "batch_size": 8}
    for name in ("ddp", "ps", "pipeline", "hybrid"):
        spec = parse_spec({**base, "strategy": {"name": name, "heartbeat_warn_s": 3}})
        assert spec.strategy.heartbeat_warn_s == 3
    with pytest.raises(UserError, match=r"heartbeat_warn_s: .*greater than or equal to 2"):
        parse_spec({**base, "strategy": {"name": "ddp", "heartbeat_warn_s": 1}})


def test_first_cause_names_the_silent_peer_without_the_waiting_workers_traceback(
    monkeypatch, capsys
):
    from types import SimpleNamespace

    monkeypatch.setattr(local, "DEATH_NOTICE_S", 0.1)
    waiting = SimpleNamespace(exitcode=None, pid=41)
    silent = local.WorkerFailed("worker 1 (pid 42) stopped responding (...); then worker 0 ...")
    trace = "Traceback (most recent call last):\n  RuntimeError: Timed out\n"
    cause = local._first_cause([waiting], NoEvents(), 0, "RuntimeError: Timed out", trace, silent)
    assert cause is silent
    assert capsys.readouterr().err == ""


def test_first_cause_names_a_peer_whose_run_failed_not_the_waiting_workers_error(
    monkeypatch, capsys
):
    """A worker whose loss diverged leaves the group; its peer, waiting in an all-reduce,
    fails on the lost connection. The first worker's one line is the cause (issue 34)."""
    from types import SimpleNamespace

    monkeypatch.setattr(local, "DEATH_NOTICE_S", 0.1)
    processes = [SimpleNamespace(exitcode=None, pid=41), SimpleNamespace(exitcode=0, pid=42)]
    diverged = "training diverged at step 3: the loss is nan; no checkpoint was saved before it"
    results = FakeResults("run_failed", 1, diverged)
    trace = "Traceback (most recent call last):\n  RuntimeError: Connection closed by peer\n"
    cause = local._first_cause(processes, results, 0, "RuntimeError: closed", trace)
    assert isinstance(cause, RunFailed) and str(cause) == diverged and cause.exit_code == 1
    assert capsys.readouterr().err == ""


class FakeResults:
    """The launcher's result queue, holding one report."""

    def __init__(self, *report):
        self.reports = [report]

    def get(self, timeout):
        return self.reports.pop()

    def get_nowait(self):
        if not self.reports:
            raise queue.Empty
        return self.reports.pop()


class NoEvents:
    def get_nowait(self):
        raise queue.Empty


@pytest.mark.parametrize(
    ("report", "then"),
    [
        (
            ("user_error", 0, "server 0: no message from any worker for 9 s"),
            "then server 0: no message from any worker for 9 s",
        ),
        (
            ("error", 0, ("RuntimeError: Timed out", "Traceback ...")),
            "then worker 0 failed: RuntimeError: Timed out",
        ),
    ],
)
def test_the_launcher_blames_a_stopped_peer_for_a_wait_that_failed(
    report, then, stopped_pid, monkeypatch, capsys
):
    from types import SimpleNamespace

    monkeypatch.setattr(local, "DEATH_NOTICE_S", 0.1)
    processes = [SimpleNamespace(exitcode=None, pid=41), SimpleNamespace(exitcode=None, pid=42)]
    silence, _ = started(2, pids=[41, stopped_pid])
    with pytest.raises(UserError) as caught:
        local.LocalLauncher()._supervise(
            processes, FakeResults(*report), NoEvents(), None, frozenset(), silence
        )
    assert str(caught.value).startswith(f"worker 1 (pid {stopped_pid}) stopped responding: ")
    assert str(caught.value).endswith(then) and caught.value.exit_code == 1
    assert capsys.readouterr().err == ""  # not the waiting worker's traceback
