"""The generation loop of a decoder-only model: prefill, KV-cache decode, full-sequence logits,
generation and forks, written once for every model.

A model subclasses :class:`CausalLM`, sets ``self.dims`` and calls ``_setup(...)`` from its
``__init__``, and implements the hooks (its graphs, embedding and cost formulas). Every
transformer layer runs in compiled programs; the CPU only embeds tokens, stores each new key and
value in the persistent KV-cache surfaces, and samples.

Threads: one model object (or fork) runs in one thread at a time; a second thread calling into it
while it runs gets :class:`ConcurrentUse`. Forks share compiled programs but own their cache and
surfaces, so different forks may run in different threads at once.
"""

from __future__ import annotations

import copy
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from orion.errors import OrionError
from orion.generation.kv_cache import KVCache
from orion.generation.plan import (
    DecodePlan,
    PlanOptions,
    PrefillPlan,
    ProgramInfo,
    build_decode_plan,
    build_prefill_plan,
    sram_fusion_depth,
    vocab_chunks,
)
from orion.generation.sampling import check_sampling, next_token
from orion.generation.tokenizer import Tokenizer, TokenizerNotFound
from orion.graph import Graph
from orion.limits import MIN_LANES
from orion.lora.hot_swap import AdapterHost
from orion.runtime.backend import backend
from orion.runtime.builder import ProgramBuilder
from orion.runtime.stage import Stage


class GenerationError(OrionError, ValueError):
    """Token ids or generation settings that cannot be used."""


class ContextFull(OrionError):
    """The sequence would exceed the model's context length."""


class NonFiniteLogits(OrionError):
    """The model produced NaN logits, so no token can be chosen."""


class ConcurrentUse(OrionError):
    """A model object was called from a second thread while it was running."""


@dataclass(frozen=True)
class DecoderDims:
    """The sizes the runtime needs: layers, hidden width, KV heads x head width, context, vocabulary."""

    n_layer: int
    hidden: int
    kv_heads: int
    head_dim: int
    context: int
    vocab_size: int
    parameters: int


class CausalLM(AdapterHost):
    """A decoder-only language model compiled for the ANE (or the emulator).

    ``prefill(ids)`` fills the KV cache and returns the last position's logits; ``decode_step(id)``
    appends one token; ``logits(ids)`` gives every position's logits; ``generate(...)`` yields new
    token ids and ``generate_text(...)`` text. All logits are float32 numpy arrays ``[vocab]``.

    Hooks a model implements: ``model_type`` (its ``config.json`` name) and ``display_name`` (class
    attributes), ``program_identity()``, ``decode_graph(layers)``, ``prefill_graph(layers, seq)``,
    ``lm_head_graph(vocab, seq)``, ``embed(ids, start)``, ``cpu_logits(x)``, ``layer_weight_bytes()``
    and ``program_costs(layer_ranges, head_ranges, lm_head)``; optionally ``position_inputs(positions)``.
    The layer graph hooks take ``adapters`` (LoRA site ranks, None: the base graph) and ``lora_placements()``
    says where each adaptable module lands (``orion.lora.hot_swap`` for adapters and the KV-cache policy).
    """

    model_type: ClassVar[str]
    display_name: ClassVar[str]
    dims: DecoderDims

    # -- hooks ----------------------------------------------------------------------------------------
    def program_identity(self) -> dict[str, Any]:
        """JSON-able identity of the model (type, config, weights hash) for the program-cache key."""
        raise NotImplementedError

    def decode_graph(self, layers: range, adapters: Mapping[str, int] | None = None) -> Graph:
        """Layers ``layers`` for one token. Inputs ``x`` [1, hidden, 1, 1], ``mask`` [1, 1, 1, context],
        ``k<i>``/``v<i>`` [1, kv_heads * head_dim, 1, context]; outputs ``x`` and each layer's new
        ``k<i>``/``v<i>`` [1, kv_heads * head_dim, 1, 1]."""
        raise NotImplementedError

    def prefill_graph(self, layers: range, seq: int, adapters: Mapping[str, int] | None = None) -> Graph:
        """Layers ``layers`` over ``seq`` tokens with causal attention: input ``x`` [1, hidden, 1, seq];
        outputs ``x`` and each layer's ``k<i>``/``v<i>`` [1, kv_heads * head_dim, 1, seq]."""
        raise NotImplementedError

    def lm_head_graph(self, vocab: range, seq: int) -> Graph:
        """Final norm and LM head for token ids ``vocab``: ``x`` -> ``logits`` [1, len(vocab), 1, seq]."""
        raise NotImplementedError

    def embed(self, ids: list[int], start: int) -> np.ndarray:
        """The residual stream entering layer 0 for ``ids`` at positions ``start...``: float32 [n, hidden]."""
        raise NotImplementedError

    def cpu_logits(self, x: np.ndarray) -> np.ndarray:
        """Final norm and LM head on the CPU (``lm_head="cpu"``): float32 [hidden] -> [vocab]."""
        raise NotImplementedError

    def layer_weight_bytes(self) -> int:
        """fp16 bytes of one layer's weights (sizes the default fusion depth)."""
        raise NotImplementedError

    def program_costs(self, layer_ranges: list[range], head_ranges: list[range], lm_head: str) -> list[ProgramInfo]:
        """FLOPs and bytes moved per token of each decode program."""
        raise NotImplementedError

    def position_inputs(self, positions: range) -> dict[str, np.ndarray]:
        """Extra per-position layer inputs (e.g. rotary tables): name -> float32 ``[channels, len(positions)]``,
        written into the first lanes of that input of every layer program declaring it. None by default."""
        return {}

    # -- construction ---------------------------------------------------------------------------------
    def _setup(self, *, tokenizer: Tokenizer | None, tokenizer_error: TokenizerNotFound | None,
               fusion_depth: int | None, lm_head: str, progress: bool) -> None:
        """Compiles the decode plan and binds it to a new KV cache (call at the end of ``__init__``)."""
        d = self.dims
        self._tokenizer, self._tokenizer_error = tokenizer, tokenizer_error
        self.options = PlanOptions(fusion_depth=fusion_depth, lm_head=lm_head)
        if progress:
            print(f"compiling {self.display_name} ({d.parameters / 1e6:.0f}M parameters, {d.n_layer} layers) "
                  f"for {backend()}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        self.builder = ProgramBuilder(self.program_identity(), self.options.io_dtype, progress)
        self._head_ranges = vocab_chunks(d.vocab_size, d.hidden)
        self.decode_plan: DecodePlan = build_decode_plan(
            self.builder, self.options, d.n_layer, sram_fusion_depth(d.n_layer, self.layer_weight_bytes()),
            self._head_ranges, self.decode_graph, self.lm_head_graph, self.program_costs)
        self.compile_seconds = time.perf_counter() - start
        self._prefill_plans: dict[tuple[int, bool], PrefillPlan] = {}  # shared by forks
        self._compile_lock = threading.Lock()  # shared by forks: one compiles a new prefill bucket at a time
        self._bind_cache()

    def _bind_cache(self) -> None:
        """A new KV cache and the surfaces of this object alone (a fork calls it too)."""
        d = self.dims
        self.cache = KVCache(d.n_layer, d.kv_heads, d.head_dim, d.context, self.options.io_dtype,
                             self._adapter_surface_bytes())
        self._layers, self._heads = self.decode_plan.bind(self.cache.surfaces)
        self._prefill_stages: dict[tuple[int, bool], tuple[list[Stage], list[Stage]]] = {}
        self._forget_bound_variants()
        self._write_adapter_inputs([self._layers])
        self._busy = threading.Lock()

    def fork(self) -> CausalLM:
        """A model sharing this one's compiled programs with its own copy of the KV cache (and its
        own surfaces, so the two may run in different threads)."""
        with self._exclusive("fork"):
            twin = copy.copy(self)
            twin._bind_cache()
            twin.cache.copy_from(self.cache)
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
        with self._exclusive("prefill"):
            x = self._run_prefill(self._prefill_bucket(len(ids), with_head=False)[0], ids)
            return self._head_logits(x[:, len(ids) - 1])

    def decode_step(self, token: int) -> np.ndarray:
        """Append one token at the next position and return its logits ``[vocab]``."""
        with self._exclusive("decode_step"):
            cache = self.cache
            pos = cache.length
            if pos == 0:
                raise OrionError("decode_step needs a prefilled cache: call prefill(ids) first")
            if pos >= cache.context:
                raise ContextFull(f"the KV cache holds {pos} tokens, the context length is {cache.context}: "
                                  f"reset() or start a new prompt")
            self._check_ids([token])
            self._layers[0].input("x")[0, :, 0, 0] = self.embed([token], pos)[0]
            extra = self.position_inputs(range(pos, pos + 1))
            if extra:
                _write_lanes(self._layers, extra)
            for stage, layers in zip(self._layers, self.decode_plan.layer_ranges):
                # Positions >= pos of the caches and the mask are dead lanes: the emulator skips them.
                live = {name: pos for i in layers for name in (f"k{i}", f"v{i}")} if cache.lane_hints else {}
                stage.run(live | {"mask": pos} if live else None)
                for i in layers:
                    cache.keys[i][:, pos] = stage.output(f"k{i}")[0, :, 0, 0]
                    cache.values[i][:, pos] = stage.output(f"v{i}")[0, :, 0, 0]
            cache.mask[pos] = 0.0
            cache.length = pos + 1
            return self._head_logits(None)

    def logits(self, ids: Iterable[int]) -> np.ndarray:
        """Logits ``[len(ids), vocab]`` of every position (fills the cache like ``prefill``)."""
        ids = self._check_ids(ids)
        n = len(ids)
        with self._exclusive("logits"):
            layers, heads = self._prefill_bucket(n, with_head=self.options.lm_head == "ane")
            x = self._run_prefill(layers, ids)
            if self.options.lm_head == "cpu":
                return np.stack([self.cpu_logits(x[:, i]) for i in range(n)])
            for head in heads:
                head.run()
            return np.concatenate([h.output("logits")[0, :, 0, :n] for h in heads]).T.astype(np.float32)

    def generate(self, ids: Iterable[int], max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None,
                 stop: int | Iterable[int] | None = None) -> Iterator[int]:
        """Yield up to ``max_new_tokens`` new token ids after the prompt ``ids``: greedy when
        ``temperature == 0``, else sampled (``top_k``/``top_p`` truncation, ``seed`` for
        reproducibility). Stops after yielding a token in ``stop`` or when the context is full."""
        check_sampling(temperature, top_k, top_p)
        if max_new_tokens < 0:
            raise GenerationError(f"max_new_tokens={max_new_tokens}: use a non-negative number")
        stops = {stop} if isinstance(stop, int) else set(stop or ())
        rng = np.random.default_rng(seed)
        logits = self.prefill(ids)
        for produced in range(max_new_tokens):
            if np.isnan(logits).any():
                raise NonFiniteLogits(
                    f"generate: the logits of new token {produced} (position {self.cache.length}) contain NaN, "
                    f"so no token can be chosen; the model overflowed fp16 or its weights are not finite: "
                    f"check the weights (or compare with lm_head='cpu')")
            token = next_token(logits, temperature, top_k, top_p, rng)
            yield token
            if token in stops or produced + 1 == max_new_tokens or self.cache.length >= self.cache.context:
                return
            logits = self.decode_step(token)

    def generate_text(self, prompt: str, max_new_tokens: int, **sampling: Any) -> Iterator[str]:
        """Like ``generate`` on text: yields the decoded text of each new token; stops at the
        model's end-of-sequence tokens unless ``stop`` is given."""
        tokenizer = self.tokenizer
        ids = tokenizer.encode(prompt)
        stop = sampling.pop("stop", tokenizer.eos_token_ids)
        for token in self.generate(ids, max_new_tokens, stop=stop, **sampling):
            yield tokenizer.decode([token])

    # -- internals ------------------------------------------------------------------------------------
    def _exclusive(self, what: str) -> _Exclusive:
        return _Exclusive(self, what)

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        ids = [int(i) for i in ids]
        d = self.dims
        if not ids:
            raise GenerationError("give at least one token id")
        if len(ids) > d.context:
            raise ContextFull(f"{len(ids)} tokens exceed the context length {d.context}")
        bad = [i for i in ids if not 0 <= i < d.vocab_size]
        if bad:
            raise GenerationError(f"token ids {bad[:5]} are outside the vocabulary [0, {d.vocab_size})")
        return ids

    def _prefill_bucket(self, n: int, with_head: bool) -> tuple[list[Stage], list[Stage]]:
        """The prefill stages for ``n`` tokens: programs compiled once per bucket, surfaces per fork."""
        seq = max(MIN_LANES[self.options.io_dtype], 1 << (n - 1).bit_length())  # a power of two (ANE-08)
        key = (seq, with_head)
        if key not in self._prefill_stages:
            with self._compile_lock:
                if key not in self._prefill_plans:
                    self._prefill_plans[key] = build_prefill_plan(
                        self.builder, self.dims.n_layer, self.decode_plan.fusion_depth, seq,
                        self._head_ranges if with_head else [],
                        self._variant_prefill_graph, self.lm_head_graph)
            self._prefill_stages[key] = self._prefill_plans[key].bind(self.options.io_dtype)
            self._write_adapter_inputs(self._prefill_stages[key][:1])
        return self._prefill_stages[key]

    def _run_prefill(self, stages: list[Stage], ids: list[int]) -> np.ndarray:
        """Runs the layers over the prompt and stores its keys/values in the (reset) cache; returns
        x ``[hidden, seq]``."""
        n, cache = len(ids), self.cache
        cache.clear()
        x = stages[0].input("x")
        x[...] = 0.0
        x[0, :, 0, :n] = self.embed(ids, 0).T
        extra = self.position_inputs(range(n))
        if extra:
            _write_lanes(stages, extra)
        for stage, layers in zip(stages, self.decode_plan.layer_ranges):
            stage.run()
            for i in layers:
                cache.keys[i][:, :n] = stage.output(f"k{i}")[0, :, 0, :n]
                cache.values[i][:, :n] = stage.output(f"v{i}")[0, :, 0, :n]
        cache.mask[:n] = 0.0
        cache.length = n
        return stages[-1].output("x")[0, :, 0, :]

    def _head_logits(self, x: np.ndarray | None) -> np.ndarray:
        """Logits of one position: ``x`` [hidden] (None: the decode chain's last output)."""
        if self.options.lm_head == "cpu":
            return self.cpu_logits(self._layers[-1].output("x")[0, :, 0, 0] if x is None else x)
        if x is not None:
            self._heads[0].input("x")[0, :, 0, 0] = x
        for head in self._heads:
            head.run()
        return np.concatenate([h.output("logits")[0, :, 0, 0] for h in self._heads]).astype(np.float32)


def _write_lanes(stages: list[Stage], values: dict[str, np.ndarray]) -> None:
    """``values[name]`` ([channels, n]) into the first n lanes of input ``name`` of each stage that has it."""
    for stage in stages:
        for name, value in values.items():
            if name in stage.mil_name:
                stage.input(name)[0, :, 0, : value.shape[1]] = value


class _Exclusive:
    """Holds a model's busy lock for one call; a call from another thread meanwhile raises."""

    __slots__ = ("model", "what")

    def __init__(self, model: CausalLM, what: str) -> None:
        self.model, self.what = model, what

    def __enter__(self) -> None:
        if not self.model._busy.acquire(blocking=False):
            raise ConcurrentUse(f"{type(self.model).__name__}.{self.what}: this model is running in another "
                                f"thread; give each thread its own fork() (forks share the compiled programs)")

    def __exit__(self, *exc: object) -> None:
        self.model._busy.release()
