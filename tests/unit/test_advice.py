"""Advice consistent with the request: what was asked is never advised back, a note about a kind
of layer appears only when those layers behave that way, a zoo model's data size counts, and a
batch that does not fit is offered as accumulated micro-batches."""

import dataclasses
import math

import torch
from torch import nn

from dlscale.hardware.device import Hardware
from dlscale.profiler import profile
from dlscale.profiler.advice import accumulated_bytes, accumulation_offer, verdict
from dlscale.profiler.memory import TrainingMemory, training_memory
from dlscale.profiler.roofline import predict
from dlscale.profiler.target import resolve
from dlscale.profiler.trace import trace_step
from dlscale.units import binary_bytes as _b


def device(**changes) -> Hardware:
    values = {
        "name": "test-gpu",
        "display_name": "Test GPU",
        "kind": "gpu",
        "vendor": "test",
        "peak_flops": {"fp32": 10e12, "bf16": 40e12},
        "memory_bytes": 16 * 2**30,
        "memory_bandwidth_bytes_per_s": 500e9,
        "host_link_bytes_per_s": 10e9,
    }
    return Hardware(**{**values, **changes})


def traced(build, sample, batch, precision="fp32"):
    def adam(params):
        return torch.optim.Adam(params)

    return trace_step(build, sample, batch, precision, adam, "adam")


def test_a_bf16_request_is_not_advised_to_switch_to_bf16():
    step = traced(lambda: nn.Linear(1000, 1000), torch.zeros(1000), 4096, "bf16")
    memory = training_memory(step)
    small = device(memory_bytes=40 * 2**20)  # the static state (16 MB) fits, the batch does not
    notes = verdict(memory, predict(step, small), small, {"": "Linear"}, precision="bf16").advice
    assert "does not fit" in notes[0] and "bf16" not in notes[0]
    fp32_step = traced(lambda: nn.Linear(1000, 1000), torch.zeros(1000), 4096)
    fp32_memory = training_memory(fp32_step)
    fp32 = verdict(fp32_memory, predict(fp32_step, small), small, {"": "Linear"}).advice
    assert "bf16" in fp32[0]  # an fp32 request may still be told about it
    tiny = device(memory_bytes=8 * 2**20)  # not even the static state fits
    split = verdict(memory, predict(step, tiny), tiny, {"": "Linear"}, precision="bf16").advice
    assert "split it across" in split[0] and "bf16" not in split[0]


class Recurrent(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x):  # (B, T, H)
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def test_the_recurrent_note_appears_only_when_the_recurrent_layers_are_memory_bound():
    fast_memory = device(memory_bandwidth_bytes_per_s=1e15)  # nothing can be memory-bound
    step = traced(lambda: Recurrent(256), torch.zeros(8, 256), 64)
    prediction = predict(step, fast_memory)
    assert prediction.time_share("memory") == 0.0
    notes = verdict(training_memory(step), prediction, fast_memory, step.module_types).advice
    assert not any("memory-bound" in note for note in notes)  # an LSTM alone says nothing

    slow_memory = device(memory_bandwidth_bytes_per_s=1e8, peak_flops={"fp32": 1e15})
    prediction = predict(step, slow_memory)
    assert "lstm" in prediction.bound_layers("memory")
    notes = verdict(training_memory(step), prediction, slow_memory, step.module_types).advice
    (note,) = [note for note in notes if "memory-bound" in note]
    assert "lstm" in note  # the note names the recurrent layers that are

    linear = traced(lambda: nn.Sequential(nn.Linear(64, 64), nn.ReLU()), torch.zeros(64), 8)
    prediction = predict(linear, slow_memory)
    notes = verdict(training_memory(linear), prediction, slow_memory, linear.module_types).advice
    (note,) = [note for note in notes if "memory-bound" in note]
    assert "LSTM" not in note and "RNN" not in note  # no recurrent layer to blame


def test_a_zoo_model_with_a_dataset_size_is_told_to_stream_data_that_does_not_fit():
    workload = resolve("mlp", dataset_size=1_000_000)
    assert workload.dataset_bytes == 1_000_000 * 784 * 4  # the zoo's 784 fp32 features each
    result = profile(workload, [device(memory_bytes=2 * 2**30)])
    (note,) = [n for n in result.reports[0].verdict.advice if "does not fit beside" in n]
    assert "stream it from disk" in note
    small = profile(resolve("mlp", dataset_size=1000), [device()])
    assert not any("stream" in n for n in small.reports[0].verdict.advice)


GIB, MIB = 2**30, 2**20


def test_a_batch_that_does_not_fit_is_offered_as_accumulated_micro_batches():
    """By hand: 8 GiB of state, 16 GiB of activations at batch 256 (64 MiB a sample) and
    256 MiB of inputs; 16 GiB × 0.9 = 14.4 GiB usable. K micro-batches need
    8 + 16/K + 0.25 GiB: K = 2 needs 16.25, K = 3 does not divide 256, K = 4 needs 12.25."""
    memory = TrainingMemory(
        weights_bytes=4 * GIB,
        gradients_bytes=4 * GIB,
        optimizer_state_bytes=0,
        activations_bytes=16 * GIB,
        batch_bytes=256 * MIB,
        batch_size=256,
    )
    usable = int(16 * GIB * 0.9)
    assert accumulated_bytes(memory, 2) == int(16.25 * GIB)
    assert accumulation_offer(memory, usable) == (4, int(12.25 * GIB))
    assert accumulation_offer(memory, int(8.3 * GIB)) is None  # 1-sample pieces: 8.31 GiB


def test_accumulation_is_offered_without_trying_every_count_of_a_huge_batch(monkeypatch):
    """A batch of 10^12 samples: the offer tries only divisors of the batch that could fit,
    fewest first (not every K up to the batch: minutes at that size), and none at all beyond
    one-sample pieces when even those do not fit."""
    from dlscale.profiler import advice

    tried = []
    real = advice.accumulated_bytes
    monkeypatch.setattr(
        advice, "accumulated_bytes", lambda m, k, b=1: tried.append(k) or real(m, k, b)
    )
    huge = TrainingMemory(
        weights_bytes=GIB,
        gradients_bytes=GIB,
        optimizer_state_bytes=0,
        activations_bytes=10**12 * MIB,  # 1 MiB a sample
        batch_bytes=10**12,  # the whole step's inputs: 931 GiB, never fits 16 GiB
        batch_size=10**12,
    )
    assert accumulation_offer(huge, 16 * GIB) is None and tried == [10**12]
    # Inputs that fit: 1 MiB a sample of activations needs K ≥ 10^12 / (13 GiB / 1 MiB) ≈
    # 75.1 M, and the fewest equal pieces are the smallest divisor of 10^12 from there: 78,125,000.
    tried.clear()
    small_inputs = dataclasses.replace(huge, batch_bytes=GIB)
    k, peak = accumulation_offer(small_inputs, 16 * GIB)
    assert k == 78_125_000 and 10**12 % k == 0 and peak <= 16 * GIB
    assert real(small_inputs, 64_000_000) > 16 * GIB  # the divisor below it does not fit
    assert len(tried) <= 3


def test_a_split_is_offered_over_as_many_devices_as_the_need_and_as_the_model_allows():
    """By hand: 4 linear layers of 1,000² (weights, gradients, two Adam moments: 61.1 MiB) at
    batch 8,192 (156.3 MiB of saved activations, 31.3 MiB of inputs: 248.7 MiB in all) on a
    128 MiB device (115.2 MiB usable) need ⌈248.7 / 115.2⌉ = 3 devices: a pipeline of 3 stages
    (4 traced layers to stage). A device too small for the state alone (8 MiB: 7.2 usable, 9
    devices) asks for more devices than layers: tensor parallel of that degree instead."""
    from dlscale.profiler.advice import split_strategy

    def build():
        return nn.Sequential(*[nn.Linear(1000, 1000) for _ in range(4)])

    step = traced(build, torch.zeros(1000), 8192)
    memory = training_memory(step)
    assert [layer.name for layer in step.layers] == ["0", "1", "2", "3", "(loss)"]
    assert math.ceil(memory.total_bytes / (128 * MIB * 0.9)) == 3
    gpu = device(memory_bytes=128 * MIB)
    (note, *_) = verdict(memory, predict(step, gpu), gpu, step.module_types).advice
    assert "split the model across ≥ 3 devices (strategy: {name: pipeline, stages: 3})" in note
    tiny = device(memory_bytes=8 * MIB)
    (note, *_) = verdict(memory, predict(step, tiny), tiny, step.module_types).advice
    assert "split it across ≥ 9 devices (strategy: {name: tensor, degree: 9}" in note
    assert split_strategy(4, 4) == "{name: pipeline, stages: 4}"
    assert split_strategy(5, None) == "{name: pipeline, stages: 5}"  # layers unknown


def test_the_verdict_offers_accumulation_with_its_peak():
    step = traced(lambda: nn.Linear(1000, 1000), torch.zeros(1000), 4096, "bf16")
    memory = training_memory(step)
    small = device(memory_bytes=40 * 2**20)
    notes = verdict(memory, predict(step, small), small, {"": "Linear"}, precision="bf16").advice
    k, peak = accumulation_offer(memory, int(40 * 2**20 * 0.9))
    assert k > 1 and 4096 % k == 0 and peak <= int(40 * 2**20 * 0.9)
    offer = f"keep batch 4096 as batch_size {4096 // k} with accumulate: {k} (peak {_b(peak)})"
    assert offer in notes[0] and notes[0].startswith("batch 4096 does not fit")
