"""Logits processors the server offers beyond plain sampling: repetition, frequency and presence
penalties, and min-p truncation. Each works on one step's float32 logits ``[vocab]``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from orion.serve.engine import SamplingParams


class LogitsProcessor:
    """Applies ``params``' penalties and min-p to each step's logits, in the order that
    :class:`~orion.serve.engine.SamplingParams` documents; ``record(token)`` after each new token."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int], vocab_size: int) -> None:
        self.params = params
        self._seen = np.zeros(vocab_size, dtype=bool)  # prompt and new tokens (repetition penalty)
        self._seen[list(prompt_ids)] = True
        self._counts = np.zeros(vocab_size, dtype=np.int64)  # new tokens only (frequency/presence)

    @property
    def active(self) -> bool:
        p = self.params
        return bool(p.repetition_penalty not in (None, 1.0) or p.frequency_penalty or p.presence_penalty
                    or (p.min_p and p.temperature > 0))

    def record(self, token: int) -> None:
        self._seen[token] = True
        self._counts[token] += 1

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        if not self.active:
            return logits
        p = self.params
        out = logits.astype(np.float32, copy=True)
        if p.repetition_penalty not in (None, 1.0):
            seen = out[self._seen]
            out[self._seen] = np.where(seen < 0, seen * p.repetition_penalty, seen / p.repetition_penalty)
        if p.frequency_penalty or p.presence_penalty:
            out -= (p.frequency_penalty * self._counts + p.presence_penalty * (self._counts > 0)).astype(np.float32)
        if p.min_p and p.temperature > 0:
            # softmax(l / T)[i] >= min_p * max  <=>  l[i] >= max(l) + T * ln(min_p)
            threshold = out.max() + p.temperature * np.log(p.min_p)
            out[out < threshold] = -np.inf
        return out
