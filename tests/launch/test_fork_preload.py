"""Local workers fork from a server that has already imported what their first step needs."""

import sys

import pytest

from dlscale.launch import start
from tests.conftest import run_script


def modules_at_start(queue) -> None:
    """Runs in the forked worker: which heavy modules were there before it did anything."""
    queue.put({name: name in sys.modules for name in [*start.PRELOAD, "torch._dynamo"]})


def test_a_worker_starts_with_torch_and_dynamo_already_imported():
    # torch._dynamo is imported lazily by the first optimizer step; a worker that had to import
    # it itself would spend about 1.5 s of a core on it before training.
    ctx = start.context()
    queue = ctx.Queue()
    process = ctx.Process(target=modules_at_start, args=(queue,))
    process.start()
    found = queue.get(timeout=120)
    process.join(timeout=60)
    assert process.exitcode == 0
    assert found["torch"] and found["torch._dynamo"], found
    assert all(found.values()), found


QUIET_IMPORT = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever the caller left
sys.path.insert(0, sys.argv[1])
from dlscale.launch.start import import_quietly
import_quietly(["interrupts", "no_such_module_here", "json"])
assert "interrupts" in sys.modules and "json" in sys.modules
assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
print("imported")
"""


def test_the_servers_imports_ignore_ctrl_c_and_leave_its_handler_as_it_was(tmp_path):
    """Ctrl-C while the fork server imports reached it too (it is in the terminal's process
    group) and printed the interrupted import's traceback. A module that is Ctrl-C'd as it is
    imported stands in for the moment."""
    (tmp_path / "interrupts.py").write_text(
        "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n"
    )
    done = run_script(QUIET_IMPORT, str(tmp_path))  # it is sent SIGINT, whatever we inherited
    assert (done.returncode, done.stderr, done.stdout.strip()) == (0, "", "imported")


class _Recorded:
    """A multiprocessing context that records the processes it would start."""

    def __init__(self, method: str):
        self.method, self.started = method, []

    def get_start_method(self) -> str:
        return self.method

    def Process(self, target, daemon: bool):  # multiprocessing's name
        context = self

        class Started:
            def start(self) -> None:
                context.started.append("start")

            def join(self) -> None:
                context.started.append("join")

        return Started()


@pytest.mark.parametrize(("method", "started"), [("forkserver", ["start", "join"]), ("spawn", [])])
def test_warmed_up_waits_for_one_fork_only_where_workers_fork(monkeypatch, method, started):
    """compare and scale call it before their first timed run: under the fork server it forks
    one process and waits for its end (the server's imports done); spawned workers each pay
    their own start, so there is nothing to wait for."""
    recorded = _Recorded(method)
    monkeypatch.setattr(start, "context", lambda: recorded)
    start.warmed_up()
    assert recorded.started == started
