"""`dlscale bench sparsity SPEC --levels 0,0.5,0.8,0.9,0.95`: magnitude pruning, a short
fine-tune at each level, and what sparsity does and does not buy on dense kernels.

The spec is trained once (dense). Then for each level, from that model: every Linear and
Conv2d weight pruned by magnitude with `torch.nn.utils.prune` (unstructured: the smallest
|w| across the layer; or 2:4, the two smallest of every four consecutive weights, the pattern
sparse tensor cores run), fine-tuned for `--finetune-steps` steps with the mask held, and
measured: validation accuracy, the measured sparsity, inference latency of one batch of
`--latency-batch` validation samples (the same dense kernels run the zeros; every level's
timed after all the fine-tuning, in rounds taking the levels in turn, with their spread, as
`bench precision` times its formats), and the bytes a compressed format would need (CSR: 4-byte
values and column indices plus row pointers; 2:4: half the values plus 2-bit indices).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils import prune

from dlscale.bench.precision import (
    LATENCY_BATCH,
    NOISY_SPREAD,
    Forward,
    interleaved_latencies,
    latency_input,
)
from dlscale.errors import UserError, once_each
from dlscale.jobspec import SingleStrategy, load_spec
from dlscale.train.device import resolve_device
from dlscale.train.loop import Trainer
from dlscale.train.score import evaluate
from dlscale.train.step import TrainStep

SCHEMA = "dlscale.bench.sparsity/1"
PATTERNS = ("unstructured", "2:4")


def prunable(model: nn.Module) -> list[tuple[nn.Module, str]]:
    return [(m, "weight") for m in model.modules() if isinstance(m, nn.Linear | nn.Conv2d)]


class TwoOfFour(prune.BasePruningMethod):
    """N:M = 2:4 along the input dimension: in every 4 consecutive weights, the 2 smallest go."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t: torch.Tensor, default_mask: torch.Tensor) -> torch.Tensor:
        flat = t.reshape(t.shape[0], -1)
        if flat.shape[1] % 4:
            return default_mask  # a row that does not split into fours keeps its weights
        groups = flat.abs().reshape(flat.shape[0], -1, 4)
        keep = torch.zeros_like(groups, dtype=torch.bool)
        keep.scatter_(2, groups.topk(2, dim=2).indices, True)
        return default_mask * keep.reshape(t.shape).to(default_mask.dtype)


def sparse_bytes(weight: torch.Tensor, pattern: str) -> int:
    """What the nonzeros need stored: CSR for unstructured, 2:4's half plus its indices."""
    dense = weight.reshape(weight.shape[0], -1)
    if pattern == "2:4" and dense.shape[1] % 4:
        return dense.numel() * 4  # kept dense (rows do not split into fours)
    if pattern == "2:4":
        return dense.numel() // 2 * 4 + dense.numel() // 2 // 4  # values + 2 bits each
    nonzero = int((dense != 0).sum())
    return nonzero * (4 + 4) + (dense.shape[0] + 1) * 4  # values, column indices, row pointers


def run_sparsity_bench(
    spec_path,
    levels: list[float],
    pattern: str,
    finetune_steps: int,
    steps: int | None,
    latency_batch: int = LATENCY_BATCH,
) -> dict:
    if pattern not in PATTERNS:
        raise UserError(f"--pattern must be unstructured or 2:4 (got '{pattern}')")
    if not levels or any(not 0 <= level < 1 for level in levels):
        raise UserError(f"--levels are fractions in [0, 1), e.g. 0,0.5,0.9 (got {levels})")
    once_each("--levels", levels)  # it would be pruned and timed twice
    if pattern == "2:4" and any(level not in (0, 0.5) for level in levels):
        raise UserError("--pattern 2:4 prunes exactly half: give --levels 0,0.5")
    if finetune_steps < 0:
        raise UserError(f"--finetune-steps: must be 0 or more (got {finetune_steps})")
    if latency_batch < 1:
        raise UserError(f"--latency-batch: must be a positive integer (got {latency_batch})")
    spec = load_spec(spec_path)
    changes: dict = {"strategy": SingleStrategy(), "precision": "fp32"}
    if steps is not None:
        changes.update(steps=steps, epochs=None)
    spec = spec.model_copy(update=changes)
    device = resolve_device(spec.device)
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(spec, Path(scratch) / "dense")
        # Too few validation samples: one line before any training.
        x = latency_input(trainer.val_loader, latency_batch).to(device)
        trainer.run()
        pruned = [_level(trainer, level, pattern, finetune_steps, device) for level in levels]
    # Every level's latency after all the fine-tuning, the levels taken in turn each round.
    forwards = [Forward(model.eval(), x, device, "fp32") for _, model in pruned]
    rows = [
        {**row, **found}
        for (row, _), found in zip(pruned, interleaved_latencies(forwards), strict=True)
    ]
    return {
        "schema": SCHEMA,
        "spec": str(spec_path),
        "model": spec.model.name,
        "device": str(device),
        "pattern": pattern,
        "finetune_steps": finetune_steps,
        "latency_batch": len(x),
        "noisy_spread": NOISY_SPREAD,
        "noisy": any(row["latency_noisy"] for row in rows),
        "rows": rows,
    }


def _level(
    trainer: Trainer, level: float, pattern: str, steps: int, device
) -> tuple[dict, nn.Module]:
    """One level's model, pruned and fine-tuned, and its row (the latency is timed later)."""
    model = copy.deepcopy(trainer.module)
    targets = prunable(model)
    if level > 0:
        for module, name in targets:
            if pattern == "2:4":
                TwoOfFour.apply(module, name)
            else:
                prune.l1_unstructured(module, name, amount=level)
        _finetune(model, trainer, steps, device)
        for module, name in targets:
            prune.remove(module, name)  # the zeros stay; the mask goes
    weights = [getattr(module, name) for module, name in targets]
    total = sum(w.numel() for w in weights)
    zeros = sum(int((w == 0).sum()) for w in weights)
    _loss, accuracy = evaluate(model, trainer.val_loader, device, "fp32")
    dense_bytes = total * 4
    stored = sum(sparse_bytes(w.detach(), pattern) for w in weights) if level else dense_bytes
    row = {
        "level": level,
        "measured_sparsity": zeros / total,
        "val_accuracy": accuracy,
        "dense_weight_bytes": dense_bytes,
        "sparse_weight_bytes": stored,
    }
    return row, model


def _finetune(model: nn.Module, trainer: Trainer, steps: int, device) -> None:
    """`steps` optimizer steps with the pruning masks held (the loop's own step)."""
    from dlscale.train.step import build_optimizer

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    step = TrainStep(model, build_optimizer(params, trainer.spec.optimizer), device, "fp32")
    done = 0
    while done < steps:
        for batch in trainer.train_loader:
            step(batch[0].to(device), batch[1].to(device))
            done += 1
            if done >= steps:
                break
