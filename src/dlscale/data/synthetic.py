"""Seeded synthetic data that a model can actually learn: noisy class prototypes, Markov text."""

from __future__ import annotations

import math

import torch
from torch.utils.data import TensorDataset

from dlscale.data.bundle import DataBundle
from dlscale.data.holdout import num_val_samples
from dlscale.errors import UserError
from dlscale.free_memory import available_memory_bytes
from dlscale.jobspec import SyntheticData
from dlscale.units import binary_bytes

# Noise around each class prototype, uniform in ±IMAGE_NOISE_HALF_WIDTH (std 0.14; uniform because
# it is ~1.6× faster to draw than normal noise). Prototypes are uniform in [0, 1], so two of them
# differ by 1/sqrt(6) ≈ 0.41 RMS per value: even a handful of features stay separable, while
# samples of one class still differ from each other.
IMAGE_NOISE_HALF_WIDTH = 0.25
# Markov chains: each token has this many likely successors, followed with FOLLOW_PROB; otherwise
# the next token is uniform. A bigram model therefore predicts ~FOLLOW_PROB / SUCCESSORS of next
# tokens (vs 1 / vocab_size by chance), and the uniform part keeps every token reachable.
SUCCESSORS_PER_TOKEN = 2
FOLLOW_PROB = 0.9


def check_fits_in_memory(need_bytes: int, what: str) -> None:
    """One line, before numpy or torch try the allocation and fail in a traceback, when
    generating `what` needs more memory than this machine has free."""
    free_bytes = available_memory_bytes(torch.device("cpu"))
    if need_bytes > free_bytes:
        raise UserError(
            f"{what} need {binary_bytes(need_bytes)} of memory to generate; this machine has "
            f"{binary_bytes(free_bytes)} free"
        )


def _check_sequences_fit(spec: SyntheticData, source: str) -> None:
    # int64 tokens, each sequence one longer: next-token labels are cut from it
    tokens = spec.num_samples * (spec.seq_len + 1)
    check_fits_in_memory(8 * tokens, f"{source}: {spec.num_samples} sequences of {spec.seq_len}")


def make_synthetic(spec: SyntheticData, seed: int) -> DataBundle:
    """Generate `spec.num_samples` samples with `seed` (same spec and seed → same tensors)."""
    generator = torch.Generator().manual_seed(seed)
    source = "data 'synthetic'"
    if spec.kind == "image":
        if spec.task != "classification":
            raise UserError(
                f"{source}: task '{spec.task}' needs kind: tokens (kind: image is classification)"
            )
        shown = "×".join(str(d) for d in spec.shape)
        values = (spec.num_samples + spec.num_classes) * math.prod(spec.shape)  # + prototypes
        check_fits_in_memory(4 * values, f"{source}: {spec.num_samples} samples of {shown}")
        x, y = synthetic_images(spec.num_samples, spec.shape, spec.num_classes, generator)
        num_classes, vocab_size = spec.num_classes, None
    elif spec.task == "language_modeling":
        _check_sequences_fit(spec, source)
        x, y = markov_next_tokens(spec.num_samples, spec.seq_len, spec.vocab_size, generator)
        num_classes, vocab_size = spec.vocab_size, spec.vocab_size
    else:
        _check_sequences_fit(spec, source)
        x, y = markov_classes(
            spec.num_samples, spec.seq_len, spec.vocab_size, spec.num_classes, generator
        )
        num_classes, vocab_size = spec.num_classes, spec.vocab_size
    # Samples are i.i.d. and labels uniformly random, so the first num_train already form a random
    # (near-stratified) train set; slicing skips copying the whole set as a shuffled split would.
    num_train = len(x) - num_val_samples(len(x), spec.val_fraction, source)
    train = TensorDataset(x[:num_train], y[:num_train])
    val = TensorDataset(x[num_train:], y[num_train:])
    return DataBundle(
        train=train,
        val=val,
        num_classes=num_classes,
        task=spec.task,
        vocab_size=vocab_size,
    )


def synthetic_images(
    num_samples: int, shape: list[int], num_classes: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """x = prototype[y] + noise, clamped to [0, 1]: float32 (N, *shape) and int64 labels (N,)."""
    prototypes = torch.rand((num_classes, *shape), generator=generator)  # (K, *shape)
    y = torch.randint(num_classes, (num_samples,), generator=generator)  # (N,)
    x = torch.empty((num_samples, *shape))  # (N, *shape)
    # In place: at 100k × 784 floats each temporary costs ~300 MB.
    x.uniform_(-IMAGE_NOISE_HALF_WIDTH, IMAGE_NOISE_HALF_WIDTH, generator=generator)
    x.add_(prototypes[y]).clamp_(0.0, 1.0)
    return x, y


def markov_next_tokens(
    num_samples: int, seq_len: int, vocab_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences from one sparse Markov chain: x = tokens[:-1], y = tokens[1:], both (N, T)."""
    successors = _successor_table(1, vocab_size, generator)  # (1, V, S)
    chain = torch.zeros(num_samples, dtype=torch.int64)  # every sequence uses chain 0
    tokens = _walk(successors, chain, seq_len + 1, generator)  # (N, T + 1)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def markov_classes(
    num_samples: int,
    seq_len: int,
    vocab_size: int,
    num_classes: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each class has its own Markov chain; the label is the chain that wrote the sequence.

    Returns int64 tokens (N, T) and int64 labels (N,).
    """
    successors = _successor_table(num_classes, vocab_size, generator)  # (K, V, S)
    y = torch.randint(num_classes, (num_samples,), generator=generator)  # (N,)
    return _walk(successors, y, seq_len, generator), y


def _successor_table(num_chains: int, vocab_size: int, generator: torch.Generator) -> torch.Tensor:
    """The likely next tokens of every token in every chain: int64 (K, V, S)."""
    shape = (num_chains, vocab_size, SUCCESSORS_PER_TOKEN)
    return torch.randint(vocab_size, shape, generator=generator)


def _walk(
    successors: torch.Tensor, chain: torch.Tensor, length: int, generator: torch.Generator
) -> torch.Tensor:
    """Walk sequence i along chain[i] for `length` tokens: int64 (N, length).

    Vectorised over sequences; the loop is over time steps only.
    """
    num_samples = len(chain)
    vocab_size = successors.shape[1]
    tokens = torch.empty((num_samples, length), dtype=torch.int64)
    tokens[:, 0] = torch.randint(vocab_size, (num_samples,), generator=generator)
    for step in range(1, length):
        pick = torch.randint(SUCCESSORS_PER_TOKEN, (num_samples,), generator=generator)
        followed = successors[chain, tokens[:, step - 1], pick]  # (N,)
        uniform = torch.randint(vocab_size, (num_samples,), generator=generator)
        follow = torch.rand(num_samples, generator=generator) < FOLLOW_PROB
        tokens[:, step] = torch.where(follow, followed, uniform)
    return tokens
