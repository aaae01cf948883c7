"""Building a model's programs: lowered programs from the on-disk cache when there, compiled once
per process, with one progress line each and a fallback to shallower fusion when a compile fails."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from orion.compiler import CompiledGraph, compile_lowered
from orion.errors import CompileBudgetExhausted, CompileError, ConstraintError
from orion.graph import Graph
from orion.program_cache import lower_cached

T = TypeVar("T")


class ProgramBuilder:
    """Builds the programs of one model. ``identity`` (JSON-able: model type, config, weights hash)
    goes into every program-cache key, so two models never share an entry by accident.

    ``built``/``cached`` count programs lowered here or read from the cache; ``seconds`` is the total."""

    def __init__(self, identity: dict[str, Any], io_dtype: str = "fp16", progress: bool = True) -> None:
        self.identity, self.io_dtype, self.progress = identity, io_dtype, progress
        self.seconds = 0.0
        self.cached = 0
        self.built = 0

    def build(self, kind: str, graph: Callable[[], Graph], max_layers: int = 1, **params: Any) -> CompiledGraph:
        """The compiled program of ``graph()`` (called only on a cache miss); ``kind`` and ``params``
        (JSON-able) name it in the cache key and in the progress line."""
        start = time.perf_counter()
        lowered, was_cached = lower_cached({**self.identity, "kind": kind, **params}, graph,
                                           io_dtype=self.io_dtype, max_layers=max_layers)
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

    def with_fallback(self, depth: int, build_depth: Callable[[int], T]) -> tuple[int, T]:
        """``(depth, build_depth(depth))``, retried at half the depth while compiles fail (down to 1).

        Rule violations and an exhausted compile budget are not retried: a shallower program would
        fail the same way."""
        while True:
            try:
                return depth, build_depth(depth)
            except (CompileBudgetExhausted, ConstraintError):
                raise
            except CompileError as err:
                if depth == 1:
                    raise
                if self.progress:
                    print(f"  fusion depth {depth} failed to compile ({err}); retrying with {depth // 2}",
                          file=sys.stderr, flush=True)
                depth //= 2
