"""A profile of a spec with `accumulate: K`: the traced batch is one micro-batch; the device's
optimizer step runs K of them (forward, backward and copy in K times, the update and the loop
once), holds one micro-batch's activations and the step's K batches of inputs, and an epoch has
N // (K·B) steps. Every figure is worked out here from the K = 1 prediction's parts."""

import pytest
from rich.console import Console

from dlscale.profiler import profile
from dlscale.profiler.advice import verdict
from dlscale.profiler.memory import TrainingMemory
from dlscale.profiler.report import render, to_json
from dlscale.profiler.roofline import predict
from dlscale.profiler.target import resolve
from tests.unit.test_advice import device
from tests.unit.test_scaling import mlp_trace


def test_an_optimizer_step_runs_k_micro_batches_and_updates_once():
    trace, gpu = mlp_trace(batch=64), device()
    one = predict(trace, gpu, dataset_size=1000)
    four = predict(trace, gpu, dataset_size=1000, accumulate=4)
    assert four.forward_s == pytest.approx(4 * one.forward_s)
    assert four.backward_s == pytest.approx(4 * one.backward_s)
    assert four.h2d_s == pytest.approx(4 * one.h2d_s)
    assert (four.optimizer_s, four.loop_s) == (one.optimizer_s, one.loop_s)
    micro = one.forward_s + one.backward_s + one.h2d_s
    assert four.step_s == pytest.approx(one.step_s + 3 * micro)
    assert four.micro_batch_s == pytest.approx(micro)
    assert four.samples_per_s == pytest.approx(256 / four.step_s)
    # 1000 samples: 15 steps of 64, or 3 optimizer steps of 4 × 64 = 256.
    assert (one.steps_per_epoch, four.steps_per_epoch) == (15, 3)
    assert four.epoch_s == pytest.approx(3 * four.step_s)


def test_the_verdict_holds_one_micro_batchs_activations_and_the_steps_inputs():
    gib = 2**30
    # 2 + 2 + 4 GiB of state, 2 GiB of activations and 0.5 GiB of inputs for 64 samples.
    memory = TrainingMemory(2 * gib, 2 * gib, 4 * gib, 2 * gib, gib // 2, 64)
    gpu = device(memory_bytes=16 * gib)  # 0.9 usable: 14.4 GiB
    timed = predict(mlp_trace(batch=64), gpu)  # only the notes on time read it
    plain, four = (verdict(memory, timed, gpu, {}, accumulate=k) for k in (1, 4))
    assert plain.required_bytes == 10.5 * gib
    assert four.required_bytes == 8 * gib + 2 * gib + 4 * gib // 2  # 12 GiB
    assert four.fits and "largest batch_size (with accumulate: 4)" in four.advice[0]
    # The largest micro-batch B with 8 GiB + B × (2 GiB + 4 × 0.5 GiB) / 64 ≤ 14.4 GiB.
    assert four.max_batch == int((0.9 * 16 * gib - 8 * gib) / (4 * gib / 64)) == 102
    assert plain.max_batch == int((0.9 * 16 * gib - 8 * gib) / (2.5 * gib / 64)) == 163
    # At accumulate 8 the inputs alone (4 GiB) no longer fit beside the rest: 14 GiB of 14.4
    # fits, at 10 (15 GiB) not, and the offer splits each micro-batch further: 2 pieces of 32
    # (1 GiB of activations) with the step's 10 × 0.5 GiB of inputs: 14 GiB.
    ten = verdict(memory, timed, gpu, {}, accumulate=10)
    assert not ten.fits and ten.required_bytes == 15 * gib
    assert ten.advice[0].startswith(
        "batch 640 (accumulate: 10 × batch_size 64) does not fit (15 GiB needed, 14.4 GiB "
        "usable): keep batch 640 (accumulate: 10 × batch_size 64) as batch_size 32 with "
        "accumulate: 20 (peak 14 GiB), use batch_size ≤ "
    )


@pytest.fixture(scope="module")
def profiles():
    """The MLP at batch 32 on one device, traced once per K."""
    results = {}
    for k in (1, 4):
        workload = resolve("mlp", batch_size=32, dataset_size=1000)
        workload.accumulate = k
        results[k] = profile(workload, [device()])
    return results


def test_the_profile_shows_a_micro_batch_and_an_optimizer_step(profiles):
    one, four = to_json(profiles[1]), to_json(profiles[4])
    micro = one["totals"]
    step = four["totals"]["optimizer_step"]
    forward = micro["forward_flops"] + micro["forward_other_flops"]
    backward = micro["backward_flops"] + micro["backward_other_flops"]
    assert step["accumulate"] == 4 and step["batch_size"] == 128
    assert step["forward_flops"] == 4 * forward and step["backward_flops"] == 4 * backward
    assert step["step_flops"] == 4 * (forward + backward) + micro["optimizer_flops"]
    memory = micro["memory"]
    assert step["batch_bytes"] == 4 * memory["batch_bytes"]
    assert step["peak_bytes"] == memory["total_bytes"] + 3 * memory["batch_bytes"]
    (hw1,), (hw4,) = one["hardware"], four["hardware"]
    assert hw4["required_bytes"] == step["peak_bytes"]
    parts = hw1["forward_s"] + hw1["backward_s"] + hw1["h2d_s"]
    assert hw4["step_s"] == pytest.approx(hw1["step_s"] + 3 * parts)
    assert hw4["samples_per_s"] == pytest.approx(128 / hw4["step_s"])
    assert (hw1["steps_per_epoch"], hw4["steps_per_epoch"]) == (31, 7)  # 1000 // 32, // 128
    console = Console(width=200, record=True)
    render(profiles[4], console)
    text = console.export_text()
    assert "batch 32 × accumulate 4 = 128 an optimizer step" in text
    assert "per micro-batch and per optimizer step (×4)" in text
    assert "4 micro-batches of" in text
