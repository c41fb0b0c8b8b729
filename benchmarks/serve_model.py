"""The same trained model behind Ray Serve (`dlscale serve-model`) and behind a plain FastAPI
endpoint (uvicorn, one process, one model call per request): requests/s and latency p50/p99 at
1, 8 and 64 concurrent clients.

    .venv/bin/python benchmarks/serve_model.py [--run RUN] [--rounds 3] [--clients 1,8,64]
        [--replicas 1] [--max-batch-size 16] [--batch-wait-ms 5]

Without --run it trains a small LeNet run on synthetic 1×28×28 images first. Each client is an
httpx async client sending one-sample requests back to back; a level's requests/s is all
answers over the wall time of the level. The two servers take turns, round by round, so a
change in the machine's load falls on both; each figure is the median over rounds with the
[min, max] beside it, and `uptime` is printed before and after. Both servers run the model on
one torch thread (Ray gives a 1-CPU replica OMP_NUM_THREADS=1; the plain one is set to match).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

START_TIMEOUT_S = 300.0
WARMUP_REQUESTS = 20
JSON = {"content-type": "application/json"}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def small_run(folder: Path) -> Path:
    from dlscale import api
    from dlscale.jobspec import parse_spec

    spec = {
        "name": "serve-bench",
        "model": {"name": "lenet"},
        "data": {"name": "synthetic", "shape": [1, 28, 28], "num_samples": 256},
        "batch_size": 32,
        "steps": 4,
        "optimizer": {"name": "sgd", "lr": 0.05},
        "device": "cpu",
    }
    return Path(api.train(parse_spec(spec), out_dir=folder / "run").run_dir)


def start(command: list[str], url: str, log: Path) -> subprocess.Popen:
    process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(1)
    process.kill()
    sys.exit(f"{command[2:4]} did not start; its log: {log}")


def stop(process: subprocess.Popen) -> None:
    process.terminate()  # serve-model takes SIGTERM as Ctrl-C: Serve and its Ray stop
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def level(url: str, clients: int, requests_per_client: int, body: bytes) -> dict:
    """`clients` clients, each sending `requests_per_client` requests one after another."""
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one_client(count: int) -> None:
            for _ in range(count):
                sent = time.perf_counter()
                reply = await client.post(f"{url}/predict", content=body, headers=JSON)
                latencies.append(time.perf_counter() - sent)
                assert reply.status_code == 200, reply.text

        await asyncio.gather(*(one_client(WARMUP_REQUESTS // clients + 1) for _ in range(clients)))
        latencies.clear()
        began, began_cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one_client(requests_per_client) for _ in range(clients)))
        wall_s = time.perf_counter() - began
        client_cpu_s = time.process_time() - began_cpu
    ordered = sorted(latencies)
    return {
        "requests_per_s": len(ordered) / wall_s,
        "p50_ms": 1000 * ordered[len(ordered) // 2],
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        # The clients' own CPU over the wall time: near 1, one core spent by the clients alone,
        # the level measures them as much as the server.
        "client_cpu": client_cpu_s / wall_s,
    }


def spread(values: list[float], digits: int = 0) -> str:
    middle = statistics.median(values)
    low, mid, high = (f"{v:.{digits}f}" for v in (min(values), middle, max(values)))
    return f"{mid} [{low}, {high}]"


def plain_server(run: str, port: int) -> None:
    """The plain endpoint: this script run again as `--plain-server RUN PORT`."""
    import uvicorn

    from dlscale.api.serving import plain_app

    torch.set_num_threads(1)
    uvicorn.run(plain_app(run), host="127.0.0.1", port=port, log_level="warning")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="1,8,64")
    parser.add_argument("--requests", type=int, default=400, help="per level and round")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--plain-server", nargs=2, metavar=("RUN", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_server:
        plain_server(args.plain_server[0], int(args.plain_server[1]))
        return
    os.environ.setdefault("DLSCALE_HOME", tempfile.mkdtemp(prefix="dlscale-home-"))
    folder = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    run = args.run or small_run(folder)
    print(f"run {run}; {uptime()}", flush=True)
    ray_port, plain_port = free_port(), free_port()
    serve_model = [sys.executable, "-m", "dlscale.cli.main", "serve-model", str(run)]
    serve_model += ["--port", str(ray_port), "--replicas", str(args.replicas), "--device", "cpu"]
    serve_model += ["--max-batch-size", str(args.max_batch_size)]
    serve_model += ["--batch-wait-ms", str(args.batch_wait_ms)]
    servers = {
        "ray-serve": (serve_model, f"http://127.0.0.1:{ray_port}"),
        "plain-fastapi": (
            [sys.executable, __file__, "--plain-server", str(run), str(plain_port)],
            f"http://127.0.0.1:{plain_port}",
        ),
    }
    processes = {}
    try:
        for name, (command, url) in servers.items():
            processes[name] = start(command, url, folder / f"{name}.log")
        # Encoded once: the clients share the servers' two cores, and should spend them on HTTP.
        body = json.dumps({"inputs": [torch.rand(1, 28, 28).tolist()]}).encode()
        levels = [int(c) for c in args.clients.split(",")]
        results: dict = {(name, c): [] for name in servers for c in levels}
        for round_index in range(args.rounds):
            for c in levels:
                per_client = max(1, args.requests // c)
                for name, (_, url) in servers.items():
                    results[name, c].append(asyncio.run(level(url, c, per_client, body)))
            print(f"round {round_index + 1}/{args.rounds} done; {uptime()}", flush=True)
        batches = httpx.get(f"{servers['ray-serve'][1]}/metrics", params={"format": "json"}).json()
    finally:
        for process in processes.values():
            stop(process)
    header = f"{'server':<14} {'clients':>7}  {'requests/s':<18} {'p50 ms':<24} {'p99 ms':<24}"
    print(f"\n{header} client CPU/wall")
    for c in levels:
        for name in servers:
            rows = results[name, c]
            print(
                f"{name:<14} {c:>7}  {spread([r['requests_per_s'] for r in rows]):<18} "
                f"{spread([r['p50_ms'] for r in rows], 1):<24} "
                f"{spread([r['p99_ms'] for r in rows], 1):<24} "
                f"{spread([r['client_cpu'] for r in rows], 2)}"
            )
    sizes = ", ".join(f"{size}: {calls}" for size, calls in batches["batch_sizes"].items())
    print(f"\nray-serve's model calls by requests batched in one (warm-up included): {sizes}")
    print(uptime())


if __name__ == "__main__":
    main()
