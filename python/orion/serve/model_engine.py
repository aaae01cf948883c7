"""The engine protocol for any Orion model (an :class:`orion.generation.loop.CausalLM`).

What it takes from the model runtime: ``orion.models.load(dir, progress=)``, ``dims.context`` and
``dims.vocab_size``, ``tokenizer`` (``encode``/``decode``/``eos_token_id``), ``with_lanes(n)`` and the
:class:`orion.generation.batch.Batch` over its lanes (every open generator is one lane: one decode step
advances them all, a new prompt is read one prefill chunk per step in between, prompts joining together in
one pass), and ``next_token``
(greedy/temperature/top-k/top-p) from ``orion.generation.sampling``.

Chat prompts use the model's chat template (``tokenizer_config.json``'s ``chat_template``, rendered by
:mod:`orion.generation.chat` as transformers renders it). Without a template, the plain format is one
line ``"{role}: {content}"`` per message, then ``"assistant:"``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from orion import models
from orion.generation.batch import Batch, LaneTarget
from orion.generation.chat import ChatTemplate, ChatTemplateError
from orion.generation.loop import CausalLM
from orion.generation.prefix_cache import PrefixCache
from orion.generation.sampling import next_token
from orion.generation.speculative import Speculation, Speculator
from orion.generation.structured import GrammarProcessor
from orion.serve.engine import SCHEDULERS, PromptError, SamplingParams, TokenLogprob
from orion.serve.logits import LogitsProcessor
from orion.serve.tools import arguments_as_objects, tool_format


class ModelEngine:
    """Serves one model; up to ``max_sequences`` sequences at once, each a lane of the decode programs
    (compiled once for that many lanes) with its own KV cache rows."""

    def __init__(self, model: CausalLM, model_id: str, chat_template: ChatTemplate | None = None,
                 max_sequences: int = 4, prefix_cache_bytes: int = 0, speculative: Speculation | None = None,
                 scheduler: str = "batched") -> None:
        """``chat_template`` overrides the model's own (``model.tokenizer.chat_template``); ``prefix_cache_bytes``:
        keep up to this many bytes of computed prompt prefixes for later prompts that start the same
        (``orion.generation.prefix_cache``; 0: off); ``speculative``: prompt-lookup speculative decoding for
        requests that do not say (a request's ``speculative: true`` uses these settings, or the defaults);
        ``scheduler``: ``"batched"`` (one decode step advances every sequence, lanes of one program) or
        ``"turns"`` (each sequence in a single-lane copy of its own, one decode step per sequence: the
        server before batching, kept as the benchmarks' baseline; one choice per request)."""
        if max_sequences < 1:
            raise ValueError(f"max_sequences={max_sequences}: use 1 or more")
        if scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler={scheduler!r}: use one of {', '.join(SCHEDULERS)}")
        self.model = model
        self.tokenizer = model.tokenizer  # raises TokenizerNotFound when the model has none
        self.model_id = model_id
        self.context_length = model.dims.context
        self.vocab_size = model.dims.vocab_size
        self.eos_token_id = self.tokenizer.eos_token_id
        self.max_sequences = max_sequences
        self.speculative = speculative
        self.chat_template = chat_template or self.tokenizer.chat_template
        if prefix_cache_bytes:
            model.prefix_cache = PrefixCache(prefix_cache_bytes)  # its lanes model and forks share it
        self.scheduler = scheduler
        if scheduler == "batched":
            lanes = model.with_lanes(max_sequences) if max_sequences > 1 else model
            lanes.prepare(self.context_length)  # every KV bucket's decode programs before the first request
            alone = None
            if max_sequences > 1 and model.active_adapter is None:
                # A lone sequence steps on the one-lane programs, in the buckets the compile budget leaves room for
                # after the lanes' (prepare keeps the reserve for new prompt lengths; Batch's ``alone``)
                model.prepare(self.context_length)
                alone = model.fork()
            self._batches = [Batch(lanes, alone)]
        else:
            model.prepare(self.context_length)
            self._batches = [Batch(model), *(Batch(model.fork()) for _ in range(max_sequences - 1))]

    @property
    def batch(self) -> Batch:
        """The batch of the ``batched`` scheduler (the first sequence's of ``turns``)."""
        return self._batches[0]

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str], model_id: str | None = None, progress: bool = True,
                       max_sequences: int = 4, model_options: dict[str, Any] | None = None,
                       prefix_cache_bytes: int = 0, speculative: Speculation | None = None,
                       scheduler: str = "batched") -> ModelEngine:
        """Load (and compile) the Hugging Face model directory ``path`` (``model_options``: e.g. ``quant``,
        see ``orion.quant.model_options``); the tokenizer is checked first."""
        models.load_tokenizer(path)  # a missing or broken tokenizer fails before the compile
        model = models.load(path, progress=progress, **(model_options or {}))
        return cls(model, model_id or Path(path).resolve().name, max_sequences=max_sequences,
                   prefix_cache_bytes=prefix_cache_bytes, speculative=speculative, scheduler=scheduler)

    # -- text ---------------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def chat_prompt(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        if self.chat_template is None:
            return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        try:
            return self.tokenizer.apply_chat_template(arguments_as_objects(list(messages)), template=self.chat_template,
                                                      tools=tools)
        except ChatTemplateError as err:
            raise PromptError(str(err)) from None

    def tool_format(self) -> str | None:
        if self.chat_template is None or not self.chat_template.uses("tools"):
            return None
        return tool_format(self.chat_template.source)

    # -- generation ---------------------------------------------------------------------------------
    def generate(self, prompt_ids: Sequence[int], params: SamplingParams,
                 cancelled: Callable[[], bool]) -> Iterator[int | TokenLogprob | None]:
        return self.generate_choices(prompt_ids, params, cancelled, 1)[0]

    def generate_choices(self, prompt_ids: Sequence[int], params: SamplingParams, cancelled: Callable[[], bool],
                         n: int) -> list[Iterator[int | TokenLogprob | None]]:
        """``n`` generators of one prompt: it is read once into a lane, then forked into ``n`` lanes (choice
        ``i`` samples with ``seed + i`` when a seed is given)."""
        ids = list(prompt_ids)
        batch = next((b for b in self._batches if b.lanes - b.active >= n), None)
        if batch is None:
            raise PromptError(f"n={n}: no {n} free sequences" + (" (the turns scheduler runs one choice per "
                                                                   "request)" if self.scheduler == "turns" else ""))
        root = batch.join(ids, new_tokens=params.max_tokens)
        joined = batch.steps
        forks: list[int] = []

        def lane(i: int) -> int:
            if not forks:  # the prompt is read: every choice starts from its cache and logits
                forks.extend([root, *(batch.fork(root) for _ in range(n - 1))])
            return forks[i]

        return [self._choice(batch, root, lane, i, ids, params, cancelled, joined) for i in range(n)]

    def _choice(self, batch: Batch, root: int, lane: Callable[[int], int], index: int, ids: list[int],
                params: SamplingParams, cancelled: Callable[[], bool],
                seen: int) -> Iterator[int | TokenLogprob | None]:
        """Choice ``index``: each new token (a :class:`TokenLogprob` when ``params.logprobs`` is set), None for
        a round in which its prompt is still being read. Prompts are read one prefill chunk per step, oldest
        first (or, when whole prompts wait together, as many as fit one packed chunk in one pass), in the step the
        decoding lanes run (``Batch.advance``), so a round (every generator stepped once) holds one chunk,
        however many prompts wait: no decoding lane's token waits for more than one
        chunk. Choice 0 runs a step itself only when none ran since its last turn (``seen``: the batch's
        step count then), i.e. when no lane decodes."""
        sequence = None
        try:
            while not batch.ready(root):
                if index == 0 and batch.steps == seen:
                    batch.advance()
                if not batch.ready(root):
                    seen = batch.steps
                    yield None
            sequence = lane(index)
            seed = None if params.seed is None else params.seed + index
            yield from self._steps(batch, sequence, ids, params, np.random.default_rng(seed), cancelled)
        finally:
            if sequence is not None:
                batch.leave(sequence)
            elif index == 0:
                batch.leave(root)

    def _steps(self, batch: Batch, sequence: int, ids: list[int], params: SamplingParams, rng: np.random.Generator,
               cancelled: Callable[[], bool]) -> Iterator[int | TokenLogprob]:
        guide = None if params.grammar is None else GrammarProcessor(params.grammar, self.tokenizer)
        process = LogitsProcessor(params, ids, self.vocab_size, guide)
        settings = self.speculative if params.speculative is None else \
            (self.speculative or Speculation()) if params.speculative else None
        speculator = None if settings is None else Speculator(LaneTarget(batch, sequence), settings, ids)
        pending = lambda: batch.logits(sequence)  # noqa: E731 -- the first decoding lane of a round runs the step
        for produced in range(params.max_tokens):
            logits = pending()
            token = next_token(process(logits), params.temperature, params.top_k, params.top_p, rng, params.min_p)
            process.record(token)
            done = token in params.stop_token_ids or produced + 1 == params.max_tokens
            if not (done or len(ids) + produced >= self.context_length):
                # before yielding: the next step appends it with the other lanes' (or checks its drafts)
                pending = speculator.advance(token, params.max_tokens - produced - 2) if speculator else \
                    _feed(batch, sequence, token)
            else:
                done = True
            yield token if params.logprobs is None else TokenLogprob.of(token, logits, params.logprobs)
            if done or cancelled():
                return


def _feed(batch: Batch, sequence: int, token: int) -> Callable[[], np.ndarray]:
    batch.feed(sequence, token)
    return lambda: batch.logits(sequence)
