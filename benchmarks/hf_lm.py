"""Hugging Face GPT-2 and BERT, built from configs with random weights (no download), as models
dlscale trains: token ids (B, T) in, logits (B, T, vocab) out.

The architectures are transformers' own (GPT-2's `Conv1D` projections, BERT's encoder and masked
LM head); the sizes are cut down (4 layers × 256, vocabulary 8,192) so that a training step on
the 2-core development machine takes tens of milliseconds, not seconds.
"""

from __future__ import annotations

import transformers
from torch import nn

LAYERS, WIDTH, HEADS, VOCAB, POSITIONS = 4, 256, 4, 8192, 128


class Logits(nn.Module):
    """A transformers model whose forward returns its logits tensor, as dlscale's loss takes."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):  # (B, T) token ids → (B, T, vocab)
        return self.model(input_ids=x).logits


def gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        n_layer=LAYERS,
        n_embd=WIDTH,
        n_head=HEADS,
        vocab_size=VOCAB,
        n_positions=POSITIONS,
        bos_token_id=0,
        eos_token_id=0,
    )
    return Logits(transformers.GPT2LMHeadModel(config))


def bert() -> nn.Module:
    config = transformers.BertConfig(
        num_hidden_layers=LAYERS,
        hidden_size=WIDTH,
        num_attention_heads=HEADS,
        intermediate_size=4 * WIDTH,
        vocab_size=VOCAB,
        max_position_embeddings=POSITIONS,
    )
    return Logits(transformers.BertForMaskedLM(config))
