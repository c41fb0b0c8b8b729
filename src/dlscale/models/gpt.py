"""A small decoder-only transformer in the nanoGPT style: the zoo's language model."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position sees only itself and earlier positions.

    Queries, keys and values are three projections, not one fused matrix, and the head count is
    read off their width: split by output features across devices (tensor parallel), each
    device then holds whole heads, and the same code runs on its share of them.
    """

    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.head_size = d_model // n_head
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        hs = self.head_size
        # nh: every head, or this device's share of them under tensor parallel.
        q = self.q(x).view(B, T, -1, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k(x).view(B, T, -1, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = self.v(x).view(B, T, -1, hs).transpose(1, 2)  # (B, nh, T, hs)
        dropout_p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, nh·hs): heads side by side
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward: d → 4d → d with GELU, the width ratio of GPT-2."""

    def __init__(self, d_model: int, dropout: float):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))  # (B, T, C)


class Block(nn.Module):
    """Pre-LN transformer block: normalise before each sublayer, add its output back."""

    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))  # (B, T, C)
        return x + self.mlp(self.ln2(x))  # (B, T, C)


class GPT(nn.Module):
    """Token + learned position embeddings, n_layer blocks, final LayerNorm, vocabulary head."""

    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        n_layer: int,
        d_model: int,
        n_head: int,
        dropout: float,
        tie_weights: bool,
    ):
        super().__init__()
        self.context_length = context_length
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context_length, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            # Sharing input and output embeddings saves vocab_size·d_model parameters and helps
            # small models (Press & Wolf 2017); count_parameters counts the shared tensor once.
            self.lm_head.weight = self.tok_emb.weight
        self._init_weights(n_layer)

    def _init_weights(self, n_layer: int) -> None:
        # GPT-2's scheme: N(0, 0.02) everywhere, and residual output projections scaled down by
        # sqrt(2·n_layer) because each block adds two of them to the residual stream.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            for proj in (block.attn.proj, block.mlp.proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx: Tensor) -> Tensor:
        if idx.dim() != 2:
            raise ValueError(f"gpt expects token ids of shape (B, T), got {tuple(idx.shape)}")
        seq_len = idx.shape[1]
        if seq_len > self.context_length:
            raise ValueError(
                f"sequence length {seq_len} exceeds the model's context_length "
                f"{self.context_length}"
            )
        positions = torch.arange(seq_len, device=idx.device)  # (T,)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(positions))  # (B, T, C)
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        return self.lm_head(self.ln_f(x))  # (B, T, vocab_size)


def gpt(
    vocab_size: int = 256,
    context_length: int = 64,
    n_layer: int = 2,
    d_model: int = 128,
    n_head: int = 4,
    dropout: float = 0.0,
    tie_weights: bool = True,
) -> nn.Module:
    """A decoder-only transformer: int64 (B, T) ids, T ≤ context_length → logits (B, T, vocab_size).

    With ``tie_weights`` the output head shares the token embedding's weight matrix.
    """
    if d_model % n_head != 0:
        raise ValueError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
    for name, value in (("vocab_size", vocab_size), ("context_length", context_length)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    return GPT(vocab_size, context_length, n_layer, d_model, n_head, dropout, tie_weights)
