"""Test weights for GPT-2 whose every parameter matters to the logits."""

from __future__ import annotations

import numpy as np

from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.weights import GPT2Weights, random_weights


def lively_weights(config: GPT2Config, seed: int = 0) -> GPT2Weights:
    """GPT-2 init with every array perturbed (non-zero biases, non-unit gammas, 20x matrices),
    so that each parameter matters to the logits and greedy decoding does not collapse at once."""
    w = random_weights(config, seed)
    rng = np.random.default_rng(seed + 1000)
    for _, array in w.arrays():
        if array.ndim == 2:
            array *= 20
        else:
            array += rng.normal(0, 0.2, array.shape).astype(np.float32)
    return w
