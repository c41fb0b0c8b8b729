"""What dlscale's processes do with SIGINT and SIGTERM: a signal they were started with ignored
stays ignored (a run started with `&` from a script, a sweep slot's workers), any other one
unwinds the run as Ctrl-C does."""

import signal

import pytest

from dlscale import signals
from dlscale.signals import stop_on_sigterm, stop_once
from tests.conftest import run_script


@pytest.fixture
def restored_signals():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def test_a_worker_keeps_an_inherited_ignored_sigint(restored_signals):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    stop_once()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert callable(signal.getsignal(signal.SIGTERM))  # a stop from its launcher still unwinds


def test_a_worker_unwinds_on_sigint_where_it_was_not_ignored(restored_signals):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stop_once()
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    # Once: the next one is ignored (a handler that does nothing, not the default that would
    # end this test process).
    assert signal.getsignal(signal.SIGTERM) is signals._swallow
    assert signal.getsignal(signal.SIGINT) is signals._swallow
    signal.raise_signal(signal.SIGTERM)


def test_the_command_keeps_an_inherited_ignored_sigterm(restored_signals):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop_on_sigterm()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


BOTH_AT_ONCE = """
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever the caller left
signal.signal(signal.SIGTERM, signal.SIG_DFL)
from dlscale.signals import stop_once
stop_once()
both = {signal.SIGINT, signal.SIGTERM}
signal.pthread_sigmask(signal.SIG_BLOCK, both)
signal.raise_signal(signal.SIGINT)  # pending, both: delivered together at the unblock
signal.raise_signal(signal.SIGTERM)
try:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, both)
    for _ in range(1000):
        pass
    print("not stopped")
except KeyboardInterrupt as stop:
    try:
        for _ in range(1000):  # the cleanup runs on
            pass
        print("unwound by", type(stop).__name__)
    except OSError as exc:
        print("cleanup broken:", exc)
"""


def test_a_worker_given_sigint_and_sigterm_together_unwinds_once_and_cleanly():
    """Ctrl-C reaches a worker with the launcher's SIGTERM right behind it. The first raises;
    the second, caught by the process before the first's handler set it ignored, used to raise
    OSError("Signal 15 ignored due to race condition") in the middle of the cleanup (a
    traceback printed by each ddp worker)."""
    done = run_script(BOTH_AT_ONCE)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.strip() == "unwound by KeyboardInterrupt"


CTRL_C_AT_START = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever the caller left


class CtrlC:  # Ctrl-C lands while the command imports its modules
    def find_spec(self, name, path=None, target=None):
        if name == "dlscale.cli.main":
            os.kill(os.getpid(), signal.SIGINT)
        return None


sys.meta_path.insert(0, CtrlC())
from dlscale.cli.entry import main
main()
"""


def test_ctrl_c_while_the_command_starts_is_one_line_and_exit_130():
    done = run_script(CTRL_C_AT_START)
    assert (done.returncode, done.stderr) == (130, "dlscale: interrupted while starting\n")
