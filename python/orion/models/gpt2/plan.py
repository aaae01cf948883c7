"""The execution plan of GPT-2: which layers share a program, where the LM head runs, and the
compiled programs with their surfaces.

Decode runs ``ceil(n_layer / fusion_depth)`` layer programs and, with the LM head on the ANE,
``lm_head_chunks`` vocabulary chunks: that is the number of dispatches per token. The default fusion
depth is the largest that keeps a program's weights inside the ~32 MB SRAM budget; when a compile
fails at some depth, the plan falls back to shallower fusion (FACTS: the fusion limit is unknown).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from orion.compiler import CompiledGraph, compile_lowered
from orion.errors import CompileBudgetExhausted, CompileError, ConstraintError
from orion.graph import Graph
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.graphs import decode_graph, lm_head_graph, prefill_graph
from orion.models.gpt2.weights import GPT2Weights
from orion.program_cache import lower_cached
from orion.runtime.dtypes import mil_dtype
from orion.runtime.program import TensorSpec
from orion.limits import MIN_SURFACE_BYTES, SRAM_BYTES
from orion.runtime.surface import Surface

LM_HEAD_PLACEMENTS = ("ane", "cpu")
SRAM_SHARE = 0.75  # keep each program's weights under 3/4 of the SRAM, leaving room for activations


@dataclass(frozen=True)
class PlanOptions:
    """Choices of the plan. ``fusion_depth=None`` picks the deepest that fits the SRAM budget."""

    fusion_depth: int | None = None
    lm_head: str = "ane"
    io_dtype: str = "fp16"

    def __post_init__(self) -> None:
        if self.lm_head not in LM_HEAD_PLACEMENTS:
            raise ValueError(f"lm_head={self.lm_head!r}: use one of {LM_HEAD_PLACEMENTS}")
        if self.fusion_depth is not None and self.fusion_depth < 1:
            raise ValueError(f"fusion_depth={self.fusion_depth}: use a positive number of layers (or None)")


@dataclass(frozen=True)
class ProgramInfo:
    """Per-token cost of one decode program (for the ANE cost model)."""

    name: str
    flops_per_token: float
    bytes_per_token: float


def packed_view(surface: Surface, shape: tuple[int, ...]) -> np.ndarray:
    """The tensor of ``shape`` packed at the front of ``surface`` (a writable view)."""
    return surface.array.reshape(-1)[: int(np.prod(shape))].reshape(shape)


class Stage:
    """One compiled program with its surfaces, addressed by the graph's own I/O names."""

    def __init__(self, compiled: CompiledGraph, shared: Mapping[str, Surface] | None = None) -> None:
        """``shared`` gives surfaces owned elsewhere (the KV cache, the residual-stream chain), by
        input name, or ``"out:<name>"`` for an output; the stage allocates the others."""
        self.compiled = compiled
        self.program = compiled.program
        self.mil_name = {s.name: s.mil_name for s in compiled.layout.inputs}
        self.mil_out = {s.name: s.mil_name for s in compiled.layout.outputs}
        self.in_shape = {s.name: s.shape for s in compiled.layout.inputs}
        self.out_shape = {s.name: s.shape for s in compiled.layout.outputs}
        shared = dict(shared or {})
        self.inputs = self._fill(self.mil_name, self.program.inputs,
                                 {n: s for n, s in shared.items() if not n.startswith("out:")})
        self.outputs = self._fill(self.mil_out, self.program.outputs,
                                  {n[4:]: s for n, s in shared.items() if n.startswith("out:")})
        self._bound = self.program.bind({self.mil_name[n]: s for n, s in self.inputs.items()},
                                        {self.mil_out[n]: s for n, s in self.outputs.items()})

    @staticmethod
    def _fill(mil_names: Mapping[str, str], specs: Mapping[str, TensorSpec],
              given: Mapping[str, Surface]) -> dict[str, Surface]:
        """Given surfaces where there are, new ones elsewhere, all of one size (ANE-13)."""
        size = max([MIN_SURFACE_BYTES] + [int(np.prod(s.shape)) * s.dtype.itemsize for s in specs.values()]
                   + [s.nbytes for s in given.values()])
        return {name: given.get(name) or Surface(specs[m].shape, mil_dtype(specs[m].dtype), size)
                for name, m in mil_names.items()}

    def input(self, name: str) -> np.ndarray:
        """A writable view of input ``name`` in the graph's shape."""
        return packed_view(self.inputs[name], self.in_shape[name])

    def run(self, live_lanes: Mapping[str, int] | None = None) -> None:
        """Evaluates the program once; ``live_lanes`` by graph input name (see ``Program.evaluate``)."""
        self._bound({self.mil_name[n]: v for n, v in live_lanes.items()} if live_lanes else None)

    def output(self, name: str) -> np.ndarray:
        """A view of output ``name`` in the graph's shape (padded surfaces hold it packed at the front)."""
        return packed_view(self.outputs[name], self.out_shape[name])


def default_fusion_depth(config: GPT2Config, budget: int = SRAM_BYTES) -> int:
    """The most layers whose fp16 weights fit ``SRAM_SHARE`` of the SRAM budget (at least one)."""
    c = config.n_embd
    layer_bytes = 2 * (12 * c * c + 13 * c)
    return max(1, min(config.n_layer, int(budget * SRAM_SHARE // layer_bytes)))


def lm_head_chunks(config: GPT2Config, budget: int = SRAM_BYTES) -> list[range]:
    """Vocabulary chunks whose fp16 weights each fit ``SRAM_SHARE`` of the SRAM budget."""
    per_row = 2 * config.n_embd
    n = max(1, math.ceil(config.vocab_size * per_row / (budget * SRAM_SHARE)))
    bounds = np.linspace(0, config.vocab_size, n + 1).round().astype(int)
    return [range(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


class Compiler:
    """Builds (or reads from the program cache) and compiles the plan's programs, with progress."""

    def __init__(self, config: GPT2Config, weights: GPT2Weights, weights_hash: str, io_dtype: str,
                 progress: bool) -> None:
        self.config, self.weights, self.weights_hash = config, weights, weights_hash
        self.io_dtype, self.progress = io_dtype, progress
        self.seconds = 0.0
        self.cached = 0
        self.built = 0

    def compile(self, kind: str, build: Callable[[], Graph], max_layers: int = 1, **params: object) -> CompiledGraph:
        start = time.perf_counter()
        description = {"model": "gpt2", "config": self.config.to_hf_json(), "weights": self.weights_hash,
                       "kind": kind, **params}
        lowered, was_cached = lower_cached(description, build, io_dtype=self.io_dtype, max_layers=max_layers)
        compiled = compile_lowered(lowered)
        elapsed = time.perf_counter() - start
        self.seconds += elapsed
        self.cached += was_cached
        self.built += not was_cached
        if self.progress:
            detail = ", ".join(f"{k}={v}" for k, v in params.items())
            print(f"  compiled {kind}({detail}) in {elapsed * 1e3:.0f} ms{' (cached)' if was_cached else ''}",
                  file=sys.stderr, flush=True)
        return compiled


@dataclass
class DecodePlan:
    """The compiled decode programs and what one token costs."""

    options: PlanOptions
    fusion_depth: int
    layer_ranges: list[range]
    layer_programs: list[CompiledGraph]
    head_ranges: list[range]
    head_programs: list[CompiledGraph]  # empty when the LM head runs on the CPU
    programs: list[ProgramInfo]

    @property
    def dispatches_per_token(self) -> int:
        return len(self.layer_programs) + len(self.head_programs)

    def bind(self, shared: Mapping[str, Surface]) -> tuple[list[Stage], list[Stage]]:
        """Layer and LM-head stages bound to ``shared`` (KV cache and mask surfaces by graph name, all
        of one size, which the residual-stream surfaces take too)."""
        nbytes = shared["mask"].nbytes
        # The residual stream flows through one chain of surfaces: stage i's x output is stage i+1's x input.
        first = self.layer_programs[0]
        x_spec = first.program.inputs[first.layout.inputs[0].mil_name]
        x = [Surface(x_spec.shape, self.options.io_dtype, nbytes) for _ in range(len(self.layer_programs) + 1)]
        layers = []
        for i, (cg, r) in enumerate(zip(self.layer_programs, self.layer_ranges)):
            own = {"x": x[i], "out:x": x[i + 1], "mask": shared["mask"]}
            own.update({name: shared[name] for j in r for name in (f"k{j}", f"v{j}")})
            layers.append(Stage(cg, own))
        return layers, [Stage(cg, {"x": x[-1]}) for cg in self.head_programs]


def compile_with_fallback(depth: int, compile_depth: Callable[[int], list[CompiledGraph]],
                          progress: bool) -> tuple[int, list[CompiledGraph]]:
    """``compile_depth(depth)``, retried at half the depth while compiles fail (down to 1 layer)."""
    while True:
        try:
            return depth, compile_depth(depth)
        except (CompileBudgetExhausted, ConstraintError):
            raise
        except CompileError as err:
            if depth == 1:
                raise
            if progress:
                print(f"  fusion depth {depth} failed to compile ({err}); retrying with {depth // 2}",
                      file=sys.stderr, flush=True)
            depth //= 2


def decode_program_costs(config: GPT2Config, layer_ranges: list[range], head_ranges: list[range],
                         lm_head: str) -> list[ProgramInfo]:
    """FLOPs and bytes moved per token of each decode program (weights fp16, full-context caches)."""
    c, t = config.n_embd, config.n_positions
    infos = []
    for r in layer_ranges:
        n = len(r)
        weights = n * (12 * c * c + 13 * c)
        flops = n * (2 * 12 * c * c + 2 * 2 * c * t)  # projections + scores and weighted values
        io = 2 * (c * 32 * 3 * n + n * 2 * c * t + t)  # x/k/v surfaces, both caches, mask (fp16)
        infos.append(ProgramInfo(f"layers {r.start}-{r.stop - 1}", flops, 2 * weights + io))
    if lm_head == "ane":
        for r in head_ranges:
            v = len(r)
            infos.append(ProgramInfo(f"lm_head {r.start}-{r.stop - 1}", 2 * v * c, 2 * (v * c + c * 32 + v * 32)))
    return infos


def build_decode_plan(compiler: Compiler, options: PlanOptions) -> DecodePlan:
    """Compiles the decode programs (falling back to shallower fusion when a compile fails)."""
    config, weights = compiler.config, compiler.weights
    n = config.n_layer

    def compile_depth(depth: int) -> list[CompiledGraph]:
        return [compiler.compile("decode", lambda r=r: decode_graph(config, weights, r), max_layers=depth,
                                 layers=[r.start, r.stop])
                for r in (range(i, min(i + depth, n)) for i in range(0, n, depth))]

    depth, layers = compile_with_fallback(options.fusion_depth or default_fusion_depth(config), compile_depth,
                                          compiler.progress)
    ranges = [range(i, min(i + depth, n)) for i in range(0, n, depth)]
    head_ranges = lm_head_chunks(config)
    heads = []
    if options.lm_head == "ane":
        heads = [compiler.compile("lm_head", lambda r=r: lm_head_graph(config, weights, r, 1), vocab=[r.start, r.stop],
                                  seq=1) for r in head_ranges]
    costs = decode_program_costs(config, ranges, head_ranges, options.lm_head)
    return DecodePlan(options, depth, ranges, layers, head_ranges, heads, costs)


@dataclass
class PrefillPlan:
    """The compiled prefill programs of one bucket (sequence length)."""

    seq: int
    layer_stages: list[Stage]
    layer_ranges: list[range]
    head_stages: list[Stage]


def build_prefill_plan(compiler: Compiler, depth: int, seq: int, with_head: bool) -> PrefillPlan:
    """Compiles the layer programs for ``seq`` tokens (and the LM head over all of them when asked)."""
    config, weights = compiler.config, compiler.weights
    n = config.n_layer
    ranges = [range(i, min(i + depth, n)) for i in range(0, n, depth)]
    compiled = [compiler.compile("prefill", lambda r=r: prefill_graph(config, weights, r, seq), max_layers=depth,
                                 layers=[r.start, r.stop], seq=seq) for r in ranges]
    x_spec = compiled[0].program.inputs[compiled[0].layout.inputs[0].mil_name]
    nbytes = max(MIN_SURFACE_BYTES, int(np.prod(x_spec.shape)) * x_spec.dtype.itemsize)
    x = [Surface(x_spec.shape, compiler.io_dtype, nbytes) for _ in range(len(compiled) + 1)]
    stages = [Stage(cg, {"x": x[i], "out:x": x[i + 1]}) for i, cg in enumerate(compiled)]
    heads = []
    if with_head:
        for r in lm_head_chunks(config):
            cg = compiler.compile("lm_head", lambda r=r: lm_head_graph(config, weights, r, seq), vocab=[r.start, r.stop],
                                  seq=seq)
            heads.append(Stage(cg, {"x": x[-1]}))
    return PrefillPlan(seq, stages, ranges, heads)
