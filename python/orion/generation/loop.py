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
import inspect
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, ClassVar

import numpy as np

from orion._core import kernels
from orion.errors import OrionError
from orion.generation.defaults import GenerationDefaults
from orion.generation.kv_cache import MASKED, KVCache, context_buckets
from orion.generation.plan import (
    DecodePlan,
    PlanOptions,
    PrefillKey,
    PrefillPlan,
    ProgramInfo,
    ProgramSet,
    build_decode_plan,
    build_prefill_plan,
    rebuild_decode_layers,
    sram_fusion_depth,
    vocab_chunks,
)
from orion.generation.prefix_cache import PrefixCache
from orion.generation.sampling import apply_repetition_penalty, check_sampling, next_token
from orion.generation.speculative import ModelTarget, Speculation, SpeculationStats, Speculator
from orion.generation.streaming import IncrementalDetokenizer, StopStrings
from orion.generation.tokenizer import Tokenizer, TokenizerNotFound
from orion.graph import Graph
from orion.lora.hot_swap import AdapterHost
from orion.ops import PACKED_MASK_INPUT, packed_causal_mask
from orion.quant import weight_bytes
from orion.runtime.backend import backend, compiles_left
from orion.runtime.builder import ProgramBuilder
from orion.runtime.dtypes import numpy_dtype
from orion.runtime.stage import Stage, run_in_turn


class GenerationError(OrionError, ValueError):
    """Token ids or generation settings that cannot be used."""


class ContextFull(OrionError):
    """The sequence would exceed the model's context length."""


class NonFiniteLogits(OrionError):
    """The model produced NaN logits, so no token can be chosen."""


class ActivationOverflow(NonFiniteLogits):
    """A layer's output (the residual stream) left fp16's range: the error names the layers."""


class ConcurrentUse(OrionError):
    """A model object was called from a second thread while it was running."""


class ContextLengthWarning(UserWarning):
    """Generation ended at the context length before ``max_new_tokens``."""


# A prompt: token ids, text, or a chat ([{"role": ..., "content": ...}, ...]) for a model with a tokenizer.
Prompt = Sequence[int] | np.ndarray | str | Sequence[dict[str, Any]]
# Stops: a token id, a string, or a sequence mixing them.
Stop = int | str | Sequence[int | str] | None
# Called on every step with every id so far (prompt and new) and the logits; returns the logits to sample.
LogitsProcessor = Callable[[list[int], np.ndarray], np.ndarray]
DEFAULT_MAX_NEW_TOKENS = 64  # when neither the caller nor generation_config.json says
COMPILE_RESERVE = 2  # sets of layer + LM-head programs ``prepare`` leaves in the compile budget (new prompt lengths)
# Tokens embedded at a time into a prefill's input (``_embed_into``): a 1,000-token prompt's float32 rows (GPT-2:
# token + position tables, 7.3 MiB at once) stay a fraction of its activations.
EMBED_ROWS = 256
FINISH_REASONS = ("stop", "length")


@dataclass
class _Finish:
    reason: str | None = None
    stopped_by: int | str | None = None
    context_full: bool = False
    speculation: SpeculationStats | None = None


class Generation:
    """The iterator ``generate`` (token ids) and ``generate_text`` (text pieces) return.

    Once it is exhausted, ``finish_reason`` says why, as OpenAI and transformers report it:
    ``"stop"`` (an end-of-sequence token, a stop token or a stop string: ``stopped_by`` says which)
    or ``"length"`` (``max_new_tokens`` reached, or the context length: then ``context_full`` is
    True and a :class:`ContextLengthWarning` was issued). ``token_ids`` are the new tokens so far
    and ``text`` their text (with ``generate``, only when stop strings needed decoding)."""

    def __init__(self, finish: _Finish, steps: Iterator[tuple[int, str]], pick: Callable[[int, str], Any]) -> None:
        self._finish, self._steps, self._pick = finish, steps, pick
        self.token_ids: list[int] = []
        self.text = ""

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> Any:
        token, piece = next(self._steps)
        self.token_ids.append(token)
        self.text += piece
        return self._pick(token, piece)

    @property
    def finish_reason(self) -> str | None:
        """``"stop"`` or ``"length"``; None while the generation runs."""
        return self._finish.reason

    @property
    def stopped_by(self) -> int | str | None:
        """The stop token id or stop string that ended a ``"stop"`` finish."""
        return self._finish.stopped_by

    @property
    def context_full(self) -> bool:
        """True when the context length, not ``max_new_tokens``, ended a ``"length"`` finish."""
        return self._finish.context_full

    @property
    def speculation(self) -> SpeculationStats | None:
        """Checks, drafted and accepted tokens of a speculative generation (None without ``speculative``)."""
        return self._finish.speculation


@dataclass
class _Sampling:
    temperature: float
    top_k: int | None
    top_p: float | None
    min_p: float | None
    repetition_penalty: float | None
    processors: list[LogitsProcessor] = field(default_factory=list)

    def process(self, history: list[int], logits: np.ndarray) -> np.ndarray:
        """The repetition penalty, then each logits processor in order."""
        logits = apply_repetition_penalty(logits, history, self.repetition_penalty)
        for processor in self.processors:
            out = processor(list(history), logits.copy())
            if not isinstance(out, np.ndarray) or out.shape != logits.shape:
                raise GenerationError(f"logits_processor {processor!r} returned "
                                      f"{getattr(out, 'shape', type(out).__name__)}; it must return a numpy "
                                      f"array of shape {logits.shape}")
            logits = out
        return logits


class _Sequence:
    """One sequence's choices from each step's logits: the logits processors, the sampler, stop tokens and
    strings, and the text so far. ``choose(logits, position)`` returns the next token and the text safe to
    show, and sets ``finish`` (and ``done``) on the last one; the caller runs the model (one sequence, or a
    lane of a batch)."""

    def __init__(self, ids: list[int], max_new_tokens: int, params: _Sampling, rng: np.random.Generator,
                 stop_ids: set[int], stops: StopStrings, detok: IncrementalDetokenizer | None,
                 mask: Callable[[np.ndarray], np.ndarray], context: int) -> None:
        self.ids, self.max_new_tokens, self.params, self.rng = ids, max_new_tokens, params, rng
        self.stop_ids, self.stops, self.detok, self.mask, self.context = stop_ids, stops, detok, mask, context
        self.history = list(ids)
        self.produced = 0
        self.finish = _Finish(reason="length" if max_new_tokens == 0 else None)

    @property
    def done(self) -> bool:
        return self.finish.reason is not None

    def choose(self, logits: np.ndarray, position: int) -> tuple[int, str]:
        """The token after ``logits`` (of the token at ``position - 1``) and its text safe to show."""
        finish, detok, stops = self.finish, self.detok, self.stops
        if np.isnan(logits).any():
            raise NonFiniteLogits(
                f"generate: the logits of new token {self.produced} (position {position}) contain NaN, "
                f"so no token can be chosen; the model overflowed fp16 or its weights are not finite: "
                f"check the weights (or compare with lm_head='cpu')")
        logits = self.params.process(self.history, self.mask(logits))
        token = next_token(logits, self.params.temperature, self.params.top_k, self.params.top_p, self.rng,
                           self.params.min_p)
        self.history.append(token)
        self.produced += 1
        last = self.produced == self.max_new_tokens
        context_end = position >= self.context
        if token in self.stop_ids:
            finish.reason, finish.stopped_by = "stop", token
            return token, _flush(detok, stops)
        piece = detok.push(token) if detok else ""
        if detok and (last or context_end):
            piece += detok.flush()
        found = stops.feed(piece)
        if found.stopped:
            finish.reason, finish.stopped_by = "stop", found.stop
            return token, found.text
        piece = found.text + (stops.finish() if last or context_end else "")
        if last or context_end:
            finish.reason, finish.context_full = "length", context_end and not last
            if finish.context_full:
                warnings.warn(f"generation stopped after {self.produced} of {self.max_new_tokens} new tokens: the "
                              f"sequence reached the context length {self.context} (finish_reason "
                              f"'length'); use a shorter prompt or fewer new tokens", ContextLengthWarning,
                              stacklevel=4)
        return token, piece


def _processors(given: Any) -> list[LogitsProcessor]:
    processors = [] if given is None else [given] if callable(given) else list(given) \
        if isinstance(given, (list, tuple)) else [given]
    for p in processors:
        if not callable(p):
            raise GenerationError(f"logits_processor {p!r} is not callable: give f(ids, logits) -> logits "
                                  f"or a list of them")
    return processors


def _split_stops(stop: Stop) -> tuple[set[int], list[str]]:
    """``stop`` as token ids and strings (an empty string never matches, so it is refused)."""
    items = [stop] if isinstance(stop, (int, str, np.integer)) else list(stop or ())
    ids, strings = set(), []
    for item in items:
        if isinstance(item, str):
            if not item:
                raise GenerationError("stop: an empty string would stop immediately; remove it")
            strings.append(item)
        else:
            ids.add(_token_id(item, "stop"))
    return ids, strings


def _flush(detok: IncrementalDetokenizer | None, stops: StopStrings) -> str:
    """The text held back when generation ends at a stop token."""
    found = stops.feed(detok.flush() if detok else "")
    return found.text if found.stopped else found.text + stops.finish()


def _token_id(value: Any, what: str) -> int:
    """``value`` as a token id: an integer (numpy integers too), never a float, bool or sequence."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        if isinstance(value, (list, tuple, np.ndarray, str)):
            raise GenerationError(f"{what}: batched prompts are not supported (got a sequence of sequences); "
                                  f"run one prompt at a time (fork() shares the compiled programs)")
        raise GenerationError(f"{what}: token ids are integers, got {value} ({type(value).__name__}); "
                              f"round or cast them explicitly (a float id is never truncated silently)")
    return int(value)


def _token_ids(ids: Any, what: str) -> list[int]:
    if isinstance(ids, np.ndarray) and ids.ndim > 1:
        raise GenerationError(f"{what}: batched prompts are not supported (got an array of shape {ids.shape}); "
                              f"run one prompt at a time (fork() shares the compiled programs)")
    try:
        items = list(ids)
    except TypeError:
        raise GenerationError(f"{what}: expected a sequence of token ids, got {type(ids).__name__}") from None
    if items and all(isinstance(i, str) for i in items):
        raise GenerationError(f"{what}: batched prompts are not supported (got {len(items)} strings); "
                              f"generate from one prompt at a time")
    return [_token_id(i, what) for i in items]


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


def checked_context(name: str, context: int | None, limit: int, limit_field: str, error: type[Exception]) -> int:
    """A model's ``context`` option: the positions its KV cache holds, default the model's ``limit`` (its config's
    ``limit_field``); anything but a whole number in ``1..limit`` raises ``error`` naming ``name``."""
    context = limit if context is None else context
    if isinstance(context, bool) or not isinstance(context, int) or not 0 < context <= limit:
        raise error(f"{name}: context={context!r}; use a positive number of positions up to the model's "
                    f"{limit_field} ({limit})")
    return context


class CausalLM(AdapterHost):
    """A decoder-only language model compiled for the ANE (or the emulator).

    ``prefill(ids)`` fills the KV cache and returns the last position's logits; ``decode_step(id)``
    appends one token; ``logits(ids)`` gives every position's logits; ``generate(...)`` yields new
    token ids and ``generate_text(...)`` text, both as a :class:`Generation` that reports its
    finish reason. All logits are float32 numpy arrays ``[vocab]``. With a tokenizer, prompts may
    be text or a chat (``prompt_ids``); ``generation_defaults`` fill in unset sampling arguments.

    Hooks a model implements: ``model_type`` (its ``config.json`` name) and ``display_name`` (class
    attributes), ``program_identity()``, ``decode_graph(layers)``, ``prefill_graph(layers, seq)``,
    ``lm_head_graph(vocab, seq)``, ``embed(ids, positions)``, ``cpu_logits(x)``, ``layer_weight_bytes()``
    and ``program_costs(layer_ranges, head_ranges, lm_head)``; optionally ``position_inputs(positions)``,
    ``mask_inputs(positions, length)`` and ``packed_mask_inputs(lengths, seq)``.
    The layer graph hooks take ``adapters`` (LoRA site ranks, None: the base graph) and ``lora_placements()``
    says where each adaptable module lands (``orion.lora.hot_swap`` for adapters and the KV-cache policy).
    """

    model_type: ClassVar[str]
    display_name: ClassVar[str]
    dims: DecoderDims
    quant: str = "fp16"  # how the linear weights are stored: "fp16", or "int8" (W8A16, orion.quant)
    # Defaults of generate's sampling arguments: orion.models.load reads them from generation_config.json.
    generation_defaults: GenerationDefaults = GenerationDefaults()
    # Computed prompt prefixes whose KV positions a prefill reuses (None: off); forks share it.
    prefix_cache: PrefixCache | None = None

    # -- hooks ----------------------------------------------------------------------------------------
    def program_identity(self) -> dict[str, Any]:
        """JSON-able identity of the model (type, config, weights hash) for the program-cache key."""
        raise NotImplementedError

    def decode_graph(self, layers: range, adapters: Mapping[str, int] | None = None,
                     context: int | None = None) -> Graph:
        """Layers ``layers`` for one token. Inputs ``x`` [1, hidden, 1, 1], ``mask`` [1, 1, 1, T],
        ``k<i>``/``v<i>`` [1, kv_heads * head_dim, 1, T] (``T = context``, default the model's context);
        outputs ``x`` and each layer's new ``k<i>``/``v<i>`` [1, kv_heads * head_dim, 1, 1]."""
        raise NotImplementedError

    def prefill_graph(self, layers: range, seq: int, adapters: Mapping[str, int] | None = None,
                      past: bool = False, context: int | None = None) -> Graph:
        """Layers ``layers`` over ``seq`` tokens with causal attention: input ``x`` [1, hidden, 1, seq];
        outputs ``x`` and each layer's ``k<i>``/``v<i>`` [1, kv_heads * head_dim, 1, seq]. ``past``: a
        chunk of a longer prompt that also attends to the KV cache filled so far (inputs ``mask`` and
        ``k<i>``/``v<i>`` as in ``decode_graph`` with ``T = context``, default the model's context, and any
        ``position_inputs`` over the chunk's lanes). A hook that takes ``packed`` reads several whole prompts in one
        pass when ``packed=True``: side by side on the lanes, each embedded from position 0 (and its
        ``position_inputs`` from 0), kept apart by the input ``mask_packed`` ``[1, seq, 1, seq]``
        (``orion.ops.packed_causal_mask``); ``Batch`` then reads prompts joining together so."""
        raise NotImplementedError

    def lm_head_graph(self, vocab: range, seq: int) -> Graph:
        """Final norm and LM head for token ids ``vocab``: ``x`` -> ``logits`` [1, len(vocab), 1, seq]."""
        raise NotImplementedError

    def embed(self, ids: list[int], positions: Sequence[int]) -> np.ndarray:
        """The residual stream entering layer 0 for ``ids[i]`` at position ``positions[i]`` (a ``range`` for a prompt's
        consecutive tokens, a list for a decode step's lanes): float32 [n, hidden]."""
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

    def release_weight_pages(self) -> None:
        """Drop the pages of the mapped checkpoint that building a program read (the programs hold the
        weights); a model whose weights live in memory has nothing to drop. Called after each build."""
        source = getattr(getattr(self, "weights", None), "source", None)
        if source is not None:
            source.release_pages()

    def position_inputs(self, positions: range) -> dict[str, np.ndarray]:
        """Extra per-position layer inputs (e.g. rotary tables): name -> float32 ``[channels, len(positions)]``,
        written into the first lanes of that input of every layer program declaring it. None by default."""
        return {}

    def mask_inputs(self, positions: range, length: int) -> dict[str, np.ndarray]:
        """Extra attention-mask inputs of the decode and chunk programs for the queries at ``positions`` over a
        KV cache of ``length`` lanes holding ``positions.start`` positions (e.g. a sliding window's,
        ``orion.models.blocks.window_mask_columns``): name -> float32 ``[length, len(positions)]``, written
        like ``position_inputs``. None by default."""
        return {}

    def packed_mask_inputs(self, lengths: Sequence[int], seq: int) -> dict[str, np.ndarray]:
        """The mask inputs of a packed prefill (``prefill_graph(..., packed=True)``) of prompts of ``lengths`` tokens
        on ``seq`` lanes: name -> float32 ``[seq, seq]`` (``orion.ops.packed_causal_mask``), written into each layer
        program declaring it. By default ``mask_packed``; a model with sliding windows adds ``mask_packed_window``
        (``orion.models.blocks.packed_mask_inputs``)."""
        return {PACKED_MASK_INPUT: packed_causal_mask(lengths, seq)}

    # -- construction ---------------------------------------------------------------------------------
    def _setup(self, *, tokenizer: Tokenizer | None, tokenizer_error: TokenizerNotFound | None,
               fusion_depth: int | None, lm_head: str, progress: bool,
               compile_options: dict[str, Any] | None = None, prefill_chunk: int | None = None) -> None:
        """Compiles the decode plan and binds it to a new KV cache (call at the end of ``__init__``);
        ``compile_options``: the programs' profile / relaxed_ops (``orion.quant.compile_options``);
        ``prefill_chunk``: the largest prefill bucket, longer prompts run in chunks of it (None: the default)."""
        d = self.dims
        self._tokenizer, self._tokenizer_error = tokenizer, tokenizer_error
        self.options = PlanOptions(fusion_depth=fusion_depth, lm_head=lm_head,
                                   **({} if prefill_chunk is None else {"prefill_chunk": prefill_chunk}))
        largest = self.options.prefill_pieces(d.context)[0][2]  # a packed read holds at most a context-long prompt
        self.options = replace(self.options, join_chunk=min(self.options.join_chunk, largest))
        start = time.perf_counter()
        builder = ProgramBuilder(self.program_identity(), self.options.io_dtype, progress, compile_options,
                                 after_lowering=self.release_weight_pages,
                                 weight_bytes=int(d.parameters * weight_bytes(self.quant)))
        self._head_ranges = vocab_chunks(d.vocab_size, d.hidden)
        depth = self.options.fusion_depth or sram_fusion_depth(d.n_layer, self.layer_weight_bytes())
        heads = len(self._head_ranges) if self.options.lm_head == "ane" else 0
        millions = f"{d.parameters / 1e6:.{0 if d.parameters >= 1e7 else 1}f}M"
        layer_programs = -(-d.n_layer // depth) if depth > 1 else 0  # at depth 1, on first use (build_decode_plan)
        builder.begin(f"{self.display_name} ({millions} parameters, {d.n_layer} layers) "
                      f"on {backend()}", layer_programs + heads)
        # A decode_graph hook without the ``context`` argument reads full-context caches: one bucket.
        sized = "context" in inspect.signature(self.decode_graph).parameters
        self._kv_buckets = context_buckets(d.kv_heads * d.head_dim, d.context, self.options.io_dtype) \
            if sized else (d.context,)
        self._compile_lock = threading.Lock()  # shared by forks: one compiles a new bucket (prefill, KV cache) at a time
        self._base_programs = ProgramSet(builder, self._build_decode_plan(builder, self.options))  # shared by forks
        builder.end()
        self.compile_seconds = time.perf_counter() - start
        self._programs = self._base_programs
        self._stage_inputs: Mapping[str, np.ndarray] = {}  # written into every stage bound (use_programs)
        self._bind_cache()

    def _build_decode_plan(self, builder: ProgramBuilder, options: PlanOptions) -> DecodePlan:
        """Compiles the decode programs of ``options`` (their lanes) for the shortest KV bucket."""
        d = self.dims
        return build_decode_plan(builder, options, d.n_layer, sram_fusion_depth(d.n_layer, self.layer_weight_bytes()),
                                 self._head_ranges, lambda r, t: self._decode_graph(r, t, None, options.lanes),
                                 self.lm_head_graph, self.program_costs, self._kv_buckets[0], self._compile_lock)

    def _decode_graph(self, layers: range, context: int, adapters: Mapping[str, int] | None, lanes: int) -> Graph:
        """The ``decode_graph`` hook with the arguments it takes: ``context`` (else full-context caches) and
        ``lanes`` (else one sequence per step)."""
        takes = inspect.signature(self.decode_graph).parameters
        extra: dict[str, Any] = {"context": context} if "context" in takes else {}
        if lanes > 1:
            if "lanes" not in takes:
                raise GenerationError(f"{self.display_name}'s decode_graph takes no 'lanes': it decodes one "
                                      f"sequence per step (use lanes=1)")
            extra["lanes"] = lanes
        return self.decode_graph(layers, adapters, **extra) if adapters else self.decode_graph(layers, **extra)

    def prepare(self, positions: int) -> list[int]:
        """Compile now the decode programs of every KV bucket a sequence of up to ``positions`` positions
        reaches, so that none is compiled in the middle of a generation (``generate`` calls it with the
        prompt's length plus ``max_new_tokens``, after the prompt: ``_steps``). Within the compile budget (ANE-11):
        a bucket is compiled ahead only while :data:`COMPILE_RESERVE` sets of programs (prompts of new lengths)
        stay in the budget; the others are compiled when first used. The bucket of the next decode step (the
        cache's filled positions plus one) is exempt from the reserve: that step would compile it anyway.
        Returns the buckets compiled now."""
        return self._prepare(positions)

    def _prepare_later(self, positions: int) -> Callable[[], list[int]]:
        """``prepare(positions)`` to run once the prompt is read, before the first decode step (a first token
        needs no decode program, ``build_decode_plan``): the compiles in between (the prompt's, a prompt of a
        new length as the reserve is for) come out of the reserve. The prompt's bucket was chosen reserving
        every decode bucket not compiled yet (``_prompt_bucket``), so it is the one it would be after
        ``prepare``, and ``prepare`` compiles the buckets it would have compiled before the prompt (fewer only
        when the prompt took more than the reserve: the reserve goes no lower than none)."""
        left = compiles_left()
        return lambda: self._prepare(positions, left - compiles_left())

    def _prepare(self, positions: int, spent: int = 0) -> list[int]:
        """``prepare``, its reserve less ``spent`` compiles (``_prepare_later``)."""
        plan = self.decode_plan
        reach = next(t for t in self._kv_buckets if t >= min(max(positions, 1), self.dims.context))
        per_bucket = len(plan.layer_ranges)
        reserve = max(0, COMPILE_RESERVE * (per_bucket + len(plan.head_programs)) - spent)
        following = self.cache.bucket_for(min(self.cache.length + 1, self.dims.context))
        done = []
        for bucket in (t for t in self._kv_buckets if t <= reach and t not in plan.layers_by_context):
            if compiles_left() < per_bucket + (0 if bucket == following else reserve):
                if bucket < following:  # below the filled positions: not the next steps'
                    continue
                break
            plan.layers_at(bucket)
            done.append(bucket)
        return done

    def with_lanes(self, lanes: int) -> CausalLM:
        """A copy of this model whose decode programs advance ``lanes`` sequences per step, one lane each
        (``orion.generation.batch.Batch`` schedules them), sharing the weights, the prefill programs and the
        loaded adapters. Compiles its decode programs now: one set for any number of sequences up to ``lanes``."""
        if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
            raise GenerationError(f"lanes={lanes!r}: use a positive number of sequences")
        with self._exclusive("with_lanes"):
            adapters = self.loaded_adapters()
            base = self._base_programs
            twin = copy.copy(self)
            twin.detach_adapters()
            twin.options = replace(self.options, lanes=lanes)
            base.builder.begin(f"{self.display_name} decode over {lanes} lanes", len(self.decode_plan.layer_ranges))
            twin._base_programs = ProgramSet(base.builder, twin._build_decode_plan(base.builder, twin.options),
                                             base.prefill_plans)
            base.builder.end()
            twin._programs, twin._stage_inputs = twin._base_programs, {}
            twin._bind_cache()
            if twin.packs_prompts:  # compiled with the plan: joining prompts never compile, however many
                twin._prefill_plan((twin.options.packed_chunk, False, 0, True))
        for name, adapter in adapters.items():
            twin.add_adapter(adapter, name)
        return twin

    def _bind_cache(self, bucket: int | None = None) -> None:
        """A new, empty KV cache in new decode stages of length ``bucket`` (default the shortest), the
        surfaces of this object alone (a fork calls it too)."""
        d = self.dims
        self.cache = KVCache(d.n_layer, d.kv_heads, d.head_dim, d.context, self._kv_buckets, self.options.lanes)
        self._bind_decode(bucket or self.cache.bucket)
        self._prefill_stages: dict[PrefillKey, tuple[list[Stage], list[Stage]]] = {}
        self._bound_sets: dict[ProgramSet, _BoundStages] = {}  # this object's stages of the sets not in use
        self._busy = threading.Lock()

    def _bind_decode(self, bucket: int, layers: bool = False) -> None:
        """New decode stages for a KV cache of ``bucket`` positions, the cache moved into their inputs. The layer
        stages only when ``layers`` or when the bucket's layer programs are compiled (``layers`` compiles them); else
        the LM-head stages alone (a prompt's logits need no decode layer), the cache held in arrays of its own
        until a decode step binds the layers (``_reserve``)."""
        plan = self.decode_plan
        if layers or bucket in plan.layers_by_context:
            self._layers, self._heads = plan.bind(bucket)
        else:
            self._layers, self._heads = [], plan.bind_heads()
        self._bound_bucket = bucket
        self._write_stage_inputs([self._layers])
        self._attach_cache()

    def _attach_cache(self) -> None:
        """The KV cache into the inputs of the bound decode stages (``KVCache.attach``), or into new arrays of the
        bucket's shape when no layer stage is bound."""
        ranges, bucket = self.decode_plan.layer_ranges, self._bound_bucket
        if self._layers:
            tensors = {name: stage.input(name) for stage, layers in zip(self._layers, ranges)
                       for i in layers for name in (f"k{i}", f"v{i}")}
            masks = [stage.input("mask") for stage in self._layers]
        else:
            dtype, lanes = numpy_dtype(self.options.io_dtype), self.options.lanes
            tensors = {f"{kv}{i}": np.zeros((1, lanes * self.cache.width, 1, bucket), dtype)
                       for i in range(self.dims.n_layer) for kv in "kv"}
            masks = [np.zeros((1, lanes, 1, bucket), dtype) for _ in ranges]
        self.cache.attach(bucket, tensors, masks)

    def _reserve(self, n: int, layers: bool = False) -> None:
        """Room for ``n`` positions: the shortest bucket holding them and the filled ones, its decode stages bound
        (``layers``: its layer stages too, for a decode step). Only an empty cache shrinks: a batch whose longest
        sequence left keeps its bucket while others remain, instead of moving every lane's positions to a shorter
        one and back as sequences come and go (the batched server at 8 clients spent 5% of its samples there)."""
        bucket = self.cache.bucket_for(n)
        if bucket < self._bound_bucket and self.cache.longest > 0:
            bucket = self._bound_bucket
        if bucket != self._bound_bucket:
            # The idle activations of earlier prompts go back to the OS before the new bucket's surfaces come,
            # not after every prompt: the next prompt's first program would fault them in again (GPT-2 124M:
            # ~80 ms a prompt in the 1,024-lane bucket).
            kernels.release_idle_buffers()
            self._bind_decode(bucket, layers)
        elif layers and not self._layers:
            self._bind_decode(bucket, layers)

    def fork(self) -> CausalLM:
        """A model sharing this one's compiled programs with its own copy of the KV cache (and its
        own surfaces, so the two may run in different threads)."""
        with self._exclusive("fork"):
            twin = copy.copy(self)
            twin._bind_cache(self._bound_bucket)
            for lane in range(self.options.lanes):
                twin.cache.copy_lane(self.cache, lane, lane)
            return twin

    def reset(self) -> None:
        """Empty the KV cache."""
        self.cache.clear()

    # -- program sets (orion.lora.hot_swap runs an adapter's set) -------------------------------------
    @property
    def builder(self) -> ProgramBuilder:
        """The builder of the programs in use."""
        return self._programs.builder

    @property
    def decode_plan(self) -> DecodePlan:
        """The decode plan in use."""
        return self._programs.decode_plan

    @property
    def programs(self) -> ProgramSet:
        """The program set in use."""
        return self._programs

    @property
    def base_programs(self) -> ProgramSet:
        """The program set compiled with the model (base layer graphs, no adapters)."""
        return self._base_programs

    def build_programs(self, adapters: Mapping[str, int], caller: str = "build_programs") -> ProgramSet:
        """A program set whose layer graphs take LoRA ``adapters`` (site -> rank): its own builder (the base
        identity plus the ranks), its decode layer programs compiled now, the base LM-head programs, its prefill
        programs compiled on first use. ``caller``: the call a ``ConcurrentUse`` error names."""
        base = self._base_programs
        ranks = dict(adapters)
        builder = ProgramBuilder({**base.builder.identity, "lora": ranks}, base.builder.io_dtype,
                                 base.builder.progress, base.builder.compile_options,
                                 weight_bytes=base.builder.weight_bytes)
        lanes = base.decode_plan.options.lanes
        with self._exclusive(caller):
            plan = rebuild_decode_layers(builder, base.decode_plan, lambda r, t: self._decode_graph(r, t, ranks, lanes))
        return ProgramSet(builder, plan, adapters=ranks)

    def use_programs(self, programs: ProgramSet, inputs: Mapping[str, np.ndarray], caller: str = "use_programs") -> None:
        """Run ``programs`` from now on, with ``inputs`` (graph input name -> array, e.g. an adapter's A/B) written
        into every stage that reads them, now and whenever stages are bound later; empties the KV cache. This
        object's stages of the set left are kept and bound again when that set is used again."""
        with self._exclusive(caller):
            if programs is not self._programs:
                self._bound_sets[self._programs] = _BoundStages(self._layers, self._heads, self._prefill_stages,
                                                                self._bound_bucket)
                self._programs = programs
                bound = self._bound_sets.pop(programs, None)
                if bound is None:
                    self._layers, self._heads = programs.decode_plan.bind(self._bound_bucket)
                    self._prefill_stages = {}
                else:
                    self._layers, self._heads, self._prefill_stages, self._bound_bucket = \
                        bound.layers, bound.heads, bound.prefill, bound.bucket
            self._stage_inputs = inputs
            self._write_stage_inputs([self._layers, *(s for pair in self._prefill_stages.values() for s in pair)])
            self.cache.clear()
            self._attach_cache()

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            raise self._tokenizer_error or TokenizerNotFound("this model has no tokenizer")
        return self._tokenizer

    # -- inference ------------------------------------------------------------------------------------
    def prefill(self, ids: Prompt) -> np.ndarray:
        """Reset the cache, run the prompt ``ids`` (token ids, or text with a tokenizer) through every
        layer, and return the last position's logits ``[vocab]``."""
        ids = self._check_ids(ids)
        with self._exclusive("prefill"):
            return self._prefill_logits({0: self._run_prefill(ids)[:, -1]})[0]

    def decode_step(self, token: int) -> np.ndarray:
        """Append one token at the next position and return its logits ``[vocab]``."""
        with self._exclusive("decode_step"):
            return self._decode_lanes({0: token})[0]

    def _decode_lanes(self, tokens: Mapping[int, int]) -> dict[int, np.ndarray]:
        """One decode step: token ``tokens[b]`` appended at lane ``b``'s next position, for every lane given
        at once (one dispatch per program); returns each lane's logits ``[vocab]``. The other lanes are
        dead: the emulator computes the live lanes only (up to the highest given)."""
        cache = self.cache
        lanes = sorted(tokens)
        positions = [int(cache.lengths[b]) for b in lanes]
        for pos in positions:
            if pos == 0:
                raise OrionError("decode_step needs a prefilled cache: call prefill(ids) first")
            if pos >= cache.context:
                raise ContextFull(f"the KV cache holds {pos} tokens, the context length is {cache.context}: "
                                  f"reset() or start a new prompt")
        self._check_ids([_token_id(tokens[b], "decode_step's token") for b in lanes])
        longest = max(positions)
        self._reserve(longest + 1, layers=True)  # the cache grows by buckets (kv_cache)
        x, per_lane = self._layers[0].input("x"), {"x"}
        embedded = self.embed([tokens[lane] for lane in lanes], positions)
        x[0, :, 0, lanes] = embedded  # (the lanes axis comes first in a fancy index split by slices)
        for lane, pos in zip(lanes, positions):
            extra = self.position_inputs(range(pos, pos + 1)) | self.mask_inputs(range(pos, pos + 1), cache.bucket)
            _write_lanes(self._layers, extra, lane)
            per_lane |= set(extra)
        # Positions >= the longest of the caches and the mask are dead lanes: the emulator skips them.
        runs = [(stage, {name: longest for i in layers for name in (f"k{i}", f"v{i}")} | {"mask": longest}
                 | {name: lanes[-1] + 1 for name in per_lane if name in stage.mil_name})
                for stage, layers in zip(self._layers, self.decode_plan.layer_ranges)]
        # The layers and the head (no stages when it runs on the CPU) in one call: a layer's new key and value do
        # not reach a later layer's program in this step, and an overflowed layer is named below, in order, as if
        # the step had stopped there.
        self._run_with_heads(runs + [(stage, {"x": lanes[-1] + 1}) for stage in self._heads])
        if not np.isfinite(_residual_lanes(self._layers[-1], lanes)).all():
            # An overflow reaches the last layer's output (each layer adds to the residual stream; NaN and inf
            # stay). The stages' residual outputs, and the first one's input, take turns in two surfaces, so the
            # step runs again from the embedding, a stage at a time, to name the first layer that overflowed (the
            # cache is as it was: nothing was stored yet).
            x[0, :, 0, lanes] = embedded
            for (stage, live), layers in zip(runs, self.decode_plan.layer_ranges):
                stage.run(live)
                _check_finite(stage, layers, lanes, "tokens at positions " + ", ".join(map(str, positions)))
        caches, new = [], []  # each lane's new key and value of every layer, stored at its position in one call
        for stage, layers in zip(self._layers, self.decode_plan.layer_ranges):
            for i in layers:
                caches += [cache.keys[i], cache.values[i]]
                new += [stage.output(f"k{i}")[0, :, 0], stage.output(f"v{i}")[0, :, 0]]
        kernels.store_columns(caches, new, lanes, positions)
        cache.appended(lanes)
        return self._read_logits(lanes)

    def _alone_ready(self, solo: CausalLM, lane: int) -> bool:
        """Whether ``solo`` (``_decode_alone``) has compiled the decode layer programs for lane ``lane``'s next step."""
        needed = int(self.cache.lengths[lane]) + 1
        return needed <= solo.dims.context and \
            next(t for t in solo._kv_buckets if t >= needed) in solo.decode_plan.layers_by_context

    def _decode_alone(self, solo: CausalLM, lane: int, token: int) -> np.ndarray:
        """One decode step of lane ``lane`` alone, on ``solo``: a one-lane model with these weights and a cache of its
        own (a ``fork`` of the model this one is ``with_lanes`` of), whose bucket's programs are compiled
        (``_alone_ready``). The emulator computes only the live lanes of the many-lane programs, but a lone lane still
        costs them more than the one-lane programs (GPT-2 124M: 4 of 24 ms a step). ``solo``'s cache holds a copy of
        the lane, brought up to date first (``KVCache.copied``: the positions added or changed since its last step,
        as a chunk program's copies); the step's new key and value also go to the lane, which stays the cache of
        record. Returns the lane's logits, as ``_decode_lanes({lane: token})`` would."""
        cache, n = self.cache, int(self.cache.lengths[lane])
        held = cache.copied(solo, lane, n)  # solo's lane 0 holds the lane's first ``held`` positions
        with solo._exclusive("_decode_alone"):
            solo.cache.filled(0, min(held, int(solo.cache.lengths[0])))
            solo._reserve(n + 1, layers=True)
            for mine, theirs in zip(solo.cache.keys + solo.cache.values, cache.keys + cache.values):
                mine[0, :, held:n] = theirs[lane, :, held:n]
            solo.cache.filled(0, n)
            logits = solo._decode_lanes({0: token})[0]
        self._reserve(n + 1)
        for mine, theirs in zip(cache.keys + cache.values, solo.cache.keys + solo.cache.values):
            mine[lane, :, n] = theirs[0, :, n]
        cache.filled(lane, n + 1)
        cache.copied(solo, lane, n + 1)
        return logits

    def logits(self, ids: Prompt) -> np.ndarray:
        """Logits ``[len(ids), vocab]`` of every position (fills the cache like ``prefill``)."""
        ids = self._check_ids(ids)
        with self._exclusive("logits"):
            rows: list[np.ndarray] = []
            self._run_prefill(ids, self._logit_rows(rows))
            return _float32(np.concatenate(rows))

    def extend(self, ids: Prompt) -> np.ndarray:
        """Append ``ids`` after the cached positions in one run of the chunk programs (a chunk attending to
        the KV cache, ``PlanOptions.extend_pieces``) and return the logits ``[len(ids), vocab]`` of each new
        position: how speculative decoding checks its drafts in one dispatch per program."""
        ids = self._check_ids(ids)
        with self._exclusive("extend"):
            return self._extend(ids, 0)

    def _extend(self, ids: list[int], lane: int) -> np.ndarray:
        """``extend`` of lane ``lane`` (checked ids; the caller holds the model)."""
        held = int(self.cache.lengths[lane])
        if held == 0:
            raise OrionError("extend needs a prefilled cache: call prefill(ids) first")
        if held + len(ids) > self.cache.context:
            raise ContextFull(f"extend: {held} cached and {len(ids)} new tokens exceed the context "
                              f"length {self.cache.context}: reset() or append fewer tokens")
        rows: list[np.ndarray] = []
        for _ in self._append_pieces(ids, held, lane, self._logit_rows(rows)):
            pass  # one piece (at most prefill_chunk tokens) after another
        return _float32(np.concatenate(rows))

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` cached positions and forget the rest (e.g. rejected speculative drafts):
        no program reads them again, and the next tokens overwrite them."""
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or not 0 <= length <= self.cache.length:
            raise GenerationError(f"truncate({length}): the KV cache holds {self.cache.length} positions; give a "
                                  f"length in [0, {self.cache.length}]")
        with self._exclusive("truncate"):
            self.cache.filled(0, int(length))

    def _logit_rows(self, rows: list[np.ndarray]) -> Callable[[list[Stage], np.ndarray], None]:
        """An ``on_chunk`` that appends each piece's logits ``[tokens, vocab]`` to ``rows``."""

        def chunk_logits(heads: list[Stage], x: np.ndarray) -> None:
            if self.options.lm_head == "cpu":
                rows.append(np.stack([self.cpu_logits(x[:, i]) for i in range(x.shape[1])]))
                return
            for head in heads:
                head.run({"x": x.shape[1]})  # the lanes past the piece's tokens are padding
            rows.append(np.concatenate([h.output("logits")[0, :, 0, :x.shape[1]] for h in heads]).T)

        return chunk_logits

    def generate(self, ids: Prompt, max_new_tokens: int | None = None, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 stop: Stop = None, *, min_p: float | None = None, repetition_penalty: float | None = None,
                 logits_processor: LogitsProcessor | Sequence[LogitsProcessor] | None = None,
                 ignore_eos: bool = False, speculative: Speculation | str | None = None) -> Generation:
        """Iterate over up to ``max_new_tokens`` new token ids after the prompt ``ids`` (token ids, or
        text or a chat when the model has a tokenizer; an empty prompt starts from the BOS token).

        Greedy when ``temperature == 0``, else sampled (``top_k``/``top_p``/``min_p`` truncation,
        ``seed`` for reproducibility); ``repetition_penalty`` and ``logits_processor`` (``f(ids, logits)
        -> logits`` on every step, before sampling) reshape the logits first. Arguments left at None
        take the model's ``generation_defaults`` (its ``generation_config.json``).

        ``stop``: token ids and/or strings; the run ends after the token that hits one (stop strings
        are matched on the decoded text). The model's end-of-sequence ids stop it too, as in transformers
        (the EOS id is the last one yielded), unless ``ignore_eos``. The returned :class:`Generation`
        tells why it ended.

        ``speculative``: ``"prompt-lookup"`` or a :class:`Speculation` drafts tokens from n-grams of the
        text so far and checks them in one run of the chunk programs (``orion.generation.speculative``):
        the same tokens, fewer dispatches when the text repeats its prompt."""
        finish, steps = self._start(ids, max_new_tokens, temperature, top_k, top_p, seed, stop, min_p,
                                    repetition_penalty, logits_processor, eos=not ignore_eos,
                                    speculative=speculative)
        return Generation(finish, steps, lambda token, text: token)

    def generate_text(self, prompt: Prompt, max_new_tokens: int | None = None, temperature: float | None = None,
                      top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                      stop: Stop = None, *, min_p: float | None = None, repetition_penalty: float | None = None,
                      logits_processor: LogitsProcessor | Sequence[LogitsProcessor] | None = None,
                      ignore_eos: bool = False, speculative: Speculation | str | None = None) -> Generation:
        """Like ``generate`` on text: iterate over text pieces that joined equal the decoded new
        tokens (multi-byte characters are never split). Stops at the model's end-of-sequence tokens
        (unless ``ignore_eos``) and at ``stop`` (strings and/or token ids); neither the stop token's text
        nor any part of a stop string is in the output. ``speculative`` as for ``generate``."""
        self.tokenizer  # noqa: B018 -- raises TokenizerNotFound before any work
        finish, steps = self._start(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, min_p,
                                    repetition_penalty, logits_processor, eos=not ignore_eos, text=True,
                                    speculative=speculative)
        return Generation(finish, steps, lambda token, text: text)

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The token ids of ``prompt``: token ids as given, text encoded, a chat (a list of
        ``{"role", "content"}`` dicts) through the model's chat template; ``[BOS]`` when empty."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
            ids = self.tokenizer.encode(self.tokenizer.apply_chat_template(list(prompt)), add_special_tokens=False)
        else:
            ids = _token_ids(prompt, "the prompt")
        if not ids:
            bos = self._tokenizer.bos_token_id if self._tokenizer is not None else None
            if bos is None:
                raise GenerationError("the prompt is empty and this model names no BOS token to start from: "
                                      "give at least one token id")
            ids = [bos]
        return ids

    # -- generation internals -------------------------------------------------------------------------
    def _start(self, prompt: Prompt, max_new_tokens: int | None, temperature: float | None, top_k: int | None,
               top_p: float | None, seed: int | None, stop: Stop, min_p: float | None,
               repetition_penalty: float | None, logits_processor: Any, *, eos: bool,
               text: bool = False, speculative: Speculation | str | None = None,
               ) -> tuple[_Finish, Iterator[tuple[int, str]]]:
        """Checks every argument now (not on the first ``next``) and returns the step generator."""
        settings = Speculation.of(speculative)
        sequence = self._sequence(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop, min_p,
                                  repetition_penalty, logits_processor, eos=eos, text=text)
        speculator = None if settings is None else Speculator(ModelTarget(self), settings, sequence.ids)
        sequence.finish.speculation = None if speculator is None else speculator.stats
        return sequence.finish, self._steps(sequence, speculator)

    def _sequence(self, prompt: Prompt, max_new_tokens: int | None, temperature: float | None, top_k: int | None,
                  top_p: float | None, seed: int | None, stop: Stop, min_p: float | None,
                  repetition_penalty: float | None, logits_processor: Any, *, eos: bool,
                  text: bool = False) -> _Sequence:
        """A new sequence's choices, every argument checked (``generate``'s, with the model's defaults)."""
        d = self.generation_defaults
        params = _Sampling(
            temperature=d.temperature if temperature is None else temperature,
            top_k=d.top_k if top_k is None else top_k, top_p=d.top_p if top_p is None else top_p,
            min_p=d.min_p if min_p is None else min_p,
            repetition_penalty=d.repetition_penalty if repetition_penalty is None else repetition_penalty,
            processors=_processors(logits_processor))
        check_sampling(params.temperature, params.top_k, params.top_p, params.min_p, params.repetition_penalty)
        if max_new_tokens is None:
            max_new_tokens = d.max_new_tokens if d.max_new_tokens is not None else DEFAULT_MAX_NEW_TOKENS
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
            raise GenerationError(f"max_new_tokens={max_new_tokens}: use a non-negative integer")
        stop_ids, stop_strings = _split_stops(stop)
        if eos and self._tokenizer is not None:
            stop_ids |= set(self._tokenizer.eos_token_ids)
        if (stop_strings or text) and self._tokenizer is None:
            self.tokenizer  # noqa: B018 -- raises TokenizerNotFound: stop strings need text
        ids = self.prompt_ids(prompt)
        self._check_context(ids)
        decode = text or bool(stop_strings)
        return _Sequence(ids, int(max_new_tokens), params, np.random.default_rng(seed), stop_ids,
                         StopStrings(stop_strings), IncrementalDetokenizer(self.tokenizer.decode, ids) if decode else None,
                         self._mask_ids_without_text, self.dims.context)

    def _steps(self, sequence: _Sequence, speculator: Speculator | None = None) -> Iterator[tuple[int, str]]:
        """Yields ``(token, text safe to show)`` of one sequence in lane 0; fills in its ``finish`` on the last step.
        With a ``speculator``, the logits after each token come from it (checked drafts) instead of
        ``decode_step``; the positions of drafts never chosen leave the cache at the end."""
        prepare = self._prepare_later(len(sequence.ids) + sequence.max_new_tokens)
        logits = self.prefill(sequence.ids)
        try:
            while not sequence.done:
                fed = self.cache.length - (len(speculator.pending) if speculator else 0)  # drafts not counted
                token, piece = sequence.choose(logits, fed)
                yield token, piece
                if sequence.done:
                    return
                if prepare is not None:  # the first token needs no decode program: they come after it
                    prepare()
                    prepare = None
                wanted = sequence.max_new_tokens - sequence.produced - 1  # tokens after the next one
                logits = speculator.next_logits(token, wanted) if speculator else self.decode_step(token)
        finally:
            if speculator is not None:
                speculator.close()

    def _mask_ids_without_text(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with the ids beyond the tokenizer at -inf: a model's embedding may have more rows than
        its tokenizer has tokens (Qwen2.5: 151,936 against 151,665), and those ids have no text."""
        covered = self._tokenizer.vocab_size if self._tokenizer is not None else logits.shape[-1]
        if covered >= logits.shape[-1]:
            return logits
        masked = np.array(logits, copy=True)
        masked[covered:] = -np.inf
        return masked

    def _check_context(self, ids: list[int]) -> None:
        if len(ids) > self.dims.context:
            raise ContextFull(f"{len(ids)} tokens exceed the context length {self.dims.context}: shorten the prompt")

    # -- internals ------------------------------------------------------------------------------------
    def _exclusive(self, what: str) -> _Exclusive:
        return _Exclusive(self, what)

    @property
    def packs_prompts(self) -> bool:
        """Whether several whole prompts can be read in one pass (the ``prefill_graph`` hook takes ``packed``):
        ``_read_packed``."""
        return "packed" in inspect.signature(self.prefill_graph).parameters

    def _packable(self, ids: list[int]) -> bool:
        """Whether prompt ``ids`` may be read in a packed pass: the model packs prompts, it fits one, and the prefix
        cache holds none of it (such a prompt copies that prefix in and reads only the rest, alone)."""
        return self.packs_prompts and len(ids) <= self.options.packed_chunk and \
            (self.prefix_cache is None or self.prefix_cache.reusable(self, ids) == 0)

    def _prefill_graph(self, adapters: Mapping[str, int] | None, layers: range, seq: int, past: bool = False,
                       context: int | None = None, packed: bool = False) -> Graph:
        """The ``prefill_graph`` hook of a program set with LoRA ``adapters`` (None: the base graph); ``past``: the
        chunk graph over a KV cache of ``context`` positions; ``packed``: the graph of several whole prompts."""
        extra: dict[str, Any] = {"past": True, "context": context} if past else {"packed": True} if packed else {}
        if adapters is None:
            return self.prefill_graph(layers, seq, **extra)
        return self.prefill_graph(layers, seq, adapters=adapters, **extra)

    def _write_stage_inputs(self, stage_lists: Iterable[list[Stage]]) -> None:
        """The arrays of :meth:`use_programs`' ``inputs`` into every stage of ``stage_lists`` that reads them."""
        for stages in stage_lists:
            for stage in stages:
                for input_name, value in self._stage_inputs.items():
                    if input_name in stage.mil_name:
                        stage.input(input_name)[...] = value

    def _check_ids(self, ids: Prompt) -> list[int]:
        ids = _token_ids(ids, "the prompt") if not isinstance(ids, str) else self.prompt_ids(ids)
        d = self.dims
        if not ids:
            raise GenerationError("give at least one token id")
        self._check_context(ids)
        bad = [i for i in ids if not 0 <= i < d.vocab_size]
        if bad:
            raise GenerationError(f"token ids {bad[:5]} are outside the vocabulary [0, {d.vocab_size})")
        return ids

    def _prefill_bucket(self, seq: int, with_head: bool, past: int,
                        packed: bool = False) -> tuple[list[Stage], list[Stage]]:
        """The prefill stages of bucket ``seq`` (``past``: the chunk programs over this object's KV cache at
        its bucket of ``past`` positions; ``packed``: of several prompts at once): programs compiled once per
        bucket, surfaces per fork."""
        key = (seq, with_head, past, packed)
        plan = self._prefill_plan(key)
        stages = self._prefill_stages.get(key)
        if stages is None or stages[0][0].compiled is not plan.layer_programs[0]:  # (new, or the plan was rebuilt)
            stages = self._prefill_stages[key] = plan.bind(self.options.io_dtype)
            self._write_stage_inputs(stages[:1])
        return stages

    def _prompt_bucket(self, natural: int, with_head: bool) -> int:
        """The bucket a prompt of ``natural``'s bucket runs in (its tokens the live lanes, the rest dead: the
        emulator computes the live ones only, the ANE every lane). Its own when compiled, or when compiling it
        leaves room in the budget (ANE-11) for the decode buckets not compiled yet and the largest prompt
        bucket; else the smallest compiled prompt bucket that holds it; else the largest (``prefill_chunk``, or
        the first piece's bucket of a context-long prompt when that is shorter). A 24-layer model at one layer per program spends 24 compiles per bucket: Qwen2.5-0.5B's prompts of 16,
        128 and 1000 tokens and their decode buckets took 131 compiles, past the budget, before this."""
        largest = self.options.prefill_pieces(self.dims.context)[0][2]
        compiled = sorted(seq for (seq, head, past, packed), built in self._programs.prefill_plans.items()
                          if head == with_head and not past and not packed and seq >= natural and not built.failed)
        if natural in compiled or natural == largest:
            return natural
        plan = self.decode_plan
        per_set = len(plan.layer_ranges) + (len(self._head_ranges) if with_head else 0)
        decode_left = sum(t not in plan.layers_by_context for t in self._kv_buckets)
        reserve = decode_left * len(plan.layer_ranges) + (per_set if largest not in compiled else 0)
        if compiles_left() >= per_set + reserve:
            return natural
        return compiled[0] if compiled else largest

    def _prefill_plan(self, key: PrefillKey) -> PrefillPlan:
        """The prefill plan ``key`` of the program set in use, compiled on first use, and again when a program it
        read ahead from the cache failed to compile (that error was raised where the program first ran)."""
        seq, with_head, past, packed = key
        programs = self._programs
        with self._compile_lock:
            if key not in programs.prefill_plans or programs.prefill_plans[key].failed:
                plan = self.decode_plan
                what = f"chunks of {seq} tokens over {past} cached" if past else \
                    f"prompts read together on {seq} lanes" if packed else f"prompts up to {seq} tokens"
                self.builder.begin(f"{self.display_name} {what}", len(plan.layer_ranges)
                                   + (len(self._head_ranges) if with_head else 0))
                programs.prefill_plans[key] = build_prefill_plan(
                    self.builder, self.dims.n_layer, self.decode_plan.fusion_depth, seq,
                    self._head_ranges if with_head else [], partial(self._prefill_graph, programs.adapters),
                    self.lm_head_graph, past, packed)
                self.builder.end()
            return programs.prefill_plans[key]

    def _run_prefill(self, ids: list[int],
                     on_chunk: Callable[[list[Stage], np.ndarray], None] | None = None) -> np.ndarray:
        """Runs the layers over the prompt into lane 0 of the (reset) cache (``_prefill_pieces``). Returns
        the last piece's x ``[hidden, tokens]``."""
        pieces = self._prefill_pieces(ids, 0, on_chunk)
        while True:
            try:
                next(pieces)
            except StopIteration as done:
                return done.value

    def _prefill_pieces(self, ids: list[int], lane: int,
                        on_chunk: Callable[[list[Stage], np.ndarray], None] | None = None,
                        ) -> Iterator[None]:
        """Runs the layers over the prompt, in chunks when it is longer than the largest bucket
        (``PlanOptions.prefill_pieces``), and stores its keys/values in lane ``lane`` of the cache (emptied
        first), yielding after each piece (so other lanes may decode in between); with a ``prefix_cache``,
        the longest prefix it holds is copied in instead of computed (not for ``on_chunk``, which wants
        every position). After each piece, ``on_chunk(LM-head stages, x [hidden, tokens])`` (given: the
        plans include the LM head when it runs on the ANE). Returns the last piece's x ``[hidden, tokens]``."""
        self.cache.clear(lane)
        reused = self.prefix_cache.restore(self, ids, lane) if self.prefix_cache is not None and on_chunk is None else 0
        x = yield from self._append_pieces(ids[reused:], reused, lane, on_chunk)
        if self.prefix_cache is not None:
            self.prefix_cache.store(self, ids, lane)
        return x

    def _append_pieces(self, ids: list[int], first: int, lane: int,
                       on_chunk: Callable[[list[Stage], np.ndarray], None] | None) -> Iterator[None]:
        """Runs the layers over ``ids`` at positions ``first...`` of lane ``lane``, after its ``first`` cached
        ones (a prompt into an empty lane, or tokens appended through the chunk programs), stores their
        keys/values and yields between pieces; returns the last piece's x ``[hidden, tokens]``."""
        cache = self.cache
        pieces = self.options.prefill_pieces(len(ids)) if first == 0 else self.options.extend_pieces(first, len(ids))
        self._reserve(first + len(ids))  # chunk programs read the cache at the bucket holding every position
        x = np.zeros((self.dims.hidden, 0), np.float32)
        with_head = on_chunk is not None and self.options.lm_head == "ane"
        for start, n, seq in pieces:
            past = start > 0
            if not past:
                seq = self._prompt_bucket(seq, with_head)
            stages, heads = self._prefill_bucket(seq, with_head, cache.bucket if past else 0)
            x = stages[0].input("x")
            x[...] = 0.0
            self._embed_into(x[0, :, 0], ids[start - first:start - first + n], start)
            extra = self.position_inputs(range(start, start + n))
            if past:
                extra |= self.mask_inputs(range(start, start + n), cache.bucket)
            if extra:
                _write_lanes(stages, extra)
            for stage, layers in zip(stages, self.decode_plan.layer_ranges):
                live = {"x": n} if n < seq else None  # a prompt's dead lanes (causal: they change no live lane)
                if past:  # the chunk reads the positions filled so far; the later ones are dead lanes
                    _write_past(stage, layers, cache, lane, start, cache.copied(stage, lane, start))
                    live = {name: start for i in layers for name in (f"k{i}", f"v{i}")} | {"mask": start}
                    live["x"] = n  # and the chunk's own lanes past its tokens (causal: they change no live lane)
                stage.run(live)
                _check_finite(stage, layers, n, f"prompt positions {start}-{start + n - 1}")
                for i in layers:
                    cache.keys[i][lane, :, start:start + n] = stage.output(f"k{i}")[0, :, 0, :n]
                    cache.values[i][lane, :, start:start + n] = stage.output(f"v{i}")[0, :, 0, :n]
            cache.filled(lane, start + n)
            x = stages[-1].output("x")[0, :, 0, :n]
            if on_chunk is not None:
                on_chunk(heads, x)
            if start + n < first + len(ids):
                yield
        return x

    def _embed_into(self, x: np.ndarray, ids: list[int], start: int) -> None:
        """The embeddings of ``ids`` at positions ``start...`` into the first lanes of ``x`` ``[hidden, lanes]``,
        :data:`EMBED_ROWS` tokens at a time (``embed`` is per token: the same values as at once)."""
        for a in range(0, len(ids), EMBED_ROWS):
            piece = ids[a:a + EMBED_ROWS]
            x[:, a:a + len(piece)] = self.embed(piece, range(start + a, start + a + len(piece))).T

    def _read_packed(self, prompts: Mapping[int, list[int]]) -> dict[int, np.ndarray]:
        """Reads whole prompts (lane -> checked ids, together at most ``options.packed_chunk`` tokens; the hook
        takes ``packed``) in one pass of the packed prefill programs: one dispatch per layer program for all of
        them, side by side on the lanes, each attending to itself (``packed_causal_mask``); their keys and values
        go to their lanes of the cache (emptied first). Returns each lane's logits after its prompt, from one
        run of the LM head; with a ``prefix_cache``, each prompt is stored in it."""
        seq, cache = self.options.packed_chunk, self.cache
        lengths = [len(ids) for ids in prompts.values()]
        if sum(lengths) > seq:
            raise GenerationError(f"{len(prompts)} prompts of {sum(lengths)} tokens exceed the {seq} lanes of a packed "
                                  f"read (PlanOptions.join_chunk): read them in turn")
        starts = np.cumsum([0, *lengths[:-1]]).tolist()
        for lane in prompts:
            cache.clear(lane)
        self._reserve(max(lengths))
        stages, _ = self._prefill_bucket(seq, False, 0, packed=True)
        x = stages[0].input("x")
        x[...] = 0.0
        for ids, start in zip(prompts.values(), starts):
            self._embed_into(x[0, :, 0, start:], ids, 0)
        extra = [self.position_inputs(range(len(ids))) for ids in prompts.values()]
        _write_lanes(stages, {name: np.concatenate([e[name] for e in extra], axis=1) for name in extra[0]})
        for name, mask in self.packed_mask_inputs(lengths, seq).items():
            for stage in (s for s in stages if name in s.mil_name):
                stage.input(name)[0, :, 0] = mask
        total = sum(lengths)
        for stage, layers in zip(stages, self.decode_plan.layer_ranges):
            stage.run({"x": total})  # the lanes past the prompts are padding, each attending to itself alone
            _check_finite(stage, layers, total, f"{len(prompts)} prompts read together")
            for i in layers:
                keys, values = stage.output(f"k{i}")[0, :, 0], stage.output(f"v{i}")[0, :, 0]
                for lane, start, n in zip(prompts, starts, lengths):
                    cache.keys[i][lane, :, :n] = keys[:, start:start + n]
                    cache.values[i][lane, :, :n] = values[:, start:start + n]
        for lane, n in zip(prompts, lengths):
            cache.filled(lane, n)
        if self.prefix_cache is not None:
            for lane, ids in prompts.items():
                self.prefix_cache.store(self, ids, lane)
        last = stages[-1].output("x")[0, :, 0]
        return self._prefill_logits({lane: last[:, start + n - 1] for lane, start, n in zip(prompts, starts, lengths)})

    def _prefill_logits(self, xs: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        """Logits of prompts' last positions ``xs`` (lane -> [hidden]), through their lanes of the decode LM head
        (one run for all)."""
        if self.options.lm_head == "cpu":
            return {lane: self.cpu_logits(x) for lane, x in xs.items()}
        for lane, x in xs.items():
            self._heads[0].input("x")[0, :, 0, lane] = x
        lanes = sorted(xs)
        self._run_with_heads([(head, {"x": lanes[-1] + 1}) for head in self._heads])
        return self._read_logits(lanes)

    def _run_with_heads(self, runs: list[tuple[Stage, Mapping[str, int] | None]]) -> None:
        """``run_in_turn(runs)``, whose last stages are the LM head's. A head program read ahead from the cache that
        failed to compile raises its error here (before any stage runs), and the decode stages are bound again to a
        new build of the head, so the next call works instead of raising it for good."""
        try:
            run_in_turn(runs)
        except Exception:
            if any(stage.compiled.failed for stage in self._heads):
                self.decode_plan.rebuild_failed_heads()
                self._bind_decode(self._bound_bucket, bool(self._layers))
            raise

    def _read_logits(self, lanes: list[int]) -> dict[int, np.ndarray]:
        """Logits at each of ``lanes`` (ascending) of the decode chain's last output ``x``: from the LM head programs'
        outputs (they have run on it), or by the CPU head."""
        if self.options.lm_head == "cpu":
            return {b: self.cpu_logits(self._layers[-1].output("x")[0, :, 0, b]) for b in lanes}
        return dict(zip(lanes, kernels.gather_lanes([h.output("logits") for h in self._heads], lanes)))


def _float32(logits: np.ndarray) -> np.ndarray:
    """Logits read from the head's surfaces as a new float32 array (fp16 ones converted by the CPU's
    conversion instructions: numpy's astype takes 75 us for GPT-2's 50257, a step's 1%)."""
    return kernels.half_to_float(logits) if logits.dtype == np.float16 else logits.astype(np.float32)


def _residual_lanes(stage: Stage, lanes: int | list[int]) -> np.ndarray:
    """The residual stream ``x`` a stage outputs, ``[channels, lanes]``: its first ``lanes`` lanes or the lanes listed."""
    out = stage.output("x")[0, :, 0]
    if isinstance(lanes, int):
        return out[:, :lanes]
    if lanes == list(range(lanes[0], lanes[0] + len(lanes))):  # consecutive lanes: a view, not a fancy-indexed copy
        return out[:, lanes[0]:lanes[-1] + 1]
    return out[:, lanes]


def _check_finite(stage: Stage, layers: range, lanes: int | list[int], where: str) -> None:
    """Raise :class:`ActivationOverflow` naming ``layers`` when the residual stream ``x`` they output is not finite
    in its first ``lanes`` lanes (or in the lanes listed): an fp16 overflow (inf, or NaN after it) in those layers."""
    x = _residual_lanes(stage, lanes)
    if np.isfinite(x).all():
        return
    bad = np.flatnonzero(~np.isfinite(x).all(axis=0))
    named = f"layer {layers.start}" if len(layers) == 1 else \
        f"one of layers {layers.start}-{layers.stop - 1} (one program; fusion_depth=1 names the layer)"
    raise ActivationOverflow(
        f"{named} overflowed fp16 (|x| > 65504 turned to inf/NaN) for the {where} (lane {int(bad[0])}): the model's "
        f"residual stream outgrows fp16. Fix: a family that can rescale it exactly takes a larger residual_scale "
        f"(Gemma: a power of two, e.g. residual_scale=8); else check the weights or compare with lm_head='cpu'")


def _write_past(stage: Stage, layers: range, cache: KVCache, lane: int, n: int, held: int = 0) -> None:
    """The first ``n`` positions of ``lane``'s cache into a prompt-chunk stage's cache inputs (full-context
    tensors ``[1, width, 1, context]``), the others masked (their stale values stay finite: never NaN); the
    first ``held`` are there already (``KVCache.copied``)."""
    mask = stage.input("mask")[0, 0, 0]
    mask[:n] = 0.0
    mask[n:] = MASKED
    for i in layers:
        stage.input(f"k{i}")[0, :, 0, held:n] = cache.keys[i][lane, :, held:n]
        stage.input(f"v{i}")[0, :, 0, held:n] = cache.values[i][lane, :, held:n]


def _write_lanes(stages: list[Stage], values: dict[str, np.ndarray], first: int = 0) -> None:
    """``values[name]`` ([channels, n]) into lanes ``first..first+n-1`` of input ``name`` of each stage that has it."""
    for stage in stages:
        for name, value in values.items():
            if name in stage.mil_name:
                stage.input(name)[0, :, 0, first:first + value.shape[1]] = value


@dataclass
class _BoundStages:
    """One object's stages bound to a program set it is not running now (``CausalLM.use_programs``)."""

    layers: list[Stage]
    heads: list[Stage]
    prefill: dict[PrefillKey, tuple[list[Stage], list[Stage]]]
    bucket: int


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
