"""Does it fit, and what to do if not: a verdict per device, following the field's rules."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dlscale.hardware.spec import Hardware
from dlscale.profiler.memory import TrainingMemory
from dlscale.profiler.roofline import Prediction
from dlscale.units import binary_bytes as _b

# The share of device memory a training process can really use: the CUDA context, the
# allocator's caching and fragmentation, and library workspaces take the rest.
USABLE_MEMORY_FRACTION = 0.9
MEMORY_BOUND_SHARE = 0.5  # above this share of step time, bandwidth matters more than FLOPs
OVERHEAD_BOUND_SHARE = 0.5
RECURRENT_LAYERS = {"LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell"}


@dataclass
class Verdict:
    hardware: str
    fits: bool
    required_bytes: int
    usable_bytes: int
    max_batch: int  # 0: not even one sample fits
    advice: list[str] = field(default_factory=list)


def verdict(
    memory: TrainingMemory,
    prediction: Prediction,
    hardware: Hardware,
    layer_types: list[str],
    dataset_bytes: int | None = None,
    data_from_disk: bool = False,
) -> Verdict:
    usable = int(hardware.memory_bytes * USABLE_MEMORY_FRACTION)
    room = usable - memory.static_bytes
    max_batch = max(0, math.floor(room / memory.per_sample_bytes)) if room > 0 else 0
    result = Verdict(
        hardware=hardware.name,
        fits=memory.total_bytes <= usable,
        required_bytes=memory.total_bytes,
        usable_bytes=usable,
        max_batch=max_batch,
    )
    data = dataset_bytes, data_from_disk
    result.advice = _advice(memory, prediction, hardware, layer_types, data, result)
    return result


def split_advice(static_bytes: int, usable_bytes: int) -> str:
    """When weights, gradients and optimizer state alone exceed a device: split or shrink."""
    devices = math.ceil(static_bytes / usable_bytes)
    return (
        "the model does not fit: weights, gradients and optimizer state alone need "
        f"{_b(static_bytes)} of {_b(usable_bytes)} usable; split it across ≥ {devices} "
        f"devices (strategy: {{name: pipeline, stages: {max(devices, 2)}}}, with "
        "max_memory_per_worker set to the device's memory) or shrink it (fewer parameters, "
        "an optimizer with less state, bf16)"
    )


def loader_rate(memory: TrainingMemory, prediction: Prediction) -> str:
    """What the device consumes, a batch per predicted step: samples/s and decoded MB/s."""
    samples_per_s = memory.batch_size / prediction.step_s
    bytes_per_s = memory.batch_bytes / prediction.step_s  # decoded, as copied to the device
    return f"{samples_per_s:,.0f} samples/s ({bytes_per_s / 1e6:,.1f} MB/s decoded)"


def disk_rate_advice(memory: TrainingMemory, prediction: Prediction) -> str:
    return (
        "the data set is read from disk while training: the loader must deliver "
        f"{loader_rate(memory, prediction)} to keep up; `dlscale bench io SPEC` measures "
        "whether storage and decoding do"
    )


def stream_advice(
    dataset_bytes: int, memory: TrainingMemory, prediction: Prediction, hardware: Hardware
) -> str:
    """A data set too large for the device beside the model: where to stream it from, and the
    rate a batch per predicted step asks of the loader."""
    # A GPU's data may still sit in the host's memory (batches are copied each step); on a CPU
    # the device's memory is the host's, so only disk is left.
    where = "keep it in host memory if it fits there, else " if hardware.kind != "cpu" else ""
    return (
        f"the data set ({_b(dataset_bytes)}) does not fit beside the model: {where}stream it "
        "from disk as WebDataset shards (`dlscale data convert`; data: {name: webdataset, "
        "urls: shards/train-{000000..000009}.tar}), a Hugging Face dataset saved to disk "
        "(data: {name: hf, path: DIR}) or an image folder (data: {name: images, path: DIR}); "
        f"to keep up, the loader must deliver {loader_rate(memory, prediction)}"
    )


def _advice(memory, prediction, hardware, layer_types, data, result) -> list[str]:
    notes = []
    dataset_bytes, data_from_disk = data
    usable = result.usable_bytes
    if memory.static_bytes > usable:
        notes.append(split_advice(memory.static_bytes, usable))
    elif not result.fits:
        notes.append(
            f"batch {memory.batch_size} does not fit ({_b(memory.total_bytes)} needed, "
            f"{_b(usable)} usable): use batch ≤ {result.max_batch:,}, bf16 activations, or "
            "split the model across devices (strategy: {name: pipeline, stages: 2})"
        )
    else:
        notes.append(
            f"fits: {_b(memory.total_bytes)} of {_b(usable)} usable; largest batch that "
            f"fits ≈ {result.max_batch:,}"
        )
    if data_from_disk:  # streamed already: what matters is whether it arrives fast enough
        notes.append(disk_rate_advice(memory, prediction))
    elif dataset_bytes is not None and dataset_bytes > usable - memory.total_bytes:
        notes.append(stream_advice(dataset_bytes, memory, prediction, hardware))
    if RECURRENT_LAYERS & set(layer_types) or prediction.time_share("memory") > MEMORY_BOUND_SHARE:
        notes.append(
            "most of the time is memory-bound (small matrix products, as in RNN/LSTM layers): "
            f"memory bandwidth ({hardware.memory_bandwidth_bytes_per_s / 1e9:,.0f} GB/s here) "
            "matters more than peak FLOP/s"
        )
    if prediction.time_share("overhead") > OVERHEAD_BOUND_SHARE:
        notes.append(
            "per-op launch overhead dominates: the layers are too small for this device; a "
            "larger batch (or a compiled model) keeps it busy"
        )
    return notes
