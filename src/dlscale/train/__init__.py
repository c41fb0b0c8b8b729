"""Training: the one train step, the loop around it, timing, checkpoints and the run record."""
