"""Token files for training tests: a nanoGPT ``train.bin``/``val.bin`` of a learnable stream."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def periodic_tokens(directory: Path, vocab: int, repeats: int = 400, period: int = 23) -> Path:
    """``directory`` holding ``repeats`` copies of one random ``period``-token pattern (seed 0), split 9:1 into
    train and validation: learnable, so a training loss must fall."""
    stream = np.tile(np.random.default_rng(0).integers(0, vocab, period), repeats).astype("<u2")
    cut = len(stream) * 9 // 10
    stream[:cut].tofile(directory / "train.bin")
    stream[cut:].tofile(directory / "val.bin")
    return directory
