"""The local task pool: long-lived slot processes that run task after task; a task that
fails, crashes its process or is cancelled ends alone, and its slot starts a fresh process."""

import itertools
import os
import time

import pytest

from dlscale.launch.base import Resources
from dlscale.launch.pool import LocalPool
from dlscale.launch.start import context as start_context


def whoami(context, payload):
    return os.getpid()


def crash(context, payload):
    os._exit(3)  # as a segfault or the OOM killer would: no exception, no result


def raise_error(context, payload):
    raise ValueError("bad trial")


def sleep(context, payload):
    time.sleep(payload)
    return "slept"


def load_digits(context, payload):
    from dlscale.data import build_data
    from dlscale.data.cache import counts, keep_loaded
    from dlscale.jobspec import parse_spec

    keep_loaded()  # as a sweep trial does
    data = {"name": "digits", "fold": {"folds": 3, "index": payload}}
    spec = parse_spec({"name": "d", "model": {"name": "mlp"}, "batch_size": 8, "data": data})
    bundle = build_data(spec.data, spec.seed)
    return len(bundle.val), dict(counts)


def finish(pool: LocalPool, timeout_s: float = 60.0) -> dict:
    """Every running task's TaskDone, by key."""
    done = {}
    deadline = time.monotonic() + timeout_s
    while pool.running and time.monotonic() < deadline:
        for ended in pool.wait(0.2):
            done[ended.key] = ended
    assert not pool.running, "tasks did not end"
    return done


@pytest.fixture
def pool():
    made = LocalPool(1, Resources(cpus=1.0))
    yield made
    made.close()


def test_a_slot_runs_task_after_task_in_one_process(pool: LocalPool):
    times = []
    for number in range(4):
        pool.submit(f"t{number}", whoami, None)
        times.append(finish(pool)[f"t{number}"])
    pids = [done.value for done in times]
    assert len(set(pids)) == 1 and pids[0] != os.getpid() and pool.started == 1
    assert all(t.slot == 0 for t in times)
    assert all(a.began <= a.ended <= b.began for a, b in itertools.pairwise(times))


@pytest.mark.parametrize(
    ("fn", "why"),
    [(crash, "process exited with code 3"), (raise_error, "ValueError: bad trial")],
    ids=["crash", "exception"],
)
def test_a_failing_task_fails_alone_and_its_slot_gets_a_fresh_process(pool, fn, why):
    pool.submit("first", whoami, None)
    first = finish(pool)["first"].value
    pool.submit("bad", fn, None)
    bad = finish(pool)["bad"]
    assert not bad.ok and why in bad.value
    pool.submit("after", whoami, None)
    after = finish(pool)["after"]
    assert after.ok and after.value != first and pool.started == 2


def test_a_cancelled_task_stops_and_the_next_runs_on_a_fresh_process(pool: LocalPool):
    pool.submit("long", sleep, 60)
    time.sleep(0.5)
    pool.cancel("long")
    assert pool.running == []
    pool.submit("next", sleep, 0)
    assert finish(pool)["next"].value == "slept" and pool.started == 2


def test_a_slot_keeps_the_data_its_tasks_read(pool: LocalPool):
    """Three folds of the digits in one slot: read from scikit-learn once, cut three times."""
    seen = []
    for fold in range(3):
        pool.submit(f"fold-{fold}", load_digits, fold)
        seen.append(finish(pool)[f"fold-{fold}"].value)
    assert sum(size for size, _ in seen) == 1437  # three distinct folds of the training part
    assert seen[-1][1] == {"loads": 1, "hits": 2}


class StoppedBeforeStart(start_context().Process):
    """A slot process whose start a Ctrl-C cuts short (while the forkserver answers);
    module-level, as the forkserver pickles the process it starts."""

    def start(self):
        raise KeyboardInterrupt


class StoppedAfterStart(start_context().Process):
    """A slot process that started, then a Ctrl-C before the pool's next line."""

    def start(self):
        super().start()
        raise KeyboardInterrupt


@pytest.mark.parametrize("kind", [StoppedBeforeStart, StoppedAfterStart], ids=["before", "after"])
def test_ctrl_c_while_a_slot_process_starts_leaves_a_pool_that_closes(monkeypatch, kind):
    """A Ctrl-C that lands while the forkserver starts a slot's process (the sweep's next
    trial) unwinds the sweep; closing the pool after it must not trip on the unstarted process
    (it did: 'can only join a started process', a traceback and exit 1 instead of 130), and a
    process that did start just before the stop is stopped with it."""
    made = LocalPool(1, Resources(cpus=1.0))
    real_process = made.ctx.Process
    made_processes = []

    def process(*args, **kwargs):
        made_processes.append(kind(*args, **kwargs))
        return made_processes[-1]

    monkeypatch.setattr(made.ctx, "Process", process)
    with pytest.raises(KeyboardInterrupt):
        made.submit("t0", whoami, None)
    (interrupted,) = made_processes
    assert (interrupted.pid is not None) == (kind is StoppedAfterStart)
    assert not interrupted.is_alive()
    made.close()
    assert made.running == [] and made.started == 0
    monkeypatch.setattr(made.ctx, "Process", real_process)
    made.submit("t1", whoami, None)  # the slot is usable again
    done = finish(made)
    assert done["t1"].ok and made.started == 1
    made.close()
