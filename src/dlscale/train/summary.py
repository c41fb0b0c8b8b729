"""Each trainer's figures at the end of training, and the run's `final` figures from them."""

from __future__ import annotations

import socket

import torch

from dlscale.train.device import peak_memory
from dlscale.train.exchange import Exchange
from dlscale.train.metrics import TimingTotals


def worker_summary(
    exchange: Exchange, timing: TimingTotals, device: torch.device, where: dict
) -> dict:
    """One trainer: where it ran, what it trained, how fast after warm-up, its time split."""
    split = timing.summary()
    return {
        "rank": exchange.rank,
        "status": "completed",
        "node": where.get("node") or socket.gethostname(),
        # The host by name and by the address its peers reach it at (Ray's node address).
        "host": where.get("host") or socket.gethostname(),
        **({"address": where["address"]} if where.get("address") else {}),
        "data_rank": exchange.data_rank,
        "steps": timing.steps,
        "samples": timing.samples,
        "samples_per_s": timing.samples_per_s,
        "median_step_s": timing.median_step_s,
        "peak_memory_bytes": peak_memory(device)[0],
        **{k: v for k, v in split.items() if k.endswith(("_s", "_share")) and v is not None},
        # Data read from disk by this trainer (its loader workers included): each sample of an
        # epoch is read by one data-parallel slice (`data_rank`), so these add up across slices;
        # a slice's trainers (a tensor group, a pipeline's stages) read the same samples.
        **(
            {
                "samples_read": timing.io_samples,
                "read_bytes": timing.read_bytes,
                "bad_samples": timing.bad_samples,
            }
            if timing.io_samples
            else {}
        ),
    }


def throughput(summaries: list[dict | None], slices: int = 1) -> tuple[float, float]:
    """(all workers' samples/s, per worker): the sum over data-parallel slices, each counted once
    (every stage of a pipeline replica trains the same samples: the slowest stage's rate); with
    `slices`, the slices not among `summaries` counted at the mean rate of those that are."""
    rates: dict[int, float] = {}
    for summary in summaries:
        if summary is not None:
            rank, rate = summary["data_rank"], summary["samples_per_s"]
            rates[rank] = min(rate, rates.get(rank, rate))
    per_worker = sum(rates.values()) / len(rates) if rates else 0.0
    return per_worker * max(slices, len(rates)), per_worker


def final_figures(
    summaries: list[dict | None],
    last_epoch: dict,
    step: int,
    times: tuple[float, float, float | None],
    device: torch.device,
    slices: int = 1,
) -> dict:
    """run.json's `final`: the last evaluation, throughput after warm-up (over `slices`
    data-parallel slices at least), wall and set-up time (`times`: wall, setup, first step's
    unix time), the largest trainer's peak memory."""
    wall_s, setup_s, first_step_at = times
    total, per_worker = throughput(summaries, slices)
    alive = [s for s in summaries if s is not None]
    kind = peak_memory(device)[1]
    medians = [s["median_step_s"] for s in alive if s["median_step_s"] is not None]
    return {
        "step": step,
        "val_accuracy": last_epoch.get("val_accuracy"),
        "val_loss": last_epoch.get("val_loss"),
        "train_loss": last_epoch.get("train_loss"),
        "train_samples_per_s": total,
        "per_worker_samples_per_s": per_worker,
        "median_step_s": max(medians) if medians else None,  # the slowest trainer's
        "wall_s": wall_s,
        "setup_s": setup_s,
        "first_step_at_unix": first_step_at,
        "peak_memory_bytes": max(s["peak_memory_bytes"] for s in alive),
        "peak_memory_kind": kind,
    }
