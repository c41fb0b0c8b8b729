"""dlscale: profile a PyTorch model, predict its cost on real hardware, and train it in parallel."""

__version__ = "0.1.0"
