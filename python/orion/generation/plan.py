"""The execution plan of a decoder-only model: which layers share a program, where the LM head
runs, and the compiled programs bound to their surfaces.

Decode runs ``ceil(n_layer / fusion_depth)`` layer programs and, with the LM head on the ANE, one
program per vocabulary chunk: that is the number of dispatches per token. The default fusion depth
is the largest that keeps a program's weights inside ``SRAM_SHARE`` of the SRAM; when a compile
fails at some depth, the plan falls back to shallower fusion (the hardware's fusion limit is not
known). The residual stream ``x`` flows from each layer program to the next through one chain of
surfaces; the KV cache lives in the decode programs' own ``k<i>``/``v<i>`` inputs (``KVCache.attach``). The
layer programs exist per KV-cache length (``kv_cache.context_buckets``): the shortest is built with
the plan, a longer one the first time a cache grows to it (``DecodePlan.layers_at``). At one layer per program
(no shallower fusion to fall back to, so the depth is settled without compiling) the shortest waits too, for the
first decode step or ``CausalLM.prepare``: a model's first token comes from a prefill and its LM head, and
a warm start of Qwen2.5-0.5B (24 decode layer programs) spent ~0.3 s of its 1.8 s reading them first.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from orion.compiler import CompiledGraph
from orion.errors import OrionError
from orion.graph import Graph
from orion.limits import MIN_LANES, MIN_SURFACE_BYTES, SRAM_BYTES
from orion.runtime.builder import ProgramBuilder
from orion.runtime.dtypes import numpy_dtype
from orion.runtime.stage import Stage
from orion.runtime.surface import Surface

LM_HEAD_PLACEMENTS = ("ane", "cpu")
DEFAULT_PREFILL_CHUNK = 1024  # the largest prefill bucket; longer prompts run in chunks of it. Not smaller:
# a chunk program's attention over the cache is unfused (GPT-2 124M, 1000 tokens in chunks of 512: 1.1-1.4x the
# time of the 1024 bucket, whose attention is the fused causal kernel)
SRAM_SHARE = 0.75  # keep each program's weights under 3/4 of the SRAM, leaving room for activations


class PlanError(OrionError, ValueError):
    """A plan option makes no sense."""


@dataclass(frozen=True)
class PlanOptions:
    """Choices of the plan. ``fusion_depth=None`` picks the deepest that fits the SRAM budget."""

    fusion_depth: int | None = None
    lm_head: str = "ane"
    io_dtype: str = "fp16"
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    lanes: int = 1  # sequences one decode step advances (``CausalLM.with_lanes``)
    # The lanes of the packed prefill programs, which read several whole prompts joining a batch in one pass
    # (``CausalLM._read_packed``); at most ``prefill_chunk`` (``packed_chunk``).
    join_chunk: int = 128
    # The chunk-program bucket of up to this many appended tokens (speculative checks: a token and its drafts).
    # Not the 32-lane minimum of prompts: the emulator computes a chunk program's short rows whole, so a 4-token
    # check in the 32-token bucket cost SmolLM2-135M 3.4 decode steps, in this one 2.5 (7 drafts), 2.1 (3) before
    # the fused chunk attention, 1.6, 1.5 and 1.45 (1 draft) with it; a 16-token bucket 2.6 (15 drafts), 1.8 (7).
    draft_chunk: int = 8

    def __post_init__(self) -> None:
        if self.lm_head not in LM_HEAD_PLACEMENTS:
            raise PlanError(f"lm_head={self.lm_head!r}: use one of {LM_HEAD_PLACEMENTS}")
        if isinstance(self.lanes, bool) or not isinstance(self.lanes, int) or self.lanes < 1:
            raise PlanError(f"lanes={self.lanes!r}: use a positive number of sequences per decode step")
        if self.fusion_depth is not None and self.fusion_depth < 1:
            raise PlanError(f"fusion_depth={self.fusion_depth}: use a positive number of layers (or None)")
        draft = self.draft_chunk
        if isinstance(draft, bool) or not isinstance(draft, int) or draft < 1 or draft & (draft - 1):
            raise PlanError(f"draft_chunk={draft!r}: use a power of two (the chunk bucket of speculative checks)")
        join = self.join_chunk
        if isinstance(join, bool) or not isinstance(join, int) or join < MIN_LANES[self.io_dtype] or join & (join - 1):
            raise PlanError(f"join_chunk={join!r}: use a power of two of at least {MIN_LANES[self.io_dtype]} tokens "
                            f"(the lanes of the packed prefill of prompts joining a batch)")
        chunk = self.prefill_chunk
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < MIN_LANES[self.io_dtype] \
                or chunk & (chunk - 1):
            raise PlanError(f"prefill_chunk={chunk!r}: use a power of two of at least {MIN_LANES[self.io_dtype]} "
                            f"tokens (the largest prefill bucket; longer prompts run in chunks of it)")

    @property
    def packed_chunk(self) -> int:
        """The lanes of the packed prefill programs: ``join_chunk``, at most ``prefill_chunk``."""
        return min(self.join_chunk, self.prefill_chunk)

    def prefill_pieces(self, n: int) -> list[tuple[int, int, int]]:
        """How a prompt of ``n`` tokens runs: ``(start, tokens, bucket)`` per program run. Up to
        ``prefill_chunk`` tokens: one run in the smallest power-of-two bucket that holds them (ANE-08);
        beyond, chunks of ``prefill_chunk`` tokens, each after the first attending to the cache so far."""
        if n <= self.prefill_chunk:
            return [(0, n, max(MIN_LANES[self.io_dtype], 1 << (n - 1).bit_length()))]
        return [(start, min(self.prefill_chunk, n - start), self.prefill_chunk)
                for start in range(0, n, self.prefill_chunk)]

    def extend_pieces(self, start: int, n: int) -> list[tuple[int, int, int]]:
        """How ``n`` tokens appended after ``start`` cached positions run (a reused prefix's rest, speculative
        drafts): ``(start, tokens, bucket)`` per run of the chunk programs, which attend to the cache; pieces
        of at most ``prefill_chunk`` tokens, each in the smallest power-of-two bucket that holds it: the
        ``draft_chunk`` bucket for up to that many tokens, else one of at least the prompts' 32 lanes."""
        least = MIN_LANES[self.io_dtype]
        pieces = []
        for s in range(start, start + n, self.prefill_chunk):
            size = min(self.prefill_chunk, start + n - s)
            pieces.append((s, size, self.draft_chunk if size <= self.draft_chunk
                           else max(least, 1 << (size - 1).bit_length())))
        return pieces


@dataclass(frozen=True)
class ProgramInfo:
    """Per-token cost of one decode program (for the ANE cost model)."""

    name: str
    flops_per_token: float
    bytes_per_token: float


def layer_ranges(n_layer: int, depth: int) -> list[range]:
    """Consecutive groups of ``depth`` layers (the last may be shorter)."""
    return [range(i, min(i + depth, n_layer)) for i in range(0, n_layer, depth)]


def sram_fusion_depth(n_layer: int, layer_weight_bytes: int, budget: int = SRAM_BYTES) -> int:
    """The most layers whose weights fit ``SRAM_SHARE`` of the SRAM budget (at least one)."""
    return max(1, min(n_layer, int(budget * SRAM_SHARE // layer_weight_bytes)))


def vocab_chunks(vocab_size: int, hidden: int, budget: int = SRAM_BYTES) -> list[range]:
    """Vocabulary chunks whose fp16 LM-head rows (``hidden`` values each) fit ``SRAM_SHARE`` of the SRAM."""
    n = max(1, math.ceil(vocab_size * 2 * hidden / (budget * SRAM_SHARE)))
    bounds = np.linspace(0, vocab_size, n + 1).round().astype(int)
    return [range(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


@dataclass
class DecodePlan:
    """The compiled decode programs and what one token costs. ``layers_by_context``: the layer
    programs by the KV-cache length they read (those built so far; none yet when the shortest was deferred);
    ``build_layers`` compiles them for another length (with ``builder``); ``shortest``: the shortest length."""

    options: PlanOptions
    fusion_depth: int
    layer_ranges: list[range]
    head_ranges: list[range]
    head_programs: list[CompiledGraph]  # empty when the LM head runs on the CPU
    programs: list[ProgramInfo]
    builder: ProgramBuilder
    build_layers: Callable[[int], list[CompiledGraph]]
    shortest: int
    layers_by_context: dict[int, list[CompiledGraph]] = field(default_factory=dict)
    compile_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # the model's (forks share it)
    build_heads: Callable[[], list[CompiledGraph]] = field(default=list, repr=False)  # builds head_programs again

    @property
    def dispatches_per_token(self) -> int:
        return len(self.layer_ranges) + len(self.head_programs)

    @property
    def layer_programs(self) -> list[CompiledGraph]:
        """The layer programs of the shortest KV-cache length built (the shortest, compiled now if none is)."""
        return self.layers_at(min(self.layers_by_context, default=self.shortest))

    def layers_at(self, context: int) -> list[CompiledGraph]:
        """The layer programs reading a KV cache of ``context`` positions, compiled on first use (forks
        share the plan: one thread compiles, the others wait)."""
        with self.compile_lock:
            if context not in self.layers_by_context:
                self.builder.begin(f"decode with a KV cache of {context} positions", len(self.layer_ranges))
                self.layers_by_context[context] = self.build_layers(context)
                self.builder.end()
            return self.layers_by_context[context]

    def rebuild_failed_heads(self) -> None:
        """Builds the LM-head programs again when one read ahead from the cache failed to compile (its error was
        raised where it first ran; ``CompilingGraph.failed``), for the stages bound next."""
        with self.compile_lock:
            if any(p.failed for p in self.head_programs):
                self.head_programs = self.build_heads()

    def bind(self, context: int) -> tuple[list[Stage], list[Stage]]:
        """Layer and LM-head stages for a KV cache of ``context`` positions, on new surfaces (the KV cache
        lives in the layer stages' inputs, ``KVCache.attach``), the residual stream chained between them."""
        return _bind(self.layers_at(context), self.head_programs, self.options.io_dtype)

    def bind_heads(self) -> list[Stage]:
        """LM-head stages on new surfaces, without layer stages (none before the layers are compiled): a
        prompt's last position is written into their input ``x``."""
        return _bind([], self.head_programs, self.options.io_dtype)[1] if self.head_programs else []


# A prefill plan's (bucket, with the LM head, KV-cache length of a chunk plan or 0, packed prompts)
PrefillKey = tuple[int, bool, int, bool]


@dataclass
class PrefillPlan:
    """The compiled prefill programs of one bucket (sequence length ``seq``); with ``past``, the chunk
    programs of longer prompts, which read the KV cache filled so far."""

    seq: int
    layer_ranges: list[range]
    layer_programs: list[CompiledGraph]
    head_programs: list[CompiledGraph]  # empty unless the plan computes every position's logits
    past: bool = False

    @property
    def failed(self) -> bool:
        """Whether a program read ahead from the cache failed to compile (``CompilingGraph.failed``): built again
        on next use instead of raising that error at every prompt."""
        return any(p.failed for p in (*self.layer_programs, *self.head_programs))

    def bind(self, io_dtype: str) -> tuple[list[Stage], list[Stage]]:
        """Layer and LM-head stages on new surfaces, the residual stream chained between them (a ``past``
        plan's cache inputs are the stages' own: the loop copies the filled positions in). The layer stages share
        their other outputs' surfaces too (the loop copies each stage's keys and values out before the next runs)."""
        return _bind(self.layer_programs, self.head_programs, io_dtype, share_outputs=True)


def _bind(programs: list[CompiledGraph], heads: list[CompiledGraph], io_dtype: str,
          share_outputs: bool = False) -> tuple[list[Stage], list[Stage]]:
    """Stages of ``programs`` (layers) and ``heads``, the residual stream ``x`` chained through two surfaces that
    take turns (the programs run one after the other), of the size of every program's largest input (one size
    for all inputs of a program, ANE-13). ``share_outputs``: the layer stages' other output surfaces (a prefill's
    keys and values, each in a surface of its own or packed together, ANE-37; read out after each stage) are
    shared, one per place and shape."""
    nbytes = max(MIN_SURFACE_BYTES, largest_surface([*programs, *heads]))
    shape = _surface_shape([*programs, *heads])
    x = [Surface(shape, io_dtype, nbytes) for _ in range(2)]
    outputs: dict[tuple[int, tuple[int, ...], str], Surface] = {}
    layers = []
    for i, cg in enumerate(programs):
        given = {"x": x[i % 2], "out:x": x[(i + 1) % 2]}
        x_surface = next(s.surface_name for s in cg.layout.outputs if s.name == "x")
        others = [(name, surface) for name, surface in cg.surfaces("outputs").items()
                  if name != x_surface] if share_outputs else []
        surfaces = {}
        for place, (name, (shape, dtype)) in enumerate(others):
            surfaces[name] = outputs.setdefault((place, tuple(shape), dtype), Surface(shape, dtype, nbytes))
        layers.append(Stage(cg, given, surfaces))
    return layers, [Stage(cg, {"x": x[len(programs) % 2]}) for cg in heads]


def _surface_shape(programs: list[CompiledGraph]) -> tuple[int, ...]:
    """The shape of the surfaces chaining the residual stream ``x`` through ``programs`` (layers, then LM
    heads): the surface shape of ``x`` where a program gives it a surface of its own, else its tensor's
    (stages copy it in and out of their packed surfaces, ANE-37)."""
    specs = [s for cg in programs for s in (*cg.layout.outputs, *cg.layout.inputs) if s.name == "x"]
    return next((s.padded for s in specs if not s.surface), specs[0].shape)


def largest_surface(programs: list[CompiledGraph]) -> int:
    """Bytes of the largest input or output surface of ``programs`` (``CompiledGraph.surfaces``: a program still
    compiling has them too)."""
    return max(int(np.prod(shape)) * numpy_dtype(dtype).itemsize for cg in programs
               for side in ("inputs", "outputs") for shape, dtype in cg.surfaces(side).values())


def build_decode_plan(builder: ProgramBuilder, options: PlanOptions, n_layer: int, default_depth: int,
                      head_ranges: list[range], decode_graph: Callable[[range, int], Graph],
                      lm_head_graph: Callable[[range, int], Graph],
                      costs: Callable[[list[range], list[range], str], list[ProgramInfo]], context: int,
                      compile_lock: threading.Lock) -> DecodePlan:
    """Compiles the decode programs, the layers' for a KV cache of ``context`` positions (falling back to
    shallower fusion when a compile fails; at depth 1, which has no fallback, they wait for their first use,
    ``DecodePlan.layers_at``); ``decode_graph(layers, context)``. ``compile_lock`` guards the later compiles
    (of other cache lengths) that share the builder."""

    def build_depth(depth: int) -> list[CompiledGraph]:
        return _decode_layers(builder, layer_ranges(n_layer, depth), depth, decode_graph, context, options.lanes)

    depth = options.fusion_depth or default_depth
    built: dict[int, list[CompiledGraph]] = {}
    if depth > 1:
        depth, built[context] = builder.with_fallback(depth, build_depth)
    ranges = layer_ranges(n_layer, depth)

    def build_heads() -> list[CompiledGraph]:
        return builder.build_all("lm_head", [(lambda r=r: lm_head_graph(r, options.lanes),
                                              {"vocab": [r.start, r.stop], "seq": options.lanes}) for r in head_ranges],
                                 ahead=True) if options.lm_head == "ane" else []

    return DecodePlan(options, depth, ranges, head_ranges, build_heads(), costs(ranges, head_ranges, options.lm_head),
                      builder, _layer_builder(builder, ranges, depth, decode_graph, options.lanes), context, built,
                      compile_lock, build_heads)


@dataclass(eq=False)
class ProgramSet:
    """The compiled programs a model runs, shared by its forks: the builder that compiles more of them, the
    decode plan and the prefill plans by :data:`PrefillKey`; ``adapters``: the LoRA site ranks its
    layer graphs take (None: the base graphs). Compared by identity."""

    builder: ProgramBuilder
    decode_plan: DecodePlan
    prefill_plans: dict[PrefillKey, PrefillPlan] = field(default_factory=dict)
    adapters: dict[str, int] | None = None


def rebuild_decode_layers(builder: ProgramBuilder, base: DecodePlan,
                          decode_graph: Callable[[range, int], Graph]) -> DecodePlan:
    """``base`` with its layer programs built from ``decode_graph`` at the same fusion (a program variant of
    the same layers, e.g. with LoRA inputs), for ``base``'s shortest KV-cache length (others when first
    used); the LM-head programs are ``base``'s own."""
    build = _layer_builder(builder, base.layer_ranges, base.fusion_depth, decode_graph, base.options.lanes)
    return replace(base, builder=builder, build_layers=build, layers_by_context={base.shortest: build(base.shortest)})


def _layer_builder(builder: ProgramBuilder, ranges: list[range], depth: int,
                   decode_graph: Callable[[range, int], Graph], lanes: int) -> Callable[[int], list[CompiledGraph]]:
    return lambda context: _decode_layers(builder, ranges, depth, decode_graph, context, lanes)


def _decode_layers(builder: ProgramBuilder, ranges: list[range], depth: int,
                   decode_graph: Callable[[range, int], Graph], context: int, lanes: int) -> list[CompiledGraph]:
    extra = {"lanes": lanes} if lanes > 1 else {}  # the cache key of single-lane programs is unchanged
    return builder.build_all("decode", [(lambda r=r: decode_graph(r, context),
                                         {"layers": [r.start, r.stop], "context": context, **extra}) for r in ranges],
                             max_layers=depth)


def build_prefill_plan(builder: ProgramBuilder, n_layer: int, depth: int, seq: int, head_ranges: list[range],
                       prefill_graph: Callable[..., Graph], lm_head_graph: Callable[[range, int], Graph],
                       past: int = 0, packed: bool = False) -> PrefillPlan:
    """Compiles the layer programs for ``seq`` tokens (``past``: the chunk programs over a KV cache of
    ``past`` positions, ``prefill_graph(r, seq, past=True, context=past)``; ``packed``: several whole prompts
    on the lanes, ``prefill_graph(r, seq, packed=True)``), and the LM head over all of them when
    ``head_ranges`` is not empty. Those read from the program cache are still compiling when it returns
    (``ProgramBuilder.build_all(..., ahead=True)``): the first prefill binds them and runs each layer as soon
    as its program is compiled."""
    ranges = layer_ranges(n_layer, depth)
    kind, extra = ("prefill_chunk", {"past": True, "context": past}) if past else \
        ("prefill_packed", {"packed": True}) if packed else ("prefill", {})
    layers = builder.build_all(kind, [(lambda r=r: prefill_graph(r, seq, **extra),
                                       {"layers": [r.start, r.stop], "seq": seq, **({"context": past} if past else {})})
                                      for r in ranges], max_layers=depth, ahead=True)
    heads = builder.build_all("lm_head", [(lambda r=r: lm_head_graph(r, seq), {"vocab": [r.start, r.stop], "seq": seq})
                                          for r in head_ranges], ahead=True)
    return PrefillPlan(seq, ranges, layers, heads, bool(past))
