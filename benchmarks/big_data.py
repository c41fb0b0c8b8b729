"""The larger-than-memory walkthrough of docs/data.md, measured: convert, stage, train, bench io.

Writes seeded synthetic images (3×128×128, uint8) as WebDataset shards with `dlscale data
convert`, stages them to another folder with `dlscale data stage` (twice: the second finds them
staged), trains one epoch of a small MLP streaming them (`loader.workers` 0 and 2, each in a
process of its own, so peak resident memory is the run's), and runs `dlscale bench io` on the
spec. Prints one table of the figures with the machine's load; every figure is a command's own
output (run.json, --json). Runs are in a temporary folder, and never touch ~/.dlscale.

    .venv/bin/python benchmarks/big_data.py [--samples 43000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

DLSCALE = str(Path(sys.executable).parent / "dlscale")


def dlscale(*args: str, env: dict) -> dict | None:
    """Run a dlscale command; its --json output, if it prints one."""
    result = subprocess.run([DLSCALE, *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"dlscale {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout) if "--json" in args else None


def train(spec: dict, folder: Path, name: str, env: dict) -> dict:
    import yaml

    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**spec, "name": name}))
    out = folder / f"run-{name}"
    dlscale("train", str(path), "--out", str(out), env=env)
    return json.loads((out / "run.json").read_text())


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=43_000)
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="dlscale-big-"))
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DLSCALE_HOME": str(folder / "home"), "COLUMNS": "200"}
    print(f"working in {folder}; {uptime()}")

    shards, staged = folder / "shards", folder / "staged"
    made = dlscale(
        "data",
        "convert",
        "synthetic",
        str(shards),
        "--samples",
        str(args.samples),
        "--shape",
        "3,128,128",
        "--classes",
        "10",
        "--shard-size",
        "256MB",
        "--json",
        env=env,
    )
    first = dlscale("data", "stage", str(shards), str(staged), "--json", env=env)
    again = dlscale("data", "stage", str(shards), str(staged), "--json", env=env)
    spec = {
        "model": {"name": "mlp", "kwargs": {"hidden": [64]}},
        "data": {
            "name": "webdataset",
            "urls": str(staged / "train-*.tar"),
            "val_urls": str(staged / "val-*.tar"),
            "shuffle_buffer": 1000,
        },
        "batch_size": 256,
        "epochs": 1,
        "device": "cpu",
        "optimizer": {"name": "sgd", "lr": 0.01},
    }
    runs = {w: train({**spec, "loader": {"workers": w}}, folder, f"w{w}", env) for w in (0, 2)}
    spec_path = folder / "w2.yaml"
    io = dlscale("bench", "io", str(spec_path), "--json", "--out", str(folder / "io"), env=env)

    gib = 2**30
    print(
        f"\nconvert: {made['samples']} samples, {made['shards']} shards, "
        f"{made['bytes'] / gib:.2f} GiB in {made['seconds']:.1f} s"
    )
    for label, record in (("stage", first), ("stage again", again)):
        rate = record.get("copied_bytes_per_s") or 0
        print(
            f"{label}: {record['files']} files, copied {record['copied_files']} "
            f"({record['copied_bytes'] / gib:.2f} GiB) in {record['seconds']:.2f} s"
            + (f", {rate / 2**20:.0f} MiB/s" if rate else "")
        )
    for workers, record in runs.items():
        data, final, timing = record["data"], record["final"], record["timing"]
        print(
            f"train loader.workers {workers}: {data['train_samples']:,} samples, "
            f"{final['train_samples_per_s']:,.0f} samples/s, data wait "
            f"{100 * timing['steady_data_wait_share']:.0f}% of a step, read "
            f"{1e6 * timing['read_s_per_sample']:.0f} µs + decode "
            f"{1e6 * timing['decode_s_per_sample']:.0f} µs a sample, peak RSS "
            f"{final['peak_memory_bytes'] / 2**20:.0f} MiB (main process), "
            f"read {timing['read_bytes'] / gib:.2f} GiB; val accuracy "
            f"{final['val_accuracy']:.3f}"
        )
    print("bench io:", json.dumps(io.get("verdict", io), indent=None)[:600])
    print(uptime())


if __name__ == "__main__":
    main()
