"""Does it fit, and what to do if not: a verdict per device, following the field's rules."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dlscale.hardware.device import Hardware
from dlscale.profiler.memory import TrainingMemory
from dlscale.profiler.recorder import LOSS
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
    module_types: dict[str, str],
    dataset_bytes: int | None = None,
    data_from_disk: bool = False,
    precision: str = "fp32",
    accumulate: int = 1,
) -> Verdict:
    """`module_types`: module name -> class name (StepTrace.module_types); `precision`: the
    training precision asked for, never advised back; `accumulate`: micro-batches of the traced
    batch per optimizer step (the step's K batches of inputs sit on the device together, so the
    largest batch that fits is a micro-batch's, with K times its inputs)."""
    usable = int(hardware.memory_bytes * USABLE_MEMORY_FRACTION)
    room = usable - memory.static_bytes
    per_sample = (memory.activations_bytes + accumulate * memory.batch_bytes) / memory.batch_size
    max_batch = max(0, math.floor(room / per_sample)) if room > 0 else 0
    required = memory.step_peak_bytes(accumulate)
    result = Verdict(
        hardware=hardware.name,
        fits=required <= usable,
        required_bytes=required,
        usable_bytes=usable,
        max_batch=max_batch,
    )
    data = dataset_bytes, data_from_disk
    result.advice = _advice(
        memory, prediction, hardware, module_types, data, result, precision, accumulate
    )
    return result


def split_strategy(devices: int, layers: int | None = None) -> str:
    """The strategy that spreads a model over `devices`: a pipeline of that many stages, or,
    where the model has fewer `layers` to stage than that, tensor parallel of that degree (its
    layers split instead of staged)."""
    if layers is not None and devices > layers:
        return f"{{name: tensor, degree: {devices}}}"
    return f"{{name: pipeline, stages: {devices}}}"


def half_precision(hardware) -> str:
    """The half precision to offer on `hardware`: fp16 where it has fp16 units and no bf16 (a
    V100), else bf16."""
    peaks = hardware.peak_flops
    return "fp16" if "fp16" in peaks and "bf16" not in peaks else "bf16"


def split_advice(
    static_bytes: int,
    usable_bytes: int,
    precision: str = "fp32",
    layers: int | None = None,
    half: str = "bf16",
) -> str:
    """When weights, gradients and optimizer state alone exceed a device: split or shrink.
    `layers`: the model's leaf modules, where known (a pipeline has no more stages); `half`:
    the half precision the device runs (`half_precision`)."""
    devices = math.ceil(static_bytes / usable_bytes)
    # Mixed precision keeps fp32 master weights, gradients and state: bf16 shrinks this only
    # where the request is not already bf16/fp16 (then it halves the activations, not this).
    shrink = "fewer parameters, an optimizer with less state" + (
        f", {half}" if precision == "fp32" else ""
    )
    return (
        "the model does not fit: weights, gradients and optimizer state alone need "
        f"{_b(static_bytes)} of {_b(usable_bytes)} usable; split it across ≥ {devices} "
        f"devices (strategy: {split_strategy(max(devices, 2), layers)}, with "
        f"max_memory_per_worker set to the device's memory) or shrink it ({shrink})"
    )


def accumulated_bytes(memory: TrainingMemory, accumulate: int, batches: int = 1) -> int:
    """A step's peak with the batch run as `accumulate` micro-batches: the saved activations
    of one micro-batch (they scale with the batch), and the whole step's inputs (`batches` of
    the traced batch: more than one where the spec already accumulates), which the loop copies
    to the device at once before cutting them."""
    activations = math.ceil(memory.activations_bytes / accumulate)
    return memory.static_bytes + activations + batches * memory.batch_bytes


def accumulation_offer(
    memory: TrainingMemory, usable_bytes: int, batches: int = 1
) -> tuple[int, int] | None:
    """(K, peak bytes) for the fewest micro-batches that keep the batch and fit `usable_bytes`:
    K divides the batch (equal micro-batches), so the step still sees the whole batch; None
    when even micro-batches of one sample do not fit. `batches`: the step's inputs, in traced
    batches (the spec's own accumulate)."""
    batch = memory.batch_size
    if batch < 2 or accumulated_bytes(memory, batch, batches) > usable_bytes:
        return None  # one-sample pieces are the smallest peak there is
    # The peak falls as K grows: no K below the one that leaves room for its activations can
    # fit, so only the divisors of the batch from there are tried, fewest micro-batches first
    # (from the batch's prime factors: a batch of 10^12 is not 10^12 tries).
    room = usable_bytes - memory.static_bytes - batches * memory.batch_bytes
    fewest = max(2, -(-memory.activations_bytes // room)) if room > 0 else batch  # exact ceiling
    for accumulate in _divisors_from(batch, fewest):
        peak = accumulated_bytes(memory, accumulate, batches)
        if peak <= usable_bytes:
            return accumulate, peak
    return None


# Trial division stops here: a cofactor left above it is taken as prime (a batch that large with
# two such factors is offered fewer divisors, each still a divisor).
TRIAL_DIVISION_LIMIT = 10**6


def _divisors_from(n: int, least: int) -> list[int]:
    """The divisors of `n` from `least` up, in increasing order, from its prime factors."""
    factors: dict[int, int] = {}
    rest, prime = n, 2
    while prime * prime <= rest and prime <= TRIAL_DIVISION_LIMIT:
        while rest % prime == 0:
            factors[prime] = factors.get(prime, 0) + 1
            rest //= prime
        prime += 1 if prime == 2 else 2
    if rest > 1:
        factors[rest] = factors.get(rest, 0) + 1
    divisors = [1]
    for prime, power in factors.items():
        divisors = [d * prime**e for d in divisors for e in range(power + 1)]
    return sorted(d for d in divisors if d >= least)


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


def _advice(
    memory, prediction, hardware, module_types, data, result, precision, accumulate=1
) -> list[str]:
    notes = []
    dataset_bytes, data_from_disk = data
    usable = result.usable_bytes
    # A pipeline's stages are runs of the traced layers (scaling._stages): at most that many.
    layers = sum(1 for layer in prediction.layers if layer.name != LOSS)
    batch, required = memory.batch_size, result.required_bytes
    # With the spec's accumulate K, "batch" is the step's K × batch_size samples.
    step_batch = f"batch {batch * accumulate}" + (
        f" (accumulate: {accumulate} × batch_size {batch})" if accumulate > 1 else ""
    )
    if memory.static_bytes > usable:
        notes.append(
            split_advice(memory.static_bytes, usable, precision, layers, half_precision(hardware))
        )
    elif not result.fits:
        bf16 = f"{half_precision(hardware)} activations, " if precision == "fp32" else ""
        devices = max(2, math.ceil(required / usable))  # each holding its share of the need
        offer = accumulation_offer(memory, usable, accumulate)
        keep = ""
        if offer is not None:  # the same batch per optimizer step, in pieces that fit
            k, peak = offer
            keep = (
                f"keep {step_batch} as batch_size {batch // k} with "
                f"accumulate: {k * accumulate} (peak {_b(peak)}), "
            )
        notes.append(
            f"{step_batch} does not fit ({_b(required)} needed, "
            f"{_b(usable)} usable): {keep}use {'batch' if accumulate == 1 else 'batch_size'} "
            f"≤ {result.max_batch:,}, {bf16}or "
            f"split the model across ≥ {devices} devices (strategy: "
            f"{split_strategy(devices, layers)})"
        )
    else:
        largest = "batch" if accumulate == 1 else f"batch_size (with accumulate: {accumulate})"
        notes.append(
            f"fits: {_b(required)} of {_b(usable)} usable; largest {largest} that "
            f"fits ≈ {result.max_batch:,}"
        )
    if data_from_disk:  # streamed already: what matters is whether it arrives fast enough
        notes.append(disk_rate_advice(memory, prediction))
    elif dataset_bytes is not None and dataset_bytes > usable - memory.total_bytes:
        notes.append(stream_advice(dataset_bytes, memory, prediction, hardware))
    memory_note = _memory_bound_note(prediction, hardware, module_types)
    if memory_note:
        notes.append(memory_note)
    if prediction.time_share("overhead") > OVERHEAD_BOUND_SHARE:
        notes.append(
            "per-op launch overhead dominates: the layers are too small for this device; a "
            "larger batch (or a compiled model) keeps it busy"
        )
    return notes


def _memory_bound_note(prediction, hardware, module_types: dict[str, str]) -> str | None:
    """Bandwidth over FLOP/s, when most of the time is memory-bound or the recurrent layers
    are (their per-time-step products are small); the recurrent ones named only when they are."""
    recurrent = [
        layer.name
        for layer in prediction.layers
        if layer.bound == "memory" and module_types.get(layer.name) in RECURRENT_LAYERS
    ]
    mostly = prediction.time_share("memory") > MEMORY_BOUND_SHARE
    if not (mostly or recurrent):
        return None
    bandwidth = f"memory bandwidth ({hardware.memory_bandwidth_bytes_per_s / 1e9:,.0f} GB/s here)"
    if recurrent:
        named = ", ".join(recurrent[:3]) + (" ..." if len(recurrent) > 3 else "")
        why = f"the recurrent layers ({named}) are memory-bound: small matrix products per step"
        lead = f"most of the time is memory-bound and {why}" if mostly else why
    else:
        lead = "most of the time is memory-bound"
    return f"{lead}; {bandwidth} matters more than peak FLOP/s"
