"""The environment a run happened in: versions, CPU, GPU, threads; recorded in run.json."""

from __future__ import annotations

import os
import platform
from importlib import metadata

import torch

_PACKAGES = ("dlscale", "torch", "numpy", "pydantic", "scikit-learn", "typer", "rich", "ray")


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    gpu = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = {
            "name": props.name,
            "memory_bytes": props.total_memory,
            "count": torch.cuda.device_count(),
        }
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "gpu": gpu,
    }
