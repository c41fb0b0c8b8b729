"""Load on a real `dlscale serve` at 127.0.0.1: several tenants submit jobs and poll at once.

    .venv/bin/python benchmarks/service_load.py [--tenants 4] [--seconds 60] [--jobs-per-tenant 6]

Bounded in count and time: each tenant's client submits at most --jobs-per-tenant tiny train
jobs and polls (its jobs, one job, the queue) for --seconds. Prints every endpoint's request
count and latency (median, p95, max), the 5xx count, and each job's fate: none may be lost (every
submitted id is listed and ends in a known state after the queued rest are cancelled). A submit
waits for its spec's check in the job sandbox (a validation job), so its timeout is long; the
server is sandboxed as `dlscale serve` is by default (run as root, with bubblewrap), and the jobs
it leaves running are killed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx

from dlscale.service import admin
from dlscale.service.executor import end_sandboxes

SUBMIT_TIMEOUT_S = 300.0  # a submit waits for a validation place, then for its check
SPEC = """\
name: load
model: {name: mlp, kwargs: {hidden: [16]}}
data: {name: digits}
batch_size: 64
epochs: 1
optimizer: {name: sgd, lr: 0.1}
device: cpu
"""


def start_server(data_dir: Path, port: int, cpu_slots: int) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "dlscale.service",
        "--data-dir",
        str(data_dir),
        "--port",
        str(port),
        "--cpu-slots",
        str(cpu_slots),
    ]
    log = open(data_dir.parent / "server.log", "ab")  # noqa: SIM115 (lives as long as the server)
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("the server did not start; see server.log")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Tenant(threading.Thread):
    def __init__(self, url: str, token: str, name: str, seconds: float, jobs: int, stats):
        super().__init__(name=name)
        self.client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        )
        self.seconds, self.jobs, self.stats = seconds, jobs, stats
        self.submitted: list[str] = []

    def call(self, label: str, method: str, path: str, **kwargs) -> httpx.Response:
        started = time.perf_counter()
        timeout = SUBMIT_TIMEOUT_S if method == "POST" else 60
        answer = self.client.request(method, path, timeout=timeout, **kwargs)
        self.stats.append((label, time.perf_counter() - started, answer.status_code))
        return answer

    def run(self) -> None:
        deadline = time.monotonic() + self.seconds
        turn = 0
        while time.monotonic() < deadline:
            if len(self.submitted) < self.jobs and turn % 5 == 0:
                files = [("spec", ("spec.yaml", SPEC.encode()))]
                answer = self.call("POST /api/jobs", "POST", "/api/jobs", files=files)
                if answer.status_code == 201:
                    self.submitted.append(answer.json()["id"])
            self.call("GET /api/jobs", "GET", "/api/jobs")
            if self.submitted:
                self.call(
                    "GET /api/jobs/{id}",
                    "GET",
                    f"/api/jobs/{self.submitted[turn % len(self.submitted)]}",
                )
            self.call("GET /api/queue", "GET", "/api/queue")
            turn += 1
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--jobs-per-tenant", type=int, default=6)
    parser.add_argument("--cpu-slots", type=int, default=2)
    parser.add_argument("--port", type=int, default=18461)
    parser.add_argument("--json", type=Path, default=None, help="Also write the figures here.")
    args = parser.parse_args()
    os.environ.setdefault("DLSCALE_HOME", tempfile.mkdtemp(prefix="dlscale-home-"))
    root = Path(tempfile.mkdtemp(prefix="dlscale-load-"))
    data = root / "data"
    data.mkdir()
    tokens = []
    for i in range(args.tenants):
        admin.create_user(data, None, f"user{i}", False)
        admin.create_tenant(data, None, f"tenant{i}")
        admin.add_member(data, None, f"tenant{i}", f"user{i}", "editor")
        tokens.append(admin.issue_token(data, None, f"user{i}", "write", None))
    server = start_server(data, args.port, args.cpu_slots)
    url = f"http://127.0.0.1:{args.port}"
    stats: list[tuple[str, float, int]] = []
    try:
        clients = [
            Tenant(url, tokens[i], f"tenant{i}", args.seconds, args.jobs_per_tenant, stats)
            for i in range(args.tenants)
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        fates: dict[str, int] = defaultdict(int)
        lost = 0
        for client in clients:
            listed = {j["id"]: j["state"] for j in client.client.get("/api/jobs").json()}
            for job_id in client.submitted:
                if job_id not in listed:
                    lost += 1
                    continue
                if listed[job_id] in ("queued", "starting", "running"):
                    client.client.post(f"/api/jobs/{job_id}/cancel")
                fates[listed[job_id]] += 1
    finally:
        server.terminate()
        server.wait(timeout=30)
        end_sandboxes(data / "sandboxes")  # the jobs it left running
    by_label: dict[str, list[float]] = defaultdict(list)
    for label, seconds, _status in stats:
        by_label[label].append(seconds * 1000)
    errors = sum(1 for _, _, status in stats if status >= 500)
    figures = {
        "uptime": os.popen("uptime").read().strip(),
        "tenants": args.tenants,
        "seconds": args.seconds,
        "requests": len(stats),
        "server_errors_5xx": errors,
        "jobs_submitted": sum(len(c.submitted) for c in clients),
        "jobs_lost": lost,
        "job_states_at_end": dict(fates),
        "latency_ms": {
            label: {
                "n": len(v),
                "median": round(statistics.median(v), 1),
                "p95": round(percentile(v, 0.95), 1),
                "max": round(max(v), 1),
            }
            for label, v in sorted(by_label.items())
        },
        "all_p95_ms": round(percentile([s * 1000 for _, s, _ in stats], 0.95), 1),
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    if errors or lost:
        raise SystemExit(f"{errors} server errors, {lost} lost jobs")


if __name__ == "__main__":
    main()
