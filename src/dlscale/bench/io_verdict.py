"""`bench io`'s verdict: which of storage, decoding and the model bounds training, the loader
workers that would keep up, and whether the measurements were steady enough to say so."""

from __future__ import annotations

import math

# A rate whose repeats (steps, batches) vary by more than this from their 10th to their 90th
# percentile was timed while something else ran: the verdict is then said to be noisy.
NOISY_SPREAD = 0.25
# A runner-up within this factor of the bound can swap places with it under such noise.
CLOSE_CALL = 1.5


def relative_spread(times: list[float]) -> float:
    """90th over 10th percentile of repeated timings, less 1: 0 when they agree."""
    if len(times) < 2:
        return 0.0
    ordered = sorted(times)
    low, high = ordered[int(0.1 * (len(ordered) - 1))], ordered[int(0.9 * (len(ordered) - 1))]
    return high / max(low, 1e-12) - 1


def io_verdict(
    storage_per_s: float, worker_per_s: float, model_per_s: float, workers: int, cores: int
) -> dict:
    """Which of storage, decoding (× the loader's workers) or the model bounds training, in
    samples/s, and the loader workers that would keep up with the model."""
    running = max(1, workers)  # with no workers the training process decodes itself
    bounds = {
        "storage": storage_per_s,
        "decode": worker_per_s * running,
        "model": model_per_s,
    }
    bound = min(bounds, key=bounds.__getitem__)
    needed = max(1, math.ceil(model_per_s / worker_per_s)) if worker_per_s > 0 else None
    rates = {name: f"{rate:,.0f} samples/s" for name, rate in bounds.items()}
    if bound == "model":
        text = (
            f"the model bounds training ({rates['model']}): storage and decoding keep up; "
            f"{needed} loader worker(s) suffice"
        )
    elif bound == "decode":
        text = (
            f"decoding bounds training: {running} worker(s) decode {rates['decode']}, the "
            f"model takes {rates['model']}; set loader.workers: {needed}"
        )
        if needed is not None and needed > cores:
            text += (
                f" (more than the {cores} cores here: they would take turns; cheaper "
                "samples or a machine with more cores)"
            )
    else:
        text = (
            f"storage bounds training: it delivers {rates['storage']}, the model takes "
            f"{rates['model']}; on shared storage, stage the files to local disk (data.stage: "
            "DIR); else store fewer bytes a sample (dlscale data convert --image-format "
            "png)"
        )
    return {
        "bound": bound,
        "bounds_samples_per_s": bounds,
        "workers_needed": needed,
        "verdict": text,
    }


def io_noise(
    step_spread: float, batch_spread: float, load_1m: float | None, cores: int
) -> list[str]:
    """Why the rates may not hold (empty: they can be trusted), one short reason each."""
    reasons = []
    if load_1m is not None and load_1m > cores:
        reasons.append(f"load average {load_1m:.1f} on {cores} cores when it started")
    if step_spread > NOISY_SPREAD:
        reasons.append(f"the model's steps varied by {step_spread:.0%}")
    if batch_spread > NOISY_SPREAD:
        reasons.append(f"the decoded batches varied by {batch_spread:.0%} a sample")
    return reasons


def with_noise(verdict: dict, noise: list[str], spread: float = 0.0) -> dict:
    """The verdict, with the runner-up; when the measurements were noisy, either a warning that
    says how far the runner-up is, or, where it is close enough to swap places with the bound
    (within CLOSE_CALL, or within the repeats' own `spread` where that is wider), no verdict at
    all: `noisy`, the rates and why, as `bench precision` draws no ratio from a noisy time."""
    bounds = verdict["bounds_samples_per_s"]
    slowest = verdict["bound"]
    runner_up = min((name for name in bounds if name != slowest), key=bounds.__getitem__)
    ratio = bounds[runner_up] / max(bounds[slowest], 1e-12)
    close = max(CLOSE_CALL, 1 + spread)
    drawn = not noise or ratio >= close
    text = verdict["verdict"]
    if not drawn:
        text = (
            f"noisy: no verdict: {slowest} ({bounds[slowest]:,.0f} samples/s) and {runner_up} "
            f"({bounds[runner_up]:,.0f}) are within {ratio:.2f}× of each other, closer than "
            f"noisy measurements can tell apart ({'; '.join(noise)}); rerun on an idle "
            "machine, or with a longer --seconds"
        )
    elif noise:
        text += (
            f". The measurements were noisy ({'; '.join(noise)}), but the runner-up, "
            f"{runner_up}, is {ratio:.1f}× away, so the verdict likely holds"
        )
    return {
        **verdict,
        "bound": slowest if drawn else None,
        "slowest_measured": slowest,
        "verdict": text,
        "verdict_drawn": drawn,
        "runner_up": runner_up,
        "runner_up_ratio": ratio,
        "noisy": bool(noise),
        "noise": noise,
    }
