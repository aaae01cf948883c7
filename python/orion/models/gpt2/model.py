"""GPT-2 on Orion: prefill, KV-cache decode, full-sequence logits and generation.

Every transformer layer runs in compiled programs (see ``plan.py``); the CPU only embeds tokens,
stores each new key/value in the persistent KV-cache surfaces, and samples.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from typing import Iterable, Iterator

import numpy as np

from orion.runtime.backend import backend
from orion.errors import OrionError
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.graphs import MASKED
from orion.models.gpt2.plan import (Compiler, DecodePlan, PlanOptions, PrefillPlan, build_decode_plan,
                                    build_prefill_plan, packed_view)
from orion.models.gpt2.sampling import check_sampling, next_token
from orion.models.gpt2.tokenizer import Tokenizer, TokenizerNotFound, load_tokenizer
from orion.models.gpt2.weights import GPT2Weights, load_hf, random_weights
from orion.limits import MIN_LANES, MIN_SURFACE_BYTES
from orion.passes.io_padding import padded_shape
from orion.runtime.surface import Surface


class ContextFull(OrionError):
    """The sequence would exceed the model's context length (n_positions)."""


class KVCache:
    """Every layer's keys and values in persistent surfaces that the decode programs bind as inputs,
    the additive attention mask, and how many positions are filled."""

    def __init__(self, config: GPT2Config, io_dtype: str) -> None:
        c, t = config.n_embd, config.n_positions
        self.shape = (1, c, 1, t)
        cache_shape = padded_shape(self.shape, io_dtype, "the KV cache")
        mask_shape = padded_shape((1, 1, 1, t), io_dtype, "the attention mask")
        elem = 2 if io_dtype == "fp16" else 4
        nbytes = max(MIN_SURFACE_BYTES, int(np.prod(cache_shape)) * elem, int(np.prod(mask_shape)) * elem)
        self.surfaces = {"mask": Surface(mask_shape, io_dtype, nbytes)}
        for i in range(config.n_layer):
            for kind in "kv":
                self.surfaces[f"{kind}{i}"] = Surface(cache_shape, io_dtype, nbytes)
        self.keys = [packed_view(self.surfaces[f"k{i}"], self.shape)[0, :, 0, :] for i in range(config.n_layer)]
        self.values = [packed_view(self.surfaces[f"v{i}"], self.shape)[0, :, 0, :] for i in range(config.n_layer)]
        self.mask = packed_view(self.surfaces["mask"], (1, 1, 1, t))[0, 0, 0, :]
        # The live-lanes hint needs the cache's positions on the lane axis (true unless it was flattened).
        self.lane_hints = cache_shape == self.shape
        self.length = 0
        self.clear()

    def clear(self) -> None:
        """Forget every position."""
        self.mask[:] = MASKED
        self.length = 0

    def copy_from(self, other: KVCache) -> None:
        for mine, theirs in zip(self.keys + self.values, other.keys + other.values):
            mine[:, : other.length] = theirs[:, : other.length]
        self.mask[:] = other.mask
        self.length = other.length


class GPT2:
    """A GPT-2 model compiled for the ANE (or the emulator).

    ``prefill(ids)`` fills the KV cache and returns the last position's logits; ``decode_step(id)``
    appends one token; ``logits(ids)`` gives every position's logits; ``generate(...)`` yields new
    token ids. All logits are float32 numpy arrays.
    """

    def __init__(self, config: GPT2Config, weights: GPT2Weights, *, tokenizer: Tokenizer | None = None,
                 tokenizer_error: TokenizerNotFound | None = None, fusion_depth: int | None = None,
                 lm_head: str = "ane", progress: bool = True) -> None:
        weights.validate(config)
        self.config, self.weights = config, weights
        self._tokenizer, self._tokenizer_error = tokenizer, tokenizer_error
        self.options = PlanOptions(fusion_depth=fusion_depth, lm_head=lm_head)
        if progress:
            print(f"compiling GPT-2 ({config.param_count() / 1e6:.0f}M parameters, {config.n_layer} layers) "
                  f"for {backend()}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        self._compiler = Compiler(config, weights, weights.content_hash(config), self.options.io_dtype, progress)
        self.decode_plan: DecodePlan = build_decode_plan(self._compiler, self.options)
        self.compile_seconds = time.perf_counter() - start
        self._prefill_plans: dict[tuple[int, bool], PrefillPlan] = {}
        self.cache = KVCache(config, self.options.io_dtype)
        self._layers, self._heads = self.decode_plan.bind(self.cache.surfaces)
        self._wte_t = None  # [C, V] float32 for the CPU LM head, made on first use

    # -- construction ---------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], **options: object) -> GPT2:
        """Load a Hugging Face GPT-2 directory (``config.json``, ``model.safetensors``, optionally
        ``tokenizer.json``)."""
        config, weights = load_hf(path)
        try:
            tokenizer, error = load_tokenizer(path), None
        except TokenizerNotFound as missing:
            tokenizer, error = None, missing
        return cls(config, weights, tokenizer=tokenizer, tokenizer_error=error, **options)

    @classmethod
    def random(cls, config: GPT2Config | None = None, seed: int = 0, **options: object) -> GPT2:
        """Deterministic random weights of ``config`` (default: the 124M shape); no tokenizer."""
        config = config or GPT2Config()
        error = TokenizerNotFound("a model with random weights has no tokenizer: pass token ids, or load a "
                                  "directory with a tokenizer.json via GPT2.from_pretrained")
        return cls(config, random_weights(config, seed), tokenizer_error=error, **options)

    def fork(self) -> GPT2:
        """A model sharing this one's compiled programs with its own copy of the KV cache."""
        twin = copy.copy(self)
        twin.cache = KVCache(self.config, self.options.io_dtype)
        twin.cache.copy_from(self.cache)
        twin._layers, twin._heads = self.decode_plan.bind(twin.cache.surfaces)
        return twin

    def reset(self) -> None:
        """Empty the KV cache."""
        self.cache.clear()

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            raise self._tokenizer_error or TokenizerNotFound("this model has no tokenizer")
        return self._tokenizer

    # -- inference ------------------------------------------------------------------------------------
    def prefill(self, ids: Iterable[int]) -> np.ndarray:
        """Reset the cache, run the prompt ``ids`` through every layer, and return the last
        position's logits ``[vocab]``."""
        ids = self._check_ids(ids)
        self.reset()
        plan = self._prefill_plan(len(ids), with_head=False)
        x = self._run_prefill(plan, ids)
        return self._head_logits(x[:, len(ids) - 1])

    def decode_step(self, token: int) -> np.ndarray:
        """Append one token at the next position and return its logits ``[vocab]``."""
        pos = self.cache.length
        if pos == 0:
            raise OrionError("decode_step needs a prefilled cache: call prefill(ids) first")
        if pos >= self.config.n_positions:
            raise ContextFull(f"the KV cache holds {pos} tokens, the context length (n_positions) is "
                              f"{self.config.n_positions}: reset() or start a new prompt")
        self._check_ids([token])
        x = self._layers[0].input("x")
        x[0, :, 0, 0] = self.weights.wte[token] + self.weights.wpe[pos]
        for stage, layers in zip(self._layers, self.decode_plan.layer_ranges):
            # Positions >= pos of the caches and the mask are dead lanes: the emulator skips them.
            live = {name: pos for i in layers for name in (f"k{i}", f"v{i}")} if self.cache.lane_hints else {}
            stage.run(live | {"mask": pos} if live else None)
            for i in layers:
                self.cache.keys[i][:, pos] = stage.output(f"k{i}")[0, :, 0, 0]
                self.cache.values[i][:, pos] = stage.output(f"v{i}")[0, :, 0, 0]
        self.cache.mask[pos] = 0.0
        self.cache.length = pos + 1
        return self._head_logits(None)

    def logits(self, ids: Iterable[int]) -> np.ndarray:
        """Logits ``[len(ids), vocab]`` of every position (fills the cache like ``prefill``)."""
        ids = self._check_ids(ids)
        self.reset()
        plan = self._prefill_plan(len(ids), with_head=self.options.lm_head == "ane")
        x = self._run_prefill(plan, ids)
        n = len(ids)
        if self.options.lm_head == "cpu":
            return np.stack([self._cpu_logits(x[:, i]) for i in range(n)])
        for head in plan.head_stages:
            head.run()
        return np.concatenate([h.output("logits")[0, :, 0, :n] for h in plan.head_stages]).T.astype(np.float32)

    def generate(self, ids: Iterable[int], max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None,
                 stop: int | Iterable[int] | None = None) -> Iterator[int]:
        """Yield up to ``max_new_tokens`` new token ids after the prompt ``ids``: greedy when
        ``temperature == 0``, else sampled (``top_k``/``top_p`` truncation, ``seed`` for
        reproducibility). Stops after yielding a token in ``stop`` or when the context is full."""
        check_sampling(temperature, top_k, top_p)
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={max_new_tokens}: use a non-negative number")
        stops = {stop} if isinstance(stop, int) else set(stop or ())
        rng = np.random.default_rng(seed)
        logits = self.prefill(ids)
        for produced in range(max_new_tokens):
            token = next_token(logits, temperature, top_k, top_p, rng)
            yield token
            if token in stops or produced + 1 == max_new_tokens or self.cache.length >= self.config.n_positions:
                return
            logits = self.decode_step(token)

    def generate_text(self, prompt: str, max_new_tokens: int, **sampling: object) -> Iterator[str]:
        """Like ``generate`` on text: yields the decoded text of each new token."""
        tokenizer = self.tokenizer
        ids = tokenizer.encode(prompt)
        stop = sampling.pop("stop", tokenizer.eos_token_id)
        for token in self.generate(ids, max_new_tokens, stop=stop, **sampling):
            yield tokenizer.decode([token])

    # -- internals ------------------------------------------------------------------------------------
    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("give at least one token id")
        if len(ids) > self.config.n_positions:
            raise ContextFull(f"{len(ids)} tokens exceed the context length (n_positions) {self.config.n_positions}")
        bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.config.vocab_size})")
        return ids

    def _prefill_plan(self, n: int, with_head: bool) -> PrefillPlan:
        seq = max(MIN_LANES[self.options.io_dtype], 1 << (n - 1).bit_length())  # a power of two (ANE-08)
        key = (seq, with_head)
        if key not in self._prefill_plans:
            self._prefill_plans[key] = build_prefill_plan(self._compiler, self.decode_plan.fusion_depth, seq, with_head)
        return self._prefill_plans[key]

    def _run_prefill(self, plan: PrefillPlan, ids: list[int]) -> np.ndarray:
        """Runs the layers over the prompt, stores keys/values in the cache; returns x ``[C, seq]``."""
        n = len(ids)
        x = plan.layer_stages[0].input("x")
        x[...] = 0.0
        x[0, :, 0, :n] = (self.weights.wte[ids] + self.weights.wpe[:n]).T
        for stage, layers in zip(plan.layer_stages, plan.layer_ranges):
            stage.run()
            for i in layers:
                self.cache.keys[i][:, :n] = stage.output(f"k{i}")[0, :, 0, :n]
                self.cache.values[i][:, :n] = stage.output(f"v{i}")[0, :, 0, :n]
        self.cache.mask[:n] = 0.0
        self.cache.length = n
        return plan.layer_stages[-1].output("x")[0, :, 0, :]

    def _head_logits(self, x: np.ndarray | None) -> np.ndarray:
        """Logits of one position: ``x`` [C] (None: the decode chain's last output)."""
        if self.options.lm_head == "cpu":
            return self._cpu_logits(self._layers[-1].output("x")[0, :, 0, 0] if x is None else x)
        if x is not None:
            self._heads[0].input("x")[0, :, 0, 0] = x
        for head in self._heads:
            head.run()
        return np.concatenate([h.output("logits")[0, :, 0, 0] for h in self._heads]).astype(np.float32)

    def _cpu_logits(self, x: np.ndarray) -> np.ndarray:
        """Final LayerNorm and tied LM head in numpy float32 (the ``lm_head="cpu"`` placement)."""
        v = x.astype(np.float32)
        h = (v - v.mean()) / np.sqrt(v.var() + self.config.layer_norm_epsilon)
        h = h * self.weights.ln_f_g + self.weights.ln_f_b
        return self.weights.wte @ h
