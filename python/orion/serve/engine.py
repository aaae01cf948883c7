"""The engine protocol: everything the server needs from a model, and nothing about its internals.

The server drives an :class:`Engine` from one worker thread (the thread that owns the device). It
may hold several generators open at once and step them in turn, one token each; an engine that can
hold only one sequence at a time says so with ``max_sequences = 1``. A batching engine advances all its
open sequences in one step (the first generator stepped in a round runs it, the others find their
token computed) and may yield None for "no token this round" while it reads a new prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from orion.errors import OrionError
from orion.generation.sampling import top_ids
from orion.generation.structured import Grammar

SCHEDULERS = ("batched", "turns")  # how ModelEngine steps its sequences (its ``scheduler``; serve --scheduler)


class PromptError(OrionError, ValueError):
    """A prompt cannot be built from the request (for example a chat template refuses the messages)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to choose each new token (OpenAI's parameters, already validated by the server).

    Order of application to each step's logits: ``repetition_penalty`` (Hugging Face's rule, over the
    prompt and the new tokens), ``frequency_penalty``/``presence_penalty`` (OpenAI's rule, over the new
    tokens), ``logit_bias`` (OpenAI's: added to the logits of the ids it names), ``grammar`` (structured
    output: every token that leaves it at -inf), then the sampler of :mod:`orion.generation.sampling`:
    ``temperature``, ``top_k``, ``top_p`` and ``min_p`` (relative to the most likely token), in
    transformers' order. ``temperature == 0`` is greedy.
    """

    max_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    logit_bias: tuple[tuple[int, float], ...] = ()
    grammar: Grammar | None = None
    logprobs: int | None = None  # None: no log-probabilities; else each token's and this many alternatives'
    speculative: bool | None = None  # prompt-lookup speculative decoding; None: the engine's default


@dataclass(frozen=True)
class TokenLogprob:
    """A new token with its log-probability under the model (log-softmax of the raw logits, float64) and the
    ``top`` most likely tokens' (id, log-probability), most likely first, as OpenAI's ``logprobs`` report."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    @classmethod
    def of(cls, token: int, logits: np.ndarray, top: int) -> TokenLogprob:
        z = logits.astype(np.float64)
        finite = np.isfinite(z)
        peak = z[finite].max() if finite.any() else 0.0
        logp = z - (peak + np.log(np.exp(z[finite] - peak).sum()))
        best = top_ids(logp, top)
        return cls(int(token), float(logp[token]), tuple((int(i), float(logp[i])) for i in best))


@runtime_checkable
class Engine(Protocol):
    """A loaded model the server can tokenize with and generate from."""

    model_id: str  # the name clients pass as ``model``
    context_length: int  # positions in the KV cache: a prompt longer than this is refused
    vocab_size: int  # token ids are in [0, vocab_size)
    eos_token_id: int | None  # ends generation (finish_reason "stop"); also the BOS of an empty prompt
    max_sequences: int  # how many generators may be open at once

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, special tokens written in it included, none added."""

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``."""

    def chat_prompt(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text for chat ``messages`` (``role``/``content`` pairs), ending where the assistant's
        reply starts: the tokenizer's chat template when it has one, else a documented plain format.
        ``tools`` (OpenAI function tools) are given to the template; only called with them when
        ``tool_format()`` names a format."""

    def tool_format(self) -> str | None:
        """The format of tool calls this model's chat template teaches (``orion.serve.tools``), or None when
        the template does not render tools."""

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams,
                 cancelled: Callable[[], bool]) -> Iterator[int | TokenLogprob | None]:
        """Yield up to ``params.max_tokens`` new ids (as :class:`TokenLogprob` when ``params.logprobs`` is
        set; None for no token this round); stop after a token in ``params.stop_token_ids``, at the context
        end, or before computing the next token once ``cancelled()`` is true. An engine that also has
        ``generate_choices(prompt_ids, params, cancelled, n)`` gives ``n`` generators of one prompt (the
        ``n`` of OpenAI's API); without it, requests for more than one choice are refused."""
