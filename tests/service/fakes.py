"""An executor that starts no process, for HTTP and scheduling tests that need jobs to move
through their states quickly: `start` leaves what a finished train job leaves in its folder
(or, with `finish=False`, a job that runs until told to stop), and `validate` runs the
validation job's own checks in this process (the tests' specs name no tenant code), with the
job's slots as the machine, as the sandbox gives them."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from unittest import mock

from dlscale.atomic import write_json_atomic
from dlscale.service import validate
from dlscale.service.executor import JobLimits, Probe
from dlscale.service.layout import read_result


class FakeExecutor:
    def __init__(self, finish: bool = True):
        self.finish = finish
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.killed: list[str] = []
        self.running: set[str] = set()
        self.limits: dict[str, JobLimits] = {}
        self.released: list[str] = []

    def prepare(self, folder: Path, uid: int | None) -> None:
        pass

    def validate(self, folder: Path, limits: JobLimits, timeout_s: float) -> validate.Verdict:
        machine = {
            "DLSCALE_CPUS": str(limits.cpus),
            "DLSCALE_MEMORY_BYTES": str(limits.memory_bytes),
        }
        with mock.patch.dict(os.environ, machine):
            said = validate.verdict(Path(folder))
        return validate.Verdict(said["ok"], said["message"], tuple(said.get("warnings", ())))

    def start(self, job_dir: Path, limits: JobLimits) -> int:
        job_dir = Path(job_dir)
        self.started.append(job_dir.name)
        self.limits[job_dir.name] = limits
        (job_dir / "claimed").touch()
        run = job_dir / "run"
        run.mkdir(exist_ok=True)
        (run / "run.json").write_text(json.dumps({"final": {"val_accuracy": 0.5}}))
        (run / "checkpoints").mkdir(exist_ok=True)
        (run / "checkpoints" / "step-1.pt").write_bytes(b"weights")
        lines = [f"step {i} loss {1.0 / (i + 1):.3f}" for i in range(5)]
        (job_dir / "log.txt").write_text("".join(f"{line}\n" for line in lines))
        epochs = [
            {"epoch": e, "train_loss": 1.0 / (e + 1), "val_accuracy": 0.1 * e} for e in range(3)
        ]
        (job_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in epochs))
        if self.finish:
            self.end(job_dir, "succeeded")
        else:
            self.running.add(job_dir.name)
        return 4242

    def end(self, job_dir: Path, state: str) -> None:
        self.running.discard(Path(job_dir).name)
        digest = hashlib.sha256(b"weights").hexdigest()
        write_json_atomic(
            Path(job_dir) / "result.json",
            {
                "state": state,
                "message": state,
                "weights_sha256": digest,
                "data_sha256": digest,
                "metrics": {"val_accuracy": 0.5},
                "environment": {"python": "3"},
            },
        )

    def probe(self, job_dir: Path) -> Probe:
        job_dir = Path(job_dir)
        alive = job_dir.name in self.running
        return Probe(
            alive=alive, claimed=(job_dir / "claimed").exists(), result=read_result(job_dir)
        )

    def cancel(self, job_dir: Path, force: bool = False) -> bool:
        (self.killed if force else self.cancelled).append(Path(job_dir).name)
        if Path(job_dir).name in self.running:
            self.end(job_dir, "cancelled")
            return True
        return False

    def reap(self) -> None:
        pass

    def close(self) -> None:
        pass

    def release(self, job_dir: Path) -> dict | None:
        self.released.append(Path(job_dir).name)
        return None

    def lost_message(self, job_dir: Path) -> str:
        return "the job's process ended without a result"
