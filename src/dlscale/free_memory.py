"""What memory a new allocation can take now, on a device: for every layer that must refuse work
that would not fit (a bench's sizes, a spec's synthetic data, a run's processes) before it
allocates, as errors.py is for every layer's failures."""

from __future__ import annotations

import os

import torch


def available_memory_bytes(device: torch.device) -> int:
    """Memory a new allocation can take now: free GPU memory, or the host's MemAvailable, at
    most DLSCALE_MEMORY_BYTES where that is set (a service job's share: its cgroup's limit)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    share = os.environ.get("DLSCALE_MEMORY_BYTES", "")
    host = _host_available_bytes()
    return min(host, int(share)) if share.isdigit() else host


def _host_available_bytes() -> int:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
