"""Datasets: every reader returns a DataBundle; nothing is ever downloaded."""

from dlscale.data.build import build_data
from dlscale.data.bundle import DataBundle

__all__ = ["DataBundle", "build_data"]
