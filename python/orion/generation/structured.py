"""Structured output: generation held to a JSON Schema, any JSON object, or a Lark grammar, by masking each
step's logits to the tokens that keep the text inside the grammar.

The grammar engine is llguidance (the ``serve`` extra): the Rust library behind the structured output of
vLLM, SGLang and llama.cpp. It reads the model's own ``tokenizer.json``, computes each step's mask
lazily from the parser state (no per-schema index to build first, so a new schema costs no start-up), and
has no Python dependencies. Orion only applies its masks; it implements no grammar itself.

:class:`Grammar` is a checked grammar; :class:`GrammarProcessor` is a logits processor for
``generate``/``generate_text`` (``logits_processor=GrammarProcessor(grammar, model.tokenizer)``) that the
server uses too. JSON is compact (no whitespace between tokens), so a model cannot stall in whitespace.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from orion.errors import OrionError
from orion.generation.tokenizer import Tokenizer

# Compact JSON: no whitespace between tokens (the separators are "," and ":").
JSON_OPTIONS = {"whitespace_flexible": False}


class StructuredOutputError(OrionError, ValueError):
    """A schema or grammar that cannot be used, or a tokenizer the grammar engine cannot read."""


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as exc:
        raise StructuredOutputError(f"structured output needs llguidance: pip install 'orion-ane[serve]' "
                                    f"(or pip install llguidance) ({exc})") from None
    return llguidance


@dataclass(frozen=True)
class Grammar:
    """A grammar in llguidance's format, checked when made; ``what`` describes it in messages."""

    source: str
    what: str

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool) -> Grammar:
        """Text that is one JSON value valid against ``schema`` (a JSON Schema object)."""
        if not isinstance(schema, (dict, bool)):
            raise StructuredOutputError(f"a JSON schema is an object, got {type(schema).__name__}")
        lg = _llguidance()
        try:
            source = lg.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OPTIONS)
        except (ValueError, TypeError, RecursionError) as exc:
            raise StructuredOutputError(f"the JSON schema cannot be used: {exc}") from None
        return cls._checked(source, "the JSON schema")

    @classmethod
    def json_object(cls) -> Grammar:
        """Text that is one JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
        return cls.json_schema({"type": "object"})

    @classmethod
    def lark(cls, text: str, what: str = "the grammar") -> Grammar:
        """A Lark grammar in llguidance's dialect (``%json {...}`` embeds a JSON Schema)."""
        return cls._checked(_llguidance().LLMatcher.grammar_from_lark(text), what)

    @classmethod
    def _checked(cls, source: str, what: str) -> Grammar:
        error = _llguidance().LLMatcher.validate_grammar(source)
        if error:
            raise StructuredOutputError(f"{what} cannot be used: {error}")
        return cls(source, what)


_GUIDANCE_TOKENIZERS: weakref.WeakKeyDictionary[Tokenizer, Any] = weakref.WeakKeyDictionary()


def guidance_tokenizer(tokenizer: Tokenizer) -> Any:
    """llguidance's view of ``tokenizer`` (its ``tokenizer.json`` and end-of-sequence ids), built once per
    tokenizer (a second or so for a large vocabulary)."""
    if tokenizer not in _GUIDANCE_TOKENIZERS:
        if not tokenizer.eos_token_ids:
            raise StructuredOutputError(f"{tokenizer.path}: the model names no end-of-sequence token, so a "
                                        f"constrained generation could not end; set eos_token_id in config.json")
        lg = _llguidance()
        try:
            _GUIDANCE_TOKENIZERS[tokenizer] = lg.LLTokenizer(tokenizer.to_json(), eos_token=list(tokenizer.eos_token_ids))
        except (ValueError, RuntimeError) as exc:
            raise StructuredOutputError(f"{tokenizer.path}: llguidance cannot read this tokenizer: {exc}") from None
    return _GUIDANCE_TOKENIZERS[tokenizer]


class GrammarProcessor:
    """A logits processor (``f(ids so far, logits) -> logits``) that allows only the tokens keeping the
    new text inside ``grammar``; once the grammar is complete only the end-of-sequence tokens remain.

    Each call first feeds the tokens added to ``ids`` since the previous call (the first call takes
    ``ids`` as the prompt). One processor serves one generation."""

    def __init__(self, grammar: Grammar, tokenizer: Tokenizer) -> None:
        lg = _llguidance()
        self.grammar = grammar
        self._tokenizer = guidance_tokenizer(tokenizer)
        self._matcher = lg.LLMatcher(self._tokenizer, grammar.source, log_level=0)
        self._check()
        self._seen: int | None = None
        self._mask = np.zeros((self._tokenizer.vocab_size + 31) // 32, dtype=np.int32)

    def __call__(self, ids: Sequence[int], logits: np.ndarray) -> np.ndarray:
        if self._seen is not None:
            for token in ids[self._seen:]:
                self.consume(int(token))
        self._seen = len(ids)
        return self.mask(logits)

    def consume(self, token: int) -> None:
        """Advance the grammar by the chosen ``token``."""
        if not self._matcher.consume_token(token):
            self._check()

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with every token the grammar does not allow now at -inf."""
        self._matcher.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        self._check()
        allowed = np.unpackbits(self._mask.view(np.uint8), bitorder="little").astype(bool)
        n = min(allowed.size, logits.size)
        if not allowed[:n].any():
            raise StructuredOutputError(f"{self.grammar.what}: no token of this model's vocabulary can continue "
                                        f"the text here")
        out = np.full_like(logits, -np.inf)
        out[:n] = np.where(allowed[:n], logits[:n], -np.inf)
        return out

    @property
    def accepting(self) -> bool:
        """True when the text so far is complete under the grammar."""
        return self._matcher.is_accepting()

    def _check(self) -> None:
        if self._matcher.is_error():
            raise StructuredOutputError(f"{self.grammar.what}: {self._matcher.get_error()}")
