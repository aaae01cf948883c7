"""Token files for training tests: a nanoGPT ``train.bin``/``val.bin`` of a learnable stream, or of prepared text."""

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


def prepared_text(directory: Path, text: str, vocab_size: int) -> Path:
    """``directory/data``: ``text`` prepared as ``orion data prepare`` does, with a byte-level BPE of ``vocab_size``
    tokens."""
    from orion.train import data

    (directory / "text.txt").write_text(text)
    data.prepare([directory / "text.txt"], directory / "data", vocab_size=vocab_size)
    return directory / "data"
