"""A Hugging Face transformers model as a tenant's own code: GPT-2's architecture, built from a
config (no weights are downloaded; the service's jobs have no network), wrapped to take token ids
and return next-token logits as dlscale's language-modelling loop expects. Imported in the job's
sandbox as `inputs.hf_gpt2`."""

from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel


class CausalLM(nn.Module):
    def __init__(self, model: GPT2LMHeadModel):
        super().__init__()
        self.model = model

    def forward(self, ids):  # (B, T) int64 -> (B, T, vocab) logits
        return self.model(input_ids=ids).logits


def build(vocab_size: int = 64, context_length: int = 32, layers: int = 2, width: int = 64):
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=context_length,
        n_embd=width,
        n_layer=layers,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return CausalLM(GPT2LMHeadModel(config))
