"""`bench loader`: training throughput vs DataLoader workers and pinning, the starving device.

Real datasets decode and augment each sample on the host, one at a time; when that takes longer
than the device's step, the device waits. This bench trains a spec for a few steps per setting
with its training set wrapped so that every sample pays for a random resized crop, a flip, a
colour jitter and a normalisation, and reads the loop's own step-time split (data wait, host→device,
compute).
"""

from __future__ import annotations

import gc
import math
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

from dlscale.bench.io_verdict import NOISY_SPREAD, relative_spread
from dlscale.errors import UserError
from dlscale.jobspec import CheckpointSpec, LoaderSpec, Spec, parse_spec
from dlscale.train.batches import train_batches
from dlscale.train.device import resolve_device
from dlscale.train.loop import Trainer
from dlscale.train.metrics import WARMUP_STEPS

SCHEMA = "dlscale.bench.loader/1"
DEFAULT_WORKERS = (0, 1, 2)
DEFAULT_STEPS = 60
MIN_CROP_AREA = 0.35  # random-resized-crop keeps 35-100% of the image (torchvision: 8-100%)
JITTER = 0.2  # brightness and contrast are scaled by a factor drawn from [1 - JITTER, 1 + JITTER]


class PerSampleDataset(Dataset):
    """A tensor dataset read one sample at a time, with per-sample image augmentation.

    Indexing takes one index, a list of indices (what DataLoader workers receive) or an index
    tensor (what the in-process loop passes); a batch is each sample's work in turn, then stacked,
    as a DataLoader's collate would: (B, *sample_shape) inputs and (B, ...) labels.
    """

    def __init__(self, base: TensorDataset):
        self.inputs, self.labels = base.tensors
        # Augment only images (N, C, H, W) in floating point; features and tokens are copied.
        self.augment = self.inputs.ndim == 4 and self.inputs.is_floating_point()
        if self.augment:
            self.mean = self.inputs.mean(dim=(0, 2, 3)).view(-1, 1, 1)  # (C, 1, 1)
            self.std = self.inputs.std(dim=(0, 2, 3)).clamp_min(1e-6).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def sample(self, index: int) -> torch.Tensor:
        """torchvision's ImageNet training augment, on one image: (C, H, W) in and out.

        A random crop of 35-100% of the area and aspect 3/4-4/3 resized back to H×W (bilinear),
        a coin-flip mirror, brightness and contrast jitter, then per-channel normalisation.
        """
        image = self.inputs[index]  # (C, H, W)
        if not self.augment:
            return image.clone()
        _, height, width = image.shape
        area, log_aspect, top, left, flip, brightness, contrast = torch.rand(7).tolist()
        area = (MIN_CROP_AREA + (1 - MIN_CROP_AREA) * area) * height * width
        aspect = math.exp(math.log(3 / 4) + log_aspect * math.log(16 / 9))
        crop_h = max(1, min(height, round(math.sqrt(area / aspect))))
        crop_w = max(1, min(width, round(math.sqrt(area * aspect))))
        top, left = int(top * (height - crop_h + 1)), int(left * (width - crop_w + 1))
        crop = image[None, :, top : top + crop_h, left : left + crop_w]  # (1, C, h, w)
        crop = F.interpolate(crop, size=(height, width), mode="bilinear", align_corners=False)[0]
        if flip < 0.5:
            crop = crop.flip(-1)
        mean = crop.mean()
        crop = (crop - mean) * (1 + JITTER * (2 * contrast - 1)) + mean * (
            1 + JITTER * (2 * brightness - 1)
        )
        return (crop - self.mean) / self.std  # (C, H, W)

    def __getitem__(self, index):
        if isinstance(index, int):
            return self.sample(index), self.labels[index]
        indices = index.tolist() if isinstance(index, torch.Tensor) else list(index)
        batch = torch.stack([self.sample(i) for i in indices])  # (B, *sample_shape)
        return batch, self.labels[indices]


def default_loader_spec(batch_size: int = 64) -> Spec:
    """CIFAR-shaped synthetic images (3×32×32) into a one-hidden-layer MLP.

    The model is deliberately cheap (~0.4 GFLOP a step at batch 64) so that, as on a GPU, the
    per-sample loading is not hidden behind compute.
    """
    return parse_spec(
        {
            "name": "bench-loader",
            "model": {"name": "mlp", "kwargs": {"hidden": [256]}},
            "data": {"name": "synthetic", "shape": [3, 32, 32], "num_samples": 4096},
            "batch_size": batch_size,
            "steps": DEFAULT_STEPS,
        },
        source="bench loader",
    )


def loader_variant(spec: Spec, workers: int, pin_memory: bool, steps: int) -> Spec:
    """The spec with these loader settings, run for `steps` steps, writing no checkpoints."""
    loader = LoaderSpec(
        workers=workers,
        pin_memory=pin_memory,
        prefetch=spec.loader.prefetch if workers > 0 else None,
    )
    return spec.model_copy(
        update={"loader": loader, "steps": steps, "epochs": None, "checkpoint": CheckpointSpec()}
    )


def measure_setting(
    spec: Spec, workers: int, pin_memory: bool, steps: int, per_sample: bool
) -> dict:
    """Train `steps` steps with one loader setting: steady-state throughput and step-time split.

    The first WARMUP_STEPS steps (worker start-up, allocator growth) are left out, as in the run
    record's steady figures; the rest come from the loop's per-step records (every step is
    recorded up to 500 steps, an even sample of them beyond).
    """
    variant = loader_variant(spec, workers, pin_memory, steps)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(variant, Path(run_dir))
        if per_sample:
            trainer.data.train = PerSampleDataset(trainer.data.train)
            trainer.train_loader = train_batches(
                variant, trainer.data.train, trainer.sampler, trainer.device
            )
        t_start = time.perf_counter()
        while trainer.step < trainer.plan.total_steps:
            trainer.run_epoch(trainer.step // trainer.plan.steps_per_epoch)
        wall_s = time.perf_counter() - t_start
        records = [r for r in trainer.history.steps.records if r["step"] > WARMUP_STEPS]
        device = str(trainer.device)
        del trainer  # persistent DataLoader workers exit with their loader
        gc.collect()
    assert records, "run_loader_bench asks for more steps than the warm-up"
    step_s = sum(r["step_s"] for r in records)
    spread = relative_spread([r["step_s"] for r in records])
    return {
        "loading": "per-sample" if per_sample else "in-memory",
        "workers": workers,
        "pin_memory": pin_memory,
        "device": device,
        "steps": steps,
        "samples_per_s": len(records) * variant.batch_size / step_s,
        "step_time_s": step_s / len(records),
        # How far its steps disagree: over NOISY_SPREAD, something else ran while it was timed.
        "step_spread": spread,
        "noisy": spread > NOISY_SPREAD,
        "data_wait_share": sum(r["data_wait_s"] for r in records) / step_s,
        "h2d_share": sum(r["h2d_s"] for r in records) / step_s,
        "compute_share": sum(r["compute_s"] for r in records) / step_s,
        "wall_s": wall_s,
    }


def run_loader_bench(
    spec: Spec | None = None,
    workers: Iterable[int] = DEFAULT_WORKERS,
    steps: int = DEFAULT_STEPS,
) -> dict:
    """A compute-only baseline, then every worker count × pin setting with per-sample loading."""
    spec = spec or default_loader_spec()
    workers = sorted(set(workers))
    if not workers or workers[0] < 0:
        raise UserError("worker counts must be integers ≥ 0")
    if steps < WARMUP_STEPS + 2:
        raise UserError(
            f"steps must be at least {WARMUP_STEPS + 2} (the first {WARMUP_STEPS} are warm-up)"
        )
    device = resolve_device(spec.device)
    pins = (False, True) if device.type == "cuda" else (False,)
    rows = [measure_setting(spec, 0, False, steps, per_sample=False)]
    for count in workers:
        for pin in pins:
            rows.append(measure_setting(spec, count, pin, steps, per_sample=True))
    note = None
    if device.type != "cuda":
        note = (
            f"pin_memory only speeds copies to a CUDA GPU; on {device.type} only "
            "pin_memory=False is run"
        )
    return {
        "schema": SCHEMA,
        "spec": spec.name,
        "model": spec.model.name,
        "batch_size": spec.batch_size,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "steps_per_setting": steps,
        "warmup_steps_excluded": WARMUP_STEPS,
        "note": note,
        "rows": rows,
    }
