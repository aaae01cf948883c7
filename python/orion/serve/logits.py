"""The OpenAI parameters beyond what :mod:`orion.generation.sampling` does: frequency and presence
penalties, applied after the shared repetition penalty to one step's float32 logits ``[vocab]``
(min-p is the sampler's own: ``next_token(..., min_p=)``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from orion.generation.sampling import apply_repetition_penalty
from orion.serve.engine import SamplingParams


class LogitsProcessor:
    """Applies ``params``' repetition, frequency and presence penalties to each step's logits;
    ``record(token)`` after each new token."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int], vocab_size: int) -> None:
        self.params = params
        self._history = list(prompt_ids)  # prompt and new tokens (repetition penalty)
        self._counts = np.zeros(vocab_size, dtype=np.int64)  # new tokens only (frequency/presence)

    @property
    def active(self) -> bool:
        p = self.params
        return bool(p.repetition_penalty not in (None, 1.0) or p.frequency_penalty or p.presence_penalty)

    def record(self, token: int) -> None:
        self._history.append(token)
        self._counts[token] += 1

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        if not self.active:
            return logits
        p = self.params
        out = apply_repetition_penalty(logits.astype(np.float32), self._history, p.repetition_penalty)
        if p.frequency_penalty or p.presence_penalty:
            out = out - (p.frequency_penalty * self._counts + p.presence_penalty * (self._counts > 0)).astype(np.float32)
        return out
