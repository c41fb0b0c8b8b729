"""Keeping freed memory on a CPU (train/allocator.py): a training step's large new tensors stop
faulting their pages in, counted in page faults (no timing); the loop sets it from the spec."""

import json
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dlscale.jobspec import parse_spec
from dlscale.train import loop
from dlscale.train.allocator import _mallopt

# Three new 64 MiB tensors a step when memory is released: the weight's gradient and Adam's two
# temporaries (sqrt and the division).
STEPS = textwrap.dedent(
    """
    import json, resource, sys, torch
    from dlscale.train.allocator import keep_freed_memory
    applied = keep_freed_memory(sys.argv[1] == "keep")
    torch.set_num_threads(1)
    layer = torch.nn.Linear(4096, 4096)
    optimizer = torch.optim.Adam(layer.parameters())
    x = torch.randn(2, 4096)
    def step():
        layer(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    for _ in range(3):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        step()
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5
    print(json.dumps({"applied": applied, "faults": faults}))
    """
)


def faults_per_step(mode: str) -> dict:
    found = subprocess.run(
        [sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True
    )
    return json.loads(found.stdout)


@pytest.mark.skipif(_mallopt() is None, reason="the C library here is not glibc")
def test_kept_memory_stops_the_page_faults_of_large_new_tensors():
    released, kept = faults_per_step("release"), faults_per_step("keep")
    assert released["applied"] and kept["applied"]
    pages = 3 * 64 * 2**20 // resource.getpagesize()
    assert released["faults"] >= 0.9 * pages  # each new tensor faulted in, every step
    assert kept["faults"] < released["faults"] / 5  # measured: 3,277 against 49,155


SPEC = {
    "name": "kept",
    "model": {"name": "mlp", "kwargs": {"hidden": [8]}},
    "data": {"name": "synthetic", "shape": [4], "num_samples": 64},
    "batch_size": 8,
    "steps": 1,
    "device": "cpu",
}


@pytest.mark.parametrize("keep", [True, False])
def test_the_loop_keeps_freed_memory_as_the_spec_says(keep, tmp_path: Path, monkeypatch):
    calls = []
    monkeypatch.setattr(loop, "keep_freed_memory", lambda: calls.append(True))
    loop.Trainer(parse_spec({**SPEC, "keep_freed_memory": keep}), tmp_path)
    assert calls == ([True] if keep else [])


def test_the_setting_is_kept_by_default_and_changes_no_runs_identity():
    default = parse_spec(SPEC)
    released = parse_spec({**SPEC, "keep_freed_memory": False})
    assert default.keep_freed_memory and not released.keep_freed_memory
    assert default.spec_hash() == released.spec_hash()  # a run resumes either way
