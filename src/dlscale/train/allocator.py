"""Whether a CPU training process keeps the memory it frees, or hands large blocks back to the
kernel.

torch's CPU tensors come from the C library's malloc. glibc's serves a request of 32 MiB or more
(its `DEFAULT_MMAP_THRESHOLD_MAX` on a 64-bit host; less before its dynamic threshold has grown)
with a fresh mmap and unmaps it when freed, so every step that makes such a tensor (a large
layer's weight gradient, the optimizer's temporaries) faults its pages in again, zeroed by the
kernel: on the 2-core development machine 0.42–0.48 ns a byte, and inside VGG-16's steps up to
three times that. Keeping freed memory (no mmap for large blocks, no trimming of the heap's top
below 2 GiB) lets the next step reuse the pages already faulted in, as a GPU's caching allocator
does: a step of VGG-16 at batch 2 ran 2.39× faster, AlexNet at batch 4 1.79×, ResNet-50 at batch
4 1.01× (`benchmarks/keep_freed_memory.py`, docs/performance.md). The cost: a process's resident
memory stays at its peak between steps instead of falling back.

glibc only (Linux); elsewhere nothing is changed and the functions say so by returning False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
# Keeping: no block from mmap; the heap's top given back only past 2 GiB free (mallopt takes an
# int). Releasing: glibc's own limits as a long-running process settles on them (the mmap
# threshold at its dynamic maximum, the top trimmed past twice that, mmap allowed as by default).
KEEP = {M_MMAP_MAX: 0, M_TRIM_THRESHOLD: 2**31 - 1}
RELEASE = {M_MMAP_MAX: 65536, M_MMAP_THRESHOLD: 32 * 2**20, M_TRIM_THRESHOLD: 64 * 2**20}


@functools.cache
def _mallopt():
    """glibc's mallopt, or None where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018  (glibc has it; musl does not)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def keep_freed_memory(keep: bool = True) -> bool:
    """Set this process's allocator to keep freed memory (or to release it again); whether the
    setting took effect (False where the C library is not glibc)."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return all(mallopt(param, value) == 1 for param, value in (KEEP if keep else RELEASE).items())
