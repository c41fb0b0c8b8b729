"""Training memory of a traced step: weights, gradients, optimizer state, saved activations."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dlscale.profiler.trace import StepTrace, meta_model_state

FP32_BYTES = 4  # master weights and their gradients stay fp32, mixed precision included
# One element, by number format; int4 packs two elements a byte.
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1, "int4": 0.5}


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes a training step holds at its peak (end of forward), by category."""

    weights_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int  # measured from the optimizer's own state after one step
    activations_bytes: int  # saved for backward, as autograd saved them
    batch_bytes: int  # the input batch and targets on the device
    batch_size: int

    @property
    def static_bytes(self) -> int:
        """What does not grow with the batch."""
        return self.weights_bytes + self.gradients_bytes + self.optimizer_state_bytes

    @property
    def per_sample_bytes(self) -> float:
        """What grows with the batch, per sample (activations scale linearly with batch size)."""
        return (self.activations_bytes + self.batch_bytes) / self.batch_size

    @property
    def total_bytes(self) -> int:
        return self.static_bytes + self.activations_bytes + self.batch_bytes

    def step_peak_bytes(self, accumulate: int = 1) -> int:
        """The peak when an optimizer step runs `accumulate` micro-batches of this batch: one
        micro-batch's activations at a time, but the loop copies the whole step's inputs (K
        batches) to the device at once (train/step.py splits them there)."""
        return self.total_bytes + (accumulate - 1) * self.batch_bytes

    def to_dict(self) -> dict:
        return {**asdict(self), "static_bytes": self.static_bytes, "total_bytes": self.total_bytes}


@dataclass(frozen=True)
class ModelState:
    """What a model holds whatever its batch: TrainingMemory's static part, without a trace."""

    weights_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_state_bytes


def model_state(build, make_optimizer) -> ModelState:
    """Weights, gradients and optimizer state of `build()`, counted on the meta device."""
    params, trainable, state_bytes = meta_model_state(build, make_optimizer)
    return ModelState(params * FP32_BYTES, trainable * FP32_BYTES, state_bytes)


def training_memory(trace: StepTrace) -> TrainingMemory:
    return TrainingMemory(
        weights_bytes=trace.params * FP32_BYTES,
        gradients_bytes=trace.trainable_params * FP32_BYTES,
        optimizer_state_bytes=trace.optimizer_state_bytes,
        activations_bytes=trace.saved_activation_bytes,
        batch_bytes=trace.batch_bytes,
        batch_size=trace.batch_size,
    )
