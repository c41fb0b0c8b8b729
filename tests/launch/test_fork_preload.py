"""Local workers fork from a server that has already imported what their first step needs."""

import sys

from dlscale.launch import start


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
