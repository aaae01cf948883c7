"""The engine protocol for any Orion model (an :class:`orion.generation.loop.CausalLM`).

What it takes from the model runtime: ``orion.models.load(dir, progress=)``, ``dims.context`` and
``dims.vocab_size``, ``tokenizer`` (``encode``/``decode``/``eos_token_id``), ``prefill(ids)`` and
``decode_step(id)`` returning float32 logits, ``fork()`` for each extra concurrent sequence, and
``next_token`` (greedy/temperature/top-k/top-p) from ``orion.generation.sampling``.

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
from orion.generation.chat import ChatTemplate, ChatTemplateError
from orion.generation.loop import CausalLM
from orion.generation.prefix_cache import PrefixCache
from orion.generation.sampling import next_token
from orion.generation.speculative import Speculation, Speculator
from orion.generation.structured import GrammarProcessor
from orion.serve.engine import PromptError, SamplingParams
from orion.serve.logits import LogitsProcessor
from orion.serve.tools import arguments_as_objects, tool_format


class ModelEngine:
    """Serves one model; up to ``max_sequences`` sequences at once, each with its own KV cache."""

    def __init__(self, model: CausalLM, model_id: str, chat_template: ChatTemplate | None = None,
                 max_sequences: int = 4, speculative: Speculation | None = None,
                 prefix_cache_bytes: int = 0) -> None:
        """``chat_template`` overrides the model's own (``model.tokenizer.chat_template``); ``speculative``:
        every request decodes speculatively (``orion.generation.speculative``: the same tokens, fewer
        dispatches); ``prefix_cache_bytes``: keep up to this many bytes of computed prompt prefixes for
        reuse by later prompts that start the same (``orion.generation.prefix_cache``; 0: off)."""
        if max_sequences < 1:
            raise ValueError(f"max_sequences={max_sequences}: use 1 or more")
        self.model = model
        self.tokenizer = model.tokenizer  # raises TokenizerNotFound when the model has none
        self.model_id = model_id
        self.context_length = model.dims.context
        self.vocab_size = model.dims.vocab_size
        self.eos_token_id = self.tokenizer.eos_token_id
        self.max_sequences = max_sequences
        self.speculative = speculative
        if prefix_cache_bytes:
            model.prefix_cache = PrefixCache(prefix_cache_bytes)  # forks share it
        self.chat_template = chat_template or self.tokenizer.chat_template
        self._free: list[CausalLM] = [model]  # sequences (the model and its forks) not generating now
        self._sequences = 1

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str], model_id: str | None = None, progress: bool = True,
                       max_sequences: int = 4, model_options: dict[str, Any] | None = None,
                       speculative: Speculation | None = None, prefix_cache_bytes: int = 0) -> ModelEngine:
        """Load (and compile) the Hugging Face model directory ``path`` (``model_options``: e.g. ``quant``,
        see ``orion.quant.model_options``); the tokenizer is checked first."""
        models.load_tokenizer(path)  # a missing or broken tokenizer fails before the compile
        model = models.load(path, progress=progress, **(model_options or {}))
        return cls(model, model_id or Path(path).resolve().name, max_sequences=max_sequences,
                   speculative=speculative, prefix_cache_bytes=prefix_cache_bytes)

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
                 cancelled: Callable[[], bool]) -> Iterator[int]:
        sequence = self._acquire()
        healthy = False
        try:
            yield from self._steps(sequence, list(prompt_ids), params, cancelled)
            healthy = True
        except GeneratorExit:  # closed early by the caller: the sequence is intact
            healthy = True
            raise
        finally:
            if healthy:
                self._free.append(sequence)
            else:  # a failure mid-step may leave its cache half-written: drop it
                self._sequences -= 1

    def _steps(self, sequence: CausalLM, ids: list[int], params: SamplingParams,
               cancelled: Callable[[], bool]) -> Iterator[int]:
        rng = np.random.default_rng(params.seed)
        guide = None if params.grammar is None else GrammarProcessor(params.grammar, self.tokenizer)
        process = LogitsProcessor(params, ids, self.vocab_size, guide)
        speculator = None if self.speculative is None else Speculator(sequence, self.speculative, ids)
        logits = sequence.prefill(ids)
        try:
            for produced in range(params.max_tokens):
                token = next_token(process(logits), params.temperature, params.top_k, params.top_p, rng, params.min_p)
                process.record(token)
                yield token
                done = token in params.stop_token_ids or produced + 1 == params.max_tokens
                if done or len(ids) + produced >= self.context_length or cancelled():
                    return
                wanted = min(params.max_tokens, self.context_length - len(ids)) - produced - 2
                logits = speculator.next_logits(token, wanted) if speculator else sequence.decode_step(token)
        finally:
            if speculator is not None:
                speculator.close()  # drafts never confirmed leave the cache

    def _acquire(self) -> CausalLM:
        if self._free:
            return self._free.pop()
        if self._sequences >= self.max_sequences:
            raise RuntimeError(f"all {self.max_sequences} sequences are generating: the scheduler must not "
                               f"open more generators than max_sequences")
        self._sequences += 1
        return self.model.fork()
