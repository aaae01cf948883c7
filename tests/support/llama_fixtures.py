"""Test weights for Llama whose every parameter matters to the logits."""

from __future__ import annotations

import numpy as np

from orion.models.llama.config import LlamaConfig
from orion.models.llama.weights import LlamaWeights, random_weights


def lively(config: LlamaConfig, seed: int = 0) -> LlamaWeights:
    """Random weights large enough that every parameter matters, with non-unit norm gains."""
    w = random_weights(config, seed)
    rng = np.random.default_rng(seed + 100)
    for _, array in w.arrays():
        if array.ndim == 2:
            array *= 10
        else:
            array += rng.normal(0, 0.3, array.shape).astype(np.float32)
    return w
