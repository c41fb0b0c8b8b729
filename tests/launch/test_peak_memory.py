"""A process's peak memory is its own: Linux carries the peak RSS of whatever ran before an exec
into ru_maxrss, so a run started by a large parent (pytest, a sweep slot, a notebook) reported
the parent's size as its own peak."""

import json
import subprocess
import sys

CHILD = """
import json, torch
from dlscale.train.device import peak_memory
print(json.dumps(peak_memory(torch.device("cpu"))))
"""


def test_a_child_of_a_large_parent_reports_its_own_peak():
    held = bytearray(1536 * 2**20)  # this process: 1.5 GiB resident
    for offset in range(0, len(held), 4096):
        held[offset] = 1
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    peak_bytes, what = json.loads(done.stdout)
    assert what == "host_peak_rss"
    # The child imported torch and little else: far below the parent's 1.5 GiB.
    assert 0 < peak_bytes < 1024 * 2**20, peak_bytes
    del held
