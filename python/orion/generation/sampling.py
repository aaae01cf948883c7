"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus) sampling."""

from __future__ import annotations

import numpy as np

from orion.errors import OrionError


class SamplingError(OrionError, ValueError):
    """A sampling setting makes no sense."""


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Clear errors for settings that make no sense."""
    if temperature < 0 or not np.isfinite(temperature):
        raise SamplingError(f"temperature={temperature}: use 0 (greedy) or a positive number")
    if top_k is not None and top_k < 1:
        raise SamplingError(f"top_k={top_k}: use a positive number of tokens, or None")
    if top_p is not None and not 0 < top_p <= 1:
        raise SamplingError(f"top_p={top_p}: use a probability in (0, 1], or None")


def next_token(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
               rng: np.random.Generator) -> int:
    """Greedy when ``temperature == 0``, else a sample from the tempered, truncated distribution."""
    if temperature == 0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / temperature
    if top_k is not None and top_k < scaled.size:
        kth = np.partition(scaled, -top_k)[-top_k]
        keep = scaled > kth
        ties = np.flatnonzero(scaled == kth)[: top_k - int(keep.sum())]  # lowest ids first, as argmax
        keep[ties] = True
        scaled = np.where(keep, scaled, -np.inf)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if top_p is not None and top_p < 1:
        order = np.argsort(-probs, kind="stable")
        keep = np.cumsum(probs[order]) - probs[order] < top_p  # the smallest prefix reaching top_p
        trimmed = np.zeros_like(probs)
        trimmed[order[keep]] = probs[order[keep]]
        probs = trimmed / trimmed.sum()
    return int(rng.choice(probs.size, p=probs))
