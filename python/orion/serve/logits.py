"""The OpenAI parameters beyond what :mod:`orion.generation.sampling` does: frequency and presence
penalties and ``logit_bias``, applied after the shared repetition penalty to one step's float32 logits
``[vocab]``, then the structured-output grammar's mask (min-p is the sampler's own:
``next_token(..., min_p=)``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from orion.generation.sampling import apply_repetition_penalty
from orion.generation.structured import GrammarProcessor
from orion.serve.engine import SamplingParams


class LogitsProcessor:
    """Applies ``params``' repetition, frequency and presence penalties and logit bias to each step's
    logits, then ``guide`` (the grammar of ``params.grammar``); ``record(token)`` after each new token."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int], vocab_size: int,
                 guide: GrammarProcessor | None = None) -> None:
        self.params = params
        self._history = list(prompt_ids)  # prompt and new tokens (repetition penalty)
        self._counts = np.zeros(vocab_size, dtype=np.int64)  # new tokens only (frequency/presence)
        self._penalties = np.zeros(vocab_size, dtype=np.float32)  # of the counts, kept as each token is recorded
        self._bias = np.zeros(vocab_size, dtype=np.float32)
        for token, bias in params.logit_bias:
            self._bias[token] = bias
        self._guide = guide

    @property
    def active(self) -> bool:
        p = self.params
        return bool(p.repetition_penalty not in (None, 1.0) or p.frequency_penalty or p.presence_penalty
                    or p.logit_bias or self._guide is not None)

    def record(self, token: int) -> None:
        self._history.append(token)
        self._counts[token] += 1
        count, p = int(self._counts[token]), self.params
        self._penalties[token] = p.frequency_penalty * count + p.presence_penalty * (count > 0)
        if self._guide is not None:
            self._guide.consume(token)

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        if not self.active:
            return logits
        p = self.params
        out = apply_repetition_penalty(logits.astype(np.float32), self._history, p.repetition_penalty)
        if p.frequency_penalty or p.presence_penalty:
            out = out - self._penalties  # frequency * count + presence, per token: one pass, not five
        if p.logit_bias:
            out = out + self._bias
        return out if self._guide is None else self._guide.mask(out)
