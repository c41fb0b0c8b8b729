"""The small training runs tests build and compare: the base spec each test module varies, and
the weights a run ends on."""

from pathlib import Path

import torch

# Plain SGD: most equality tests compare a parallel run with one process, and SGD's update is
# the same sum in both.
SGD = {"name": "sgd", "lr": 0.05}


def synthetic_images(num_samples: int) -> dict:
    """A data section of random 1×28×28 images: LeNet trains on a few hundred in seconds."""
    return {"name": "synthetic", "shape": [1, 28, 28], "num_samples": num_samples}


def base_spec(name: str, data: dict, model: dict | None = None, **fields) -> dict:
    """A job spec as its YAML file gives it, for a test module to vary with `{**BASE, ...}`: the
    name, the model (LeNet unless given), the data section, then the fields the module fixes
    (batch_size, steps or epochs, optimizer, device, seed), in that order."""
    return {"name": name, "model": model or {"name": "lenet"}, "data": data, **fields}


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model's weights in a run's newest checkpoint."""
    checkpoint = sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1]
    return torch.load(checkpoint, weights_only=True)["model"]
