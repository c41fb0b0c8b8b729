"""Device and precision: pick the device, the autocast context, the grad scaler, peak memory."""

from __future__ import annotations

import contextlib
import resource
import sys
from collections.abc import Iterator

import torch

from dlscale.errors import UserError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """`auto` picks cuda, then mps, then cpu; an explicit device must exist."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:  # not a device string at all
        device = None
    # A name from a command line reaches here unchecked (a spec's is checked when it loads).
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"device '{name}': choose auto, cpu, cuda, cuda:N or mps")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device '{name}' asked for, but no CUDA GPU is visible here")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise UserError(f"device '{name}' asked for, but only {count} CUDA GPU(s) are visible")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"device '{name}' asked for, but Apple MPS is not available here")
    return device


def check_precision(precision: str, device: torch.device) -> None:
    """fp16 autocast needs a GPU; bf16 runs everywhere (CPU autocast included)."""
    if precision == "fp16" and device.type != "cuda":
        raise UserError(f"precision fp16 needs a CUDA GPU (device is {device}); use bf16 or fp32")


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed precision for forward and loss; weights and optimizer stay fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[precision])


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler | None:
    """fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range."""
    if precision == "fp16":
        return torch.amp.GradScaler(device.type)
    return None


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels so that a host timer measures the work, not the launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> tuple[int, str]:
    """Peak bytes and what they measure: allocated GPU memory, or the process's peak host RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    if device.type == "mps":
        return int(torch.mps.driver_allocated_memory()), "mps_driver_allocated"
    return host_peak_rss_bytes(), "host_peak_rss"


def host_peak_rss_bytes() -> int:
    """This process's peak resident memory since it started its program. Linux keeps the peak
    of whatever the process ran before exec in ru_maxrss, so a run started by a large parent
    (a test suite, a sweep slot, a notebook) would report the parent's size: VmHWM is the
    peak of this program's own memory."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # "VmHWM:  123456 kB"
    except OSError:
        pass  # no /proc (macOS): ru_maxrss, which is this program's there
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in kilobytes on Linux and in bytes on macOS.
    return int(rss if sys.platform == "darwin" else rss * 1024)


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Evaluate without touching autograd, then restore the model's training flag."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)
