"""Why Adam's update of AlexNet and VGG runs slower on this CPU than its bytes say: torch's
`sqrt` of a zero costs several times a nonzero's, and Adam takes the square root of every
second moment, which stays exactly zero for a weight that has never had a gradient (a unit
ReLU leaves dead on every sample seen so far).

Part 1, the op: `torch.sqrt` over 16 Mi fp32 elements with a share of them zero (scattered at
random, and in one block), beside numpy's `sqrt` of the same array. Part 2, the models: each
model trained `--steps` Adam steps on fresh synthetic batches (one thread, freed memory kept, as
dlscale's loop runs on a CPU), then its update timed, the share of zero second moments counted,
and `sqrt` over every tensor's second moments timed as they are and with their zeros lifted to
1e-20 (a normal float: the same bytes, no zero), and the same update by torch's fused Adam
(`fused=True`, from a copy of the state). Rounds alternate the two, side by side; the median of
rounds and their spread (max / min − 1).

    .venv/bin/python benchmarks/sqrt_zeros.py [--rounds 3] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
from torch import nn

from dlscale.models import build_model
from dlscale.train.allocator import keep_freed_memory

ELEMENTS = 16 << 20
SHARES = (0.0, 0.25, 0.5, 1.0)
# (zoo name, input side, batch): the predict_accuracy cases whose update the model misses.
MODELS = (("alexnet", 64, 4), ("vgg16", 32, 2))


def seconds(fn, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def with_zeros(share: float, scattered: bool) -> torch.Tensor:
    x = torch.rand(ELEMENTS) + 0.1
    zeros = int(share * ELEMENTS)
    if scattered:
        x[torch.randperm(ELEMENTS)[:zeros]] = 0.0
    else:
        x[:zeros] = 0.0
    return x


def op_rows(rounds: int) -> list[str]:
    rows = []
    for share in SHARES:
        for scattered in (True, False) if 0 < share < 1 else (True,):
            x = with_zeros(share, scattered)
            out = torch.empty_like(x)
            array, array_out = x.numpy(), out.numpy()
            torch_s, numpy_s = [], []
            for _ in range(rounds):
                torch_s.append(seconds(lambda x=x, out=out: torch.sqrt(x, out=out)))
                numpy_s.append(seconds(lambda a=array, o=array_out: np.sqrt(a, out=o)))
            where = "scattered" if scattered else "one block"
            rows.append(
                f"| {share:.0%} {where if 0 < share < 1 else ''} | {_ms(torch_s)} | {_ms(numpy_s)} "
                f"| {statistics.median(torch_s) / ELEMENTS * 1e9:.2f} ns |"
            )
    return rows


def model_row(name: str, side: int, batch: int, steps: int, rounds: int) -> str:
    torch.manual_seed(0)
    model = build_model(name, {"num_classes": 10})
    optimizer = torch.optim.Adam(model.parameters())
    loss_fn = nn.CrossEntropyLoss()
    updates = []
    for step in range(steps + rounds):
        x, y = torch.randn(batch, 3, side, side), torch.randint(0, 10, (batch,))
        loss_fn(model(x), y).backward()
        start = time.perf_counter()
        optimizer.step()
        if step >= steps:
            updates.append(time.perf_counter() - start)
        optimizer.zero_grad(set_to_none=True)
    moments = [state["exp_avg_sq"] for state in optimizer.state.values()]
    zeros = sum(int((m == 0).sum()) for m in moments)
    total = sum(m.numel() for m in moments)
    lifted = [m.clamp(min=1e-20) for m in moments]
    as_is, without = [], []
    for _ in range(rounds):
        as_is.append(seconds(lambda: [m.sqrt() for m in moments], reps=3))
        without.append(seconds(lambda: [m.sqrt() for m in lifted], reps=3))
    extra = statistics.median(as_is) - statistics.median(without)
    # The same update by torch's fused kernel (one pass over each tensor, no temporaries), from
    # a copy of this state: what dlscale's loop does not run (its time model traces the
    # per-tensor ops torch runs by default on a CPU).
    fused = torch.optim.Adam(model.parameters(), fused=True)
    for param, state in optimizer.state.items():  # load_state_dict would restore fused=None
        fused.state[param] = {key: value.clone() for key, value in state.items()}
    fused_s = []
    for _ in range(rounds):
        x, y = torch.randn(batch, 3, side, side), torch.randint(0, 10, (batch,))
        loss_fn(model(x), y).backward()
        start = time.perf_counter()
        fused.step()
        fused_s.append(time.perf_counter() - start)
        fused.zero_grad(set_to_none=True)
    return (
        f"| {name} batch {batch} | {total / 1e6:.1f} M | {zeros / total:.1%} | {_ms(updates)} "
        f"| {_ms(as_is)} | {_ms(without)} | {extra * 1e3:.0f} ms, "
        f"{extra / max(zeros, 1) * 1e9:.1f} ns a zero | {_ms(fused_s)} |"
    )


def _ms(times: list[float]) -> str:
    spread = max(times) / min(times) - 1
    return f"{statistics.median(times) * 1e3:.1f} ms ±{spread:.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="Adam steps before timing")
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be positive")
    torch.set_num_threads(1)
    keep_freed_memory()
    load = os.getloadavg()
    print(
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, torch {torch.__version__}, "
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, 1 thread\n"
    )
    print("| zeros | torch.sqrt, 16 Mi fp32 | numpy.sqrt | torch, a element |")
    print("|---|---|---|---|")
    for row in op_rows(args.rounds):
        print(row)
    print(
        "\n| model | parameters | zero second moments | Adam update | sqrt of the moments "
        "| the same, zeros lifted to 1e-20 | the zeros' cost | fused Adam update |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, side, batch in MODELS:
        print(model_row(name, side, batch, args.steps, args.rounds))
    load = os.getloadavg()
    print(f"\nload average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
