"""Across two hosts at shaped link rates: the link measured by `dlscale bench link`, then ddp and
asynchronous ps trained across it, each communication time predicted from the measured link
beside what the run recorded.

The hosts are the project's testbed (tests/cluster/testbed.py: network namespaces, a Ray node
on each, `tc ... tbf` shaping each host's outgoing rate); root is needed. The model is an MLP
whose gradients are 35 MB (digits, hidden 4096 × 2048), so the link, not the compute, sets the
pace. Per rate:

- all-reduce: the ring formula of the scaling model (`profiler.collectives.ring_allreduce_s`) over
  the link `bench link` saved, against ddp's recorded all-reduce seconds per step;
- step: a one-host run's measured step (no communication) plus the predicted all-reduce,
  against ddp's median step across the two hosts (dlscale's ddp does not overlap the two);
- push + pull: two one-way messages of the model's bytes at the point-to-point rate `bench
  link` measured, against an async ps worker's recorded communication seconds per step.

Goal: every predicted / measured within ±25%.

    sudo .venv/bin/python benchmarks/link_prediction.py [--rates 100mbit,1gbit] [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.cluster.conftest import clean_environment  # noqa: E402
from tests.cluster.testbed import Testbed, why_not_here  # noqa: E402

from dlscale.hardware.links import parse_links  # noqa: E402
from dlscale.profiler.collectives import ring_allreduce_s  # noqa: E402

BIN = Path(sys.executable).parent
GOAL = 0.25
MODEL = {"name": "mlp", "kwargs": {"hidden": [4096, 2048]}}


def spec(name: str, steps: int, strategy: dict) -> dict:
    return {
        "name": name,
        "model": MODEL,
        "data": {"name": "digits"},
        "batch_size": 32,
        "steps": steps,
        "device": "cpu",
        "seed": 0,
        "optimizer": {"name": "sgd", "lr": 0.01},
        "threads": 1,  # as a Ray worker of one CPU has: the one-host run computes alike
        "strategy": strategy,
    }


def train(bed, scratch: Path, body: dict, cluster: bool) -> dict:
    path = scratch / f"{body['name']}.yaml"
    path.write_text(yaml.safe_dump(body))
    out = scratch / body["name"]
    argv = [str(BIN / "dlscale"), "train", str(path), "--out", str(out)]
    if cluster:
        argv += ["--cluster", "ray", "--address", bed.address]
    done = bed.run(0, argv, env=clean_environment(), timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"{body['name']} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return json.loads((out / "run.json").read_text())


def bench_link(bed, scratch: Path) -> tuple[dict, object]:
    home = scratch / "home"
    argv = [str(BIN / "dlscale"), "bench", "link", "--cluster", "ray", "--address", bed.address]
    argv += ["--out", str(scratch / "link"), "--json"]
    done = bed.run(0, argv, env={**clean_environment(), "DLSCALE_HOME": str(home)}, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"bench link failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    result = json.loads(done.stdout)
    (link,) = parse_links(Path(result["saved"]).read_text(), result["saved"])
    return result, link


def one_rate(rate: str, steps: int) -> list[tuple[str, float, float]]:
    with (
        tempfile.TemporaryDirectory(prefix="link-prediction-") as folder,
        Testbed(hosts=2, rate=rate, cpus_per_host=1) as bed,
    ):
        scratch = Path(folder)
        bed.start_ray(str(BIN / "ray"), env=clean_environment())
        measured_link, link = bench_link(bed, scratch)
        p2p = measured_link["p2p"]
        alone = train(bed, scratch, spec("alone", steps, {"name": "single"}), cluster=False)
        ddp = train(bed, scratch, spec("ddp", steps, {"name": "ddp", "workers": 2}), True)
        ps_strategy = {"name": "ps", "mode": "async", "workers": 1, "servers": 1}
        ps = train(bed, scratch, spec("ps", steps, ps_strategy), True)
        payload = ddp["distributed"]["allreduce_payload_bytes_per_step"]
        allreduce = ring_allreduce_s(payload, 2, link)
        compute = alone["workers"][0]["median_step_s"]
        worker = ps["workers"][0]
        pushpull = 2 * (p2p["latency_s"] + payload / p2p["bytes_per_s"])
        return [
            ("all-reduce", allreduce, ddp["distributed"]["allreduce_s_per_step"]),
            ("ddp step", compute + allreduce, ddp["workers"][0]["median_step_s"]),
            ("ps push + pull", pushpull, worker["comm_s"] / worker["steps"]),
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="100mbit,1gbit")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    reason = why_not_here()
    if reason:
        raise SystemExit(f"link_prediction: {reason}")
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print(f"{'rate':<8} {'what':<16} {'predicted':>10} {'measured':>10} {'ratio':>6}")
    worst = 0.0
    for rate in args.rates.split(","):
        for what, predicted, measured in one_rate(rate, args.steps):
            ratio = predicted / measured
            worst = max(worst, abs(ratio - 1))
            print(
                f"{rate:<8} {what:<16} {predicted * 1e3:>8.1f}ms {measured * 1e3:>8.1f}ms "
                f"{ratio:>6.2f}",
                flush=True,
            )
    verdict = "met" if worst <= GOAL else "missed"
    print(f"worst |ratio − 1| = {worst:.2f}; goal ≤ {GOAL:.2f}: {verdict}")


if __name__ == "__main__":
    main()
