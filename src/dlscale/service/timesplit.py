"""Where a job's training steps spent their time (data wait, host to device, compute,
communication), read from the run record (run/run.json) its process wrote."""

from __future__ import annotations

import json
from pathlib import Path

from dlscale.service.layout import RUN, open_artifact, read_bounded

RUN_RECORD = f"{RUN}/run.json"
# run.json's `timing` keys, in the order a step spends them; `comm_wait_s` is the communication
# the step waited for (what overlapped compute is inside compute_s).
PARTS = (
    ("data wait", "data_wait_s"),
    ("host to device", "h2d_s"),
    ("compute", "compute_s"),
    ("communication", "comm_wait_s"),
)


def time_split(folder: str | Path) -> dict | None:
    """{"steps", "step_s", "parts": [{"name", "seconds", "share"}]} of the main trainer's steps
    so far; None when the job wrote no run record (queued, a sweep, a profile) or a foreign one."""
    try:
        with open_artifact(folder, RUN_RECORD) as handle:  # never through a planted symlink
            record = json.loads(read_bounded(handle, RUN_RECORD).decode(errors="replace"))
    except (FileNotFoundError, ValueError):
        return None
    timing = record.get("timing") if isinstance(record, dict) else None
    if not isinstance(timing, dict):
        return None
    seconds = {key: timing.get(key) for _, key in PARTS}
    if not all(isinstance(value, int | float) for value in seconds.values()):
        return None
    total_s = sum(seconds.values())
    parts = [
        {"name": name, "seconds": seconds[key], "share": seconds[key] / total_s if total_s else 0.0}
        for name, key in PARTS
    ]
    return {"steps": timing.get("steps"), "step_s": total_s, "parts": parts}
