"""What dlscale's processes do with SIGINT and SIGTERM: a signal they were started with ignored
stays ignored (a run started with `&` from a script, a sweep slot's workers), any other one
unwinds the run as Ctrl-C does."""

import signal

import pytest

from dlscale.signals import stop_on_sigterm, stop_once


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
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # once: the next one is ignored


def test_the_command_keeps_an_inherited_ignored_sigterm(restored_signals):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop_on_sigterm()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
