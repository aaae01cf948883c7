"""Choosing the next token from logits: repetition penalty, then greedy, or temperature, top-k, top-p
(nucleus) and min-p sampling, in the order and with the semantics of Hugging Face transformers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from orion.errors import OrionError


class SamplingError(OrionError, ValueError):
    """A sampling setting makes no sense."""


def check_sampling(temperature: float, top_k: int | None, top_p: float | None, min_p: float | None = None,
                   repetition_penalty: float | None = None) -> None:
    """Clear errors for settings that make no sense."""
    if not _is_number(temperature) or temperature < 0 or not np.isfinite(temperature):
        raise SamplingError(f"temperature={temperature}: use 0 (greedy) or a positive number")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1):
        raise SamplingError(f"top_k={top_k}: use a positive number of tokens, or None")
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise SamplingError(f"top_p={top_p}: use a probability in (0, 1], or None")
    if min_p is not None and not (_is_number(min_p) and 0 <= min_p <= 1):
        raise SamplingError(f"min_p={min_p}: use a probability in [0, 1], or None")
    if repetition_penalty is not None and not (_is_number(repetition_penalty) and repetition_penalty > 0
                                               and np.isfinite(repetition_penalty)):
        raise SamplingError(f"repetition_penalty={repetition_penalty}: use a positive number (1 = no penalty), "
                            f"or None")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def apply_repetition_penalty(logits: np.ndarray, previous: Sequence[int], penalty: float | None) -> np.ndarray:
    """Logits of tokens already in ``previous`` (prompt and generated) divided by ``penalty`` when
    positive, multiplied when negative (the CTRL paper's rule, as transformers applies it)."""
    if penalty is None or penalty == 1 or not len(previous):
        return logits
    seen = np.unique(np.asarray(previous, dtype=np.int64))
    out = logits.copy()
    scores = out[seen].astype(np.float64)
    with np.errstate(over="ignore"):  # a tiny penalty overflows: the result saturates at the dtype's extreme
        penalized = np.where(scores < 0, scores * penalty, scores / penalty)
    extreme = np.finfo(out.dtype).max if np.issubdtype(out.dtype, np.floating) else np.inf
    out[seen] = np.clip(penalized, -extreme, extreme)
    return out


def sampling_probs(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
                   min_p: float | None = None) -> np.ndarray:
    """The distribution ``next_token`` samples from when ``temperature > 0`` (float64 ``[vocab]``)."""
    logits = logits.astype(np.float64)
    with np.errstate(over="ignore"):  # a tiny temperature: every logit below the top one goes to -inf
        scaled = (logits - logits.max()) / temperature
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
    if min_p:
        probs = np.where(probs >= min_p * probs.max(), probs, 0.0)  # the most likely token always stays
        probs /= probs.sum()
    return probs


def next_token(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
               rng: np.random.Generator, min_p: float | None = None) -> int:
    """Greedy when ``temperature == 0``, else a sample from the tempered, truncated distribution."""
    if temperature == 0:
        return int(np.argmax(logits))
    probs = sampling_probs(logits, temperature, top_k, top_p, min_p)
    return int(rng.choice(probs.size, p=probs))
