"""Building a model's programs: lowered programs from the on-disk cache when there, compiled once
per process, shown as one progress line, with a fallback to shallower fusion when a compile fails."""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from orion._core import kernels
from orion.compiler import CompiledGraph, CompilingGraph, Lowered
from orion.errors import CompileBudgetExhausted, CompileError, ConstraintError
from orion.graph import Graph
from orion.passes.sram import SRAMBudgetWarning
from orion.program_cache import compile_cached, lower_cached
from orion.progress import ProgressLine, warn_user

T = TypeVar("T")


_COMPILE_THREAD: list[ThreadPoolExecutor] = []


def _compile_thread() -> ThreadPoolExecutor:
    """The one thread that compiles programs while the builders read the next ones (created on first use; a forked
    child, which does not have its parent's, makes its own)."""
    if not _COMPILE_THREAD:
        _COMPILE_THREAD.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="orion-compile"))
    return _COMPILE_THREAD[0]


os.register_at_fork(after_in_child=_COMPILE_THREAD.clear)


def _programs(n: int) -> str:
    return f"{n} program{'' if n == 1 else 's'}"


def program_label(kind: str, params: dict[str, Any]) -> str:
    """A program's name for people: ``decode layers 0-3``, ``lm_head vocab 0-12564, 32 tokens``."""
    parts = []
    for key, value in params.items():
        if isinstance(value, list) and len(value) == 2:
            parts.append(f"{key} {value[0]}-{value[1] - 1}")
        elif key == "seq":
            parts.append(f"{value} tokens")
        else:
            parts.append(f"{key} {value}")
    return f"{kind} {', '.join(parts)}".strip()


class ProgramBuilder:
    """Builds the programs of one model. ``identity`` (JSON-able: model type, config, weights hash)
    goes into every program-cache key, so two models never share an entry by accident.

    ``built``/``cached`` count programs lowered here or read from the cache; ``seconds`` is the total.
    Between ``begin`` and ``end`` the builds show as one progress line, and the SRAM-budget warnings
    of the per-graph compiler become one summary warning (``progress=False`` silences both).
    ``after_lowering`` is called after each graph built here is lowered (e.g. to drop the mapped
    checkpoint pages it read: the program holds the weights now). ``weight_bytes``: the model's weights at
    their stored precision, which bound the weight files the cache's writer holds (``program_cache.queue_bound``)."""

    def __init__(self, identity: dict[str, Any], io_dtype: str = "fp16", progress: bool = True,
                 compile_options: dict[str, Any] | None = None,
                 after_lowering: Callable[[], None] | None = None, weight_bytes: int | None = None) -> None:
        self.identity, self.io_dtype, self.progress = identity, io_dtype, progress
        self.weight_bytes = weight_bytes
        self.compile_options = compile_options or {}  # profile / relaxed_ops for compile_cached (orion.quant)
        self.after_lowering = after_lowering
        self.seconds = 0.0
        self.cached = 0
        self.built = 0
        self.line = ProgressLine(progress)
        self._over_sram: list[str] = []
        self._batch = (0, 0)

    def begin(self, what: str, total: int) -> None:
        """Start a batch of ``total`` builds of ``what`` (e.g. "GPT-2 (124M parameters, 12 layers)"). The idle
        activations of earlier evaluates go back to the OS first (``release_idle_buffers``), so the compiles'
        own heap does not come on top of them (GPT-2 124M's decode buckets after a 1,000-token prompt: +13 MiB
        of peak RSS)."""
        kernels.release_idle_buffers()
        self.what = what
        self._batch = (self.built, self.cached)
        self._over_sram = []
        self.line.start(f"compiling {_programs(total)} for {what}", total)

    def end(self) -> None:
        """The batch's summary line and, if some programs exceed the SRAM, one warning saying so. The heap the
        batch's compiles freed (parsed text, graphs, weight copies) goes back to the OS (``release_idle_buffers``)."""
        kernels.release_idle_buffers()
        built, cached = self.built - self._batch[0], self.cached - self._batch[1]
        self.line.finish(f"compiled {_programs(built + cached)} for {self.what} in {{seconds}} "
                         f"({built} built, {cached} loaded from cache)")
        if self._over_sram and self.progress:
            warn_user(f"{len(self._over_sram)} of {built + cached} programs for {self.what} exceed the ANE's "
                      f"on-chip SRAM (ANE-26: they run, ~30% slower), e.g. {self._over_sram[0]}; a smaller "
                      f"fusion_depth splits decode programs (orion.compile_graph shows a graph's own report)",
                      SRAMBudgetWarning)
        self._over_sram = []

    def build(self, kind: str, graph: Callable[[], Graph], max_layers: int = 1, **params: Any) -> CompiledGraph:
        """The compiled program of ``graph()`` (called only on a cache miss); ``kind`` and ``params``
        (JSON-able) name it in the cache key and in the progress line."""
        return self.build_all(kind, [(graph, params)], max_layers)[0]

    def build_all(self, kind: str, graphs: Iterable[tuple[Callable[[], Graph], dict[str, Any]]],
                  max_layers: int = 1, ahead: bool = False) -> list[CompiledGraph]:
        """``build(kind, graph, max_layers, **params)`` for each ``(graph, params)``, in order. A program read
        from the cache compiles on the compile thread while the next one is read (the compile releases the GIL):
        a warm start's reads and compiles overlap. One lowered here holds its weights in memory until compiled,
        so it compiles before the next is lowered, as alone. ``ahead``: return once every program is read or
        built; those read from the cache are :class:`CompilingGraph` s still compiling, in order, while the
        caller binds and runs the first ones (a warm start's first prefill runs its layers as they compile)."""
        start, counts = time.perf_counter(), (self.built, self.cached)
        pending: list[Future[CompiledGraph]] = []
        compiling: list[CompiledGraph] = []
        try:
            for graph, params in graphs:
                label = program_label(kind, params)
                lowered, was_cached = self._lower(kind, graph, max_layers, params, label)
                self.cached += was_cached
                self.built += not was_cached
                shown = f"{label}{' (loaded from cache)' if was_cached else ''}"
                pending.append(_compile_thread().submit(self._compile, lowered, shown, not (ahead and was_cached)))
                if ahead:
                    compiling.append(CompilingGraph(lowered.without_weights(), pending[-1]))
                if not was_cached:
                    pending[-1].result()
            return compiling if ahead else [future.result() for future in pending]
        except BaseException:
            self.built, self.cached = counts  # (a batch retried at a shallower fusion counts its programs once)
            raise
        finally:
            if not ahead:
                wait(pending)  # none left compiling (the compile budget counts it) when one failed
            self.seconds += time.perf_counter() - start

    def _lower(self, kind: str, graph: Callable[[], Graph], max_layers: int, params: dict[str, Any],
               label: str) -> tuple[Lowered, bool]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lowered, was_cached = lower_cached({**self.identity, "kind": kind, **params}, graph, wait=False,
                                               weight_bytes=self.weight_bytes, io_dtype=self.io_dtype,
                                               max_layers=max_layers)
        if not was_cached and self.after_lowering is not None:
            self.after_lowering()
        for w in caught:
            if issubclass(w.category, SRAMBudgetWarning):
                self._over_sram.append(label)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return lowered, was_cached

    def _compile(self, lowered: Lowered, label: str, show: bool) -> CompiledGraph:
        # Nothing patches these programs' weights: the lowered copy goes (with no program cache, bytes in memory).
        compiled = CompiledGraph(lowered.without_weights(), compile_cached(lowered, **self.compile_options).program)
        if show:  # (not for a program read ahead, whose compile may end after its batch's line)
            self.line.step(label)
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
                    print(f"\rfusion depth {depth} failed to compile ({err}); retrying with {depth // 2}",
                          file=sys.stderr, flush=True)
                depth //= 2
