"""Speculative decoding with prompt-lookup drafts: guess the next tokens from n-grams of the prompt
and the text so far, and let the model check them all in one run of its chunk programs.

Drafting (as transformers' ``prompt_lookup_num_tokens`` and llama.cpp's lookup decoding): the longest
suffix of the sequence (up to ``max_ngram`` tokens) that occurs earlier in it, prompt and output alike;
the tokens that followed its most recent earlier occurrence (up to ``num_tokens``) are the draft. A
match shorter than ``min_ngram`` tokens drafts nothing and the token decodes plainly: how long the match
is predicts whether the model follows it (SmolLM2-135M on bench_serve's code edit, every step drafted:
the first draft was chosen after 33% of 1-token and 20% of 2-token matches, mean 0.6 and 0.3 tokens
accepted, against 60% and 2.9 tokens after 3-token matches and 95% and 5.6 after 12 or more), and a
check costs more than a step. Text that copies or edits its prompt (code edits, quoting, extraction)
drafts well; free text seldom matches and then decodes as usual.

Checking: after the token just chosen, ``t``, the model runs ``[t, d1, ..., dk]`` over its KV cache
in one chunk (``CausalLM.extend``: one dispatch per layer program, however many drafts, in the chunk
programs' ``PlanOptions.draft_chunk`` bucket when they fit it), which gives
the logits after ``t`` and after each draft. The next token is chosen from the first of them exactly as
plain decoding chooses it (same processors, same sampler, same random draws); while the chosen token
equals the next draft, the logits after that draft are already computed and are used next, at no
cost. At the first mismatch the cache is truncated to the accepted positions (the rejected drafts'
keys and values are masked out and later overwritten), and the chosen token starts the next check.
A check costs more than a decode step (on the emulator about 1.45-1.6 steps for SmolLM2-135M, 1 to 7
drafts), so a check whose first draft is rejected is a loss: after a second one in a row, the next ``backoff`` tokens decode
plainly, ``backoff`` doubling (1, 2, 4, ... up to :data:`MAX_BACKOFF`) while checks keep failing, and reset
by a check that gains a token.
Which steps check changes no token: the logits are the same either way.

The model side is a :class:`Target`: one sequence's lane (``ModelTarget``: lane 0 of a ``CausalLM``;
``orion.generation.batch.LaneTarget``: a lane of a batch, whose plain steps join the batch's decode steps).

Why the output keeps the model's distribution: the draft ``d`` is deterministic, i.e. a draft
distribution ``q`` with all its mass on ``d``. Speculative sampling's rule (Leviathan et al. 2023;
Chen et al. 2023) accepts ``d`` with probability ``min(1, p(d) / q(d)) = p(d)`` and otherwise samples
from ``norm(max(0, p - q))``, which is ``p`` without ``d``, renormalised. Drawing ``t ~ p`` and
accepting ``d`` iff ``t == d`` does exactly that, in one draw: so greedy and sampled output, for a
given seed, are the tokens plain decoding chooses from the same logits (the chunk programs' logits
equal decode's to within fp16 rounding).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from orion.errors import OrionError

if TYPE_CHECKING:
    from orion.generation.loop import CausalLM

METHODS = ("prompt-lookup",)
MAX_BACKOFF = 16  # most plain steps after failed checks before the next check


class SpeculationError(OrionError, ValueError):
    """A speculative-decoding setting makes no sense."""


@dataclass(frozen=True)
class Speculation:
    """Prompt-lookup speculative decoding: up to ``num_tokens`` drafts per check, from the longest n-gram
    (``max_ngram`` down to ``min_ngram`` tokens) of the sequence's end found earlier in it; no check after a
    shorter match."""

    method: str = "prompt-lookup"
    num_tokens: int = 7  # with the token before them, the 8-token chunk bucket (PlanOptions.draft_chunk)
    max_ngram: int = 16  # longer matches than this predict no better
    min_ngram: int = 3  # shorter matches' drafts were chosen too seldom to pay for a check (module docstring)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise SpeculationError(f"speculative method {self.method!r}: use one of {METHODS}")
        for name in ("num_tokens", "max_ngram", "min_ngram"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise SpeculationError(f"speculative {name}={value!r}: use a positive integer")
        if self.min_ngram > self.max_ngram:
            raise SpeculationError(f"speculative min_ngram={self.min_ngram} > max_ngram={self.max_ngram}: "
                                   f"give min_ngram <= max_ngram")

    @classmethod
    def of(cls, given: Speculation | str | None) -> Speculation | None:
        """``given`` as settings: a :class:`Speculation`, a method name (its defaults), or None (off)."""
        if given is None or isinstance(given, Speculation):
            return given
        if isinstance(given, str):
            return cls(method=given)
        raise SpeculationError(f"speculative={given!r}: give 'prompt-lookup', a Speculation(...), or None")


def prompt_lookup(history: Sequence[int], num_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to ``num_tokens`` tokens that followed the most recent earlier occurrence of the longest n-gram
    (``max_ngram`` down to ``min_ngram`` tokens) ending ``history``; [] when none occurs earlier.

    The occurrences of the last token are narrowed one token further back at a time, so a long
    ``max_ngram`` costs only as many passes as the longest match is long."""
    seq = np.asarray(history, dtype=np.int64)
    size = seq.size
    ends = np.flatnonzero(seq[:size - 1] == seq[-1]) if size > 1 else seq[:0]  # earlier 1-grams' last positions
    n = 1
    while ends.size and n < max_ngram:
        reach = ends[ends >= n]  # occurrences with a token before them
        longer = reach[seq[reach - n] == seq[size - 1 - n]]
        if not longer.size:
            break
        ends, n = longer, n + 1
    if not ends.size or n < min_ngram:
        return []
    follow = int(ends[-1]) + 1
    return [int(t) for t in seq[follow:follow + num_tokens]]


@dataclass
class SpeculationStats:
    """What a speculative run did: checks (chunk runs), drafted and accepted tokens."""

    checks: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over drafted ones (0 before any draft)."""
        return self.accepted / self.drafted if self.drafted else 0.0


class Target(Protocol):
    """One sequence's lane of a model, as a speculator drives it."""

    def decode(self, token: int) -> Callable[[], np.ndarray]:
        """Append ``token``; returns what gives its logits ``[vocab]`` (a batch lane's come from the next decode
        step of the whole batch)."""

    def check(self, tokens: list[int]) -> np.ndarray:
        """Append ``tokens`` in one chunk run; the logits ``[len(tokens), vocab]`` after each."""

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions."""

    def length(self) -> int:
        """Positions held."""

    def context(self) -> int:
        """Positions the lane can hold."""


class ModelTarget:
    """Lane 0 of a ``CausalLM`` (``generate``'s sequence)."""

    def __init__(self, model: CausalLM) -> None:
        self.model = model

    def decode(self, token: int) -> Callable[[], np.ndarray]:
        logits = self.model.decode_step(token)
        return lambda: logits

    def check(self, tokens: list[int]) -> np.ndarray:
        return self.model.extend(tokens)

    def truncate(self, length: int) -> None:
        self.model.truncate(length)

    def length(self) -> int:
        return self.model.cache.length

    def context(self) -> int:
        return self.model.cache.context


class Speculator:
    """The logits source of a speculative generation: ``next_logits(token, wanted)`` returns the logits after
    ``token`` (just chosen) from a check made earlier when ``token`` was its draft, else from a new check of
    ``token`` and the drafts after it (or a plain step while backing off); ``close()`` forgets the positions
    of drafts never confirmed."""

    def __init__(self, target: Target, settings: Speculation, prompt_ids: Sequence[int]) -> None:
        self.target = target
        self.settings = settings
        self.history = list(prompt_ids)
        self.pending: list[tuple[int, np.ndarray]] = []  # (draft, the logits after it), checked but not chosen yet
        self.stats = SpeculationStats()
        self._gained = True  # whether the last check's first draft was chosen
        self._backoff = 0  # plain steps to take after the next failed check
        self._plain = 0  # plain steps left before the next check

    def next_logits(self, token: int, wanted: int) -> np.ndarray:
        """The logits after ``token``; ``wanted``: how many more tokens the generation may still choose after
        the one these logits choose (drafts beyond it would be wasted)."""
        return self.advance(token, wanted)()

    def advance(self, token: int, wanted: int) -> Callable[[], np.ndarray]:
        """``next_logits`` in two halves: appends ``token`` (a check, or a plain step the target may defer)
        now, and returns what gives its logits."""
        self.history.append(token)
        if self.pending and self.pending[0][0] == token:
            self.stats.accepted += 1
            self._gained = True
            logits = self.pending.pop(0)[1]
            return lambda: logits
        if self.pending and not self._gained:  # the check gained nothing: back off
            self._plain = self._backoff
            self._backoff = min(MAX_BACKOFF, max(1, 2 * self._backoff))
        elif self.pending:
            self._backoff = 0
        self.close()
        target, s = self.target, self.settings
        if self._plain:
            self._plain -= 1
            return target.decode(token)
        room = min(s.num_tokens, wanted, target.context() - target.length() - 1)
        drafts = prompt_lookup(self.history, room, s.max_ngram, s.min_ngram) if room > 0 else []
        if not drafts:
            return target.decode(token)
        rows = target.check([token, *drafts])
        self.stats.checks += 1
        self.stats.drafted += len(drafts)
        self.pending, self._gained = list(zip(drafts, rows[1:])), False
        return lambda: rows[0]

    def close(self) -> None:
        """Truncate the cache to the confirmed positions (drop the drafts never chosen)."""
        if self.pending:
            self.target.truncate(self.target.length() - len(self.pending))
            self.pending = []
