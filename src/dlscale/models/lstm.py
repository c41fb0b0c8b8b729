"""An LSTM sequence classifier: token ids in, one label per sequence out."""

from __future__ import annotations

from torch import Tensor, nn


class LSTMClassifier(nn.Module):
    """Embedding → LSTM → Linear on the last time step's output."""

    def __init__(
        self, vocab_size: int, num_classes: int, embed_dim: int, hidden_size: int, num_layers: int
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden_size, num_layers=num_layers, batch_first=True)
        self.fc = nn.Linear(hidden_size, num_classes)

    def forward(self, idx: Tensor) -> Tensor:
        if idx.dim() != 2:
            raise ValueError(f"lstm expects token ids of shape (B, T), got {tuple(idx.shape)}")
        x = self.embed(idx)  # (B, T, embed_dim)
        out, _ = self.lstm(x)  # (B, T, hidden_size): top layer's output at every step
        # The last step has read the whole sequence, so it summarises it.
        return self.fc(out[:, -1, :])  # (B, num_classes)


def lstm(
    vocab_size: int = 256,
    num_classes: int = 10,
    embed_dim: int = 64,
    hidden_size: int = 128,
    num_layers: int = 1,
    context_length: int | None = None,
) -> nn.Module:
    """LSTM classifier for int64 (B, T) token ids → (B, num_classes) logits.

    ``context_length`` is accepted and unused: an LSTM takes any sequence length, but the model
    builder passes the data-derived context_length to every factory that names it.
    """
    del context_length  # accepted so the data-derived default can be passed; see docstring
    return LSTMClassifier(vocab_size, num_classes, embed_dim, hidden_size, num_layers)
