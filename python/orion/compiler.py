"""The compiler driver: check -> legalize -> I/O -> optimize (fixed point) -> pack and pad I/O -> analyze
-> emit -> ``orion.compile``.

``lower(graph)`` gives the MIL text and weight files without compiling; ``compile_graph(graph)`` compiles
them (once per content hash in this process, to spare the compile budget, ANE-11) and returns a
:class:`CompiledGraph` that takes and returns unpadded arrays under the graph's own I/O names.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from orion import mil
from orion.emit import FILE_SHA256, Emitter
from orion.errors import EvaluateError
from orion.graph import lineage
from orion.graph.builder import Graph
from orion.legalize import IOLayout, check_fusion_depth, legalize, prepare_io
from orion.limits import MAX_INPUT_SURFACES, MAX_OUTPUT_SURFACES, MIN_SURFACE_BYTES, SRAM_BYTES
from orion.passes import PassContext, PipelineReport, run_pipeline
from orion.runtime.dtypes import mil_dtype
from orion.runtime.packing import copied, copy_into, packed_view
from orion.runtime.pages import release_pages

_NUMPY_DTYPES = {"fp16": np.float16, "fp32": np.float32}
ProgramKey = tuple[str, str, tuple[str, ...], tuple[int, int]]  # content hash, profile, relaxed ops, surface counts
# Compiled programs by content, shared while something holds them: the last holder frees it (a process that loads
# model after model, or a test suite, would otherwise keep every program and its weights).
_PROGRAMS: weakref.WeakValueDictionary[ProgramKey, Any] = weakref.WeakValueDictionary()
_COMPILING: dict[ProgramKey, threading.Lock] = {}  # per key: one thread compiles it
CONSERVATIVE_COUNTS = (MAX_INPUT_SURFACES, MAX_OUTPUT_SURFACES)
_COMPILING_LOCK = threading.Lock()


@dataclass(frozen=True)
class Lowered:
    """Everything lowering produces: MIL text, weight files by path, I/O layout and the pass report.

    ``digests`` (path -> SHA-256 hex of the file) may be given for the files whose digests are known
    already (the program cache's blobs are named by them; a weight file emitted before); the others are
    hashed once, on first use. ``sources``: the :mod:`orion.graph.lineage` key of the values of each weight
    file that has one (what the emitter and the program cache learn about that file is kept under it)."""

    mil: str
    weights: dict[str, bytes]
    layout: IOLayout
    report: PipelineReport | None  # None when read back from the on-disk program cache
    digests: dict[str, str] | None = field(default=None, compare=False, repr=False)
    sources: dict[str, lineage.Key] | None = field(default=None, compare=False, repr=False)

    @cached_property
    def file_digests(self) -> dict[str, str]:
        """A SHA-256 (hex) that names every weight file by path, by its bytes alone: the file's own, computed at
        most once per file (and once per process for a file of values with a lineage key); for a file of
        checkpoint values whose files are hashed already (``lineage.stable``), the hash of where the values come
        from (``program_cache.derived_digest``), so a cold start hashes the checkpoint once, not its weights again."""
        from orion.program_cache import derived_digest

        known, sources, out = self.digests or {}, self.sources or {}, {}
        for path, data in self.weights.items():
            key = sources.get(path)
            out[path] = known.get(path) or lineage.recall(key, FILE_SHA256) or derived_digest(key) \
                or hashlib.sha256(data).hexdigest()
            lineage.remember(key, FILE_SHA256, out[path])
        return out

    @cached_property
    def content_hash(self) -> str:
        """SHA-256 over the MIL text and every weight file (path, size and the file's own SHA-256):
        the in-process program key. Computed once; the weight bytes are hashed once (``file_digests``)."""
        h = hashlib.sha256(self.mil.encode())
        digests = self.file_digests
        for path in sorted(self.weights):
            h.update(path.encode() + b"\0" + len(self.weights[path]).to_bytes(8, "little") + bytes.fromhex(digests[path]))
        return h.hexdigest()

    def without_weights(self) -> Lowered:
        """This lowering without its weight files, for a program compiled from it that no one patches: the
        program holds its own copy, and bytes lowered in memory (no program cache to map them from) would
        otherwise stay resident twice. The content hash is kept."""
        light = replace(self, weights={}, digests={})
        light.__dict__["content_hash"] = self.content_hash  # cached_property's slot (frozen dataclass)
        return light


def lower_graph(graph: Graph, *, io_dtype: str = "fp16", max_layers: int = 1,
                sram_budget: int = SRAM_BYTES, min_surface_bytes: int = MIN_SURFACE_BYTES,
                surface_counts: tuple[int, int] = CONSERVATIVE_COUNTS) -> Lowered:
    """Run the whole pipeline up to MIL text; ``graph`` itself is not modified. ``surface_counts``: the
    ``(inputs, outputs)`` surfaces the program may bind (ANE-37); more are packed (``orion.passes.io_packing``)."""
    check_fusion_depth(graph, max_layers)
    legal = legalize(graph)
    layout = prepare_io(legal, io_dtype)
    context = PassContext(layout, sram_budget, min_surface_bytes, tuple(surface_counts))
    report = run_pipeline(legal, context)  # optimize, pack and pad the I/O, analyze
    emitter = Emitter(legal)
    program, weights = emitter.build()
    return Lowered(mil.emit(program), weights, layout, report, digests=emitter.digests, sources=emitter.sources)


def lower(graph: Graph, *, io_dtype: str = "fp16", max_layers: int = 1) -> tuple[str, dict[str, bytes]]:
    """``(mil_text, weights)`` for ``graph``: the input of ``orion.compile``."""
    lowered = lower_graph(graph, io_dtype=io_dtype, max_layers=max_layers)
    return lowered.mil, lowered.weights


class CompiledGraph:
    """A compiled graph: call it with the graph's input names, get a dict of the graph's output names."""

    def __init__(self, lowered: Lowered, program: Any) -> None:
        self.lowered = lowered
        self.program = program

    @property
    def mil(self) -> str:
        return self.lowered.mil

    @property
    def weights(self) -> dict[str, bytes]:
        return self.lowered.weights

    @property
    def layout(self) -> IOLayout:
        return self.lowered.layout

    @property
    def report(self) -> PipelineReport:
        return self.lowered.report

    @property
    def content_hash(self) -> str:
        return self.lowered.content_hash

    @property
    def failed(self) -> bool:
        """Whether its compile ended in an error: never once compiled (a ``CompilingGraph`` may have)."""
        return False

    def surfaces(self, side: str) -> dict[str, tuple[tuple[int, ...], str]]:
        """The program's ``"inputs"`` or ``"outputs"`` surfaces: MIL name -> (shape, MIL dtype)."""
        specs = self.program.inputs if side == "inputs" else self.program.outputs
        return {name: (tuple(spec.shape), mil_dtype(spec.dtype)) for name, spec in specs.items()}

    def _check_inputs(self, arrays: dict[str, np.ndarray]) -> None:
        missing = sorted({s.name for s in self.layout.inputs} - set(arrays))
        extra = sorted(set(arrays) - {s.name for s in self.layout.inputs})
        if missing or extra:
            raise EvaluateError(f"inputs: missing {missing}, unexpected {extra}. "
                                f"Fix: pass exactly {[s.name for s in self.layout.inputs]}")
        for spec in self.layout.inputs:
            shape = np.shape(arrays[spec.name])
            if shape != tuple(spec.shape):
                raise EvaluateError(f"input '{spec.name}': shape {list(shape)}, expected {list(spec.shape)}. "
                                    "Fix: pass the shape the graph declares")

    def pack_inputs(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Unpadded arrays by graph name -> packed, zero-padded surface arrays by MIL name (ANE-21, ANE-37)."""
        self._check_inputs(arrays)
        packed = {name: np.zeros(shape, dtype=_NUMPY_DTYPES[dtype])
                  for name, (shape, dtype) in IOLayout.surfaces(self.layout.inputs).items()}
        for spec in self.layout.inputs:
            packed_view(packed[spec.surface_name], spec.shape, spec.offset)[...] = arrays[spec.name]  # (ANE-21)
        return packed

    def unpack_outputs(self, results: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Surface arrays by MIL name -> unpadded arrays by graph name."""
        return {s.name: packed_view(np.asarray(results[s.surface_name]), s.shape, s.offset).copy()
                for s in self.layout.outputs}

    def __call__(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        """Runs the program on unpadded arrays by graph name; returns unpadded arrays by graph name. Each input is
        written (converted) straight into its place in the program's input surface, and each output copied once
        out of its place in the output surface (large ones on every core, :func:`copy_into`): no packed array is
        built."""
        self._check_inputs(arrays)

        def fill(surfaces: dict[str, np.ndarray]) -> None:
            for spec in self.layout.inputs:
                copy_into(packed_view(surfaces[spec.surface_name], spec.shape, spec.offset), arrays[spec.name])

        def read(surfaces: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {s.name: copied(packed_view(surfaces[s.surface_name], s.shape, s.offset)) for s in self.layout.outputs}

        return self.program.call_in_place(fill, read)


class CompilingGraph(CompiledGraph):
    """A lowered graph compiling on another thread (``ProgramBuilder.build_all(..., ahead=True)``): its I/O layout,
    and so its surfaces, now; its ``program`` once compiled (reading it waits; a compile error is raised there)."""

    def __init__(self, lowered: Lowered, compiling: Future[CompiledGraph]) -> None:
        self.lowered, self._compiling = lowered, compiling

    @property
    def program(self) -> Any:
        return self._compiling.result().program

    @property
    def failed(self) -> bool:
        """Whether its compile has ended in an error (``program`` raises it)."""
        return self._compiling.done() and self._compiling.exception() is not None

    def surfaces(self, side: str) -> dict[str, tuple[tuple[int, ...], str]]:
        """By the layout (a lowered graph's program has exactly its layout's surfaces), without waiting."""
        return IOLayout.surfaces(self.layout.inputs if side == "inputs" else self.layout.outputs)


def compile_lowered(lowered: Lowered, *, profile: str = "hardware", min_surface_bytes: int | None = None,
                    relaxed_ops: tuple[str, ...] = (),
                    surface_counts: tuple[int, int] | None = None,
                    packed_weights: dict[str, str] | None = None) -> CompiledGraph:
    """Compile an already lowered program; identical content is compiled once per process while a holder keeps
    it (and again if that program was unloaded). Programs of identical content are shared: unloading one unloads
    it for every holder. Thread-safe: concurrent calls for one program compile it once. ``min_surface_bytes``: a smaller surface minimum a probe report proved
    and ``relaxed_ops``: disputed ops (ANE-35) a probe report proved on this machine (see ``compile_graph``);
    ``surface_counts``: the ``(inputs, outputs)`` surface counts it proved (ANE-37); ``packed_weights``: files of
    packed panels of the weights (``orion.compile``'s, e.g. ``program_cache.compile_cached``'s)."""
    import orion

    counts = tuple(surface_counts) if surface_counts else CONSERVATIVE_COUNTS
    key = (lowered.content_hash, profile, tuple(sorted(relaxed_ops)), counts)
    with _COMPILING_LOCK:
        lock = _COMPILING.setdefault(key, threading.Lock())
    with lock:  # threads compiling one program wait for the first instead of spending the budget twice
        program = _PROGRAMS.get(key)
        if program is None or not program.loaded:
            program = _PROGRAMS[key] = orion.compile(
                lowered.mil, lowered.weights, profile=profile, min_surface_bytes=min_surface_bytes,
                relaxed_ops=relaxed_ops, surface_counts=surface_counts, weight_keys=lowered.file_digests,
                packed_weights=packed_weights)
        release_pages(lowered.weights.values())  # the program holds its own copy now
        return CompiledGraph(lowered, program)


def compile_graph(graph: Graph, *, io_dtype: str = "fp16", profile: str = "hardware", max_layers: int = 1,
                  sram_budget: int = SRAM_BYTES, verbose: bool = False, probe_report: Any = None) -> CompiledGraph:
    """Lower and compile ``graph``; programs with an identical content hash are compiled once.

    ``probe_report``: a saved ``python -m orion doctor --probe`` report (path) or the
    :class:`orion.probes.Relaxations` of one; conservative rules it proved safe on this machine are
    relaxed (a smaller minimum surface size, disputed ops that compiled and ran here, more I/O surfaces)."""
    from orion import probes

    relax = probes.load_report(probe_report) if isinstance(probe_report, (str, bytes)) or hasattr(probe_report, "__fspath__") \
        else (probe_report or probes.Relaxations())
    lowered = lower_graph(graph, io_dtype=io_dtype, max_layers=max_layers, sram_budget=sram_budget,
                          min_surface_bytes=relax.min_surface_bytes or MIN_SURFACE_BYTES,
                          surface_counts=relax.surface_counts or CONSERVATIVE_COUNTS)
    if verbose:
        print(f"graph '{graph.name}' ({lowered.content_hash[:12]}):\n{lowered.report}")
    return compile_lowered(lowered, profile=profile, min_surface_bytes=relax.min_surface_bytes,
                           relaxed_ops=relax.ops, surface_counts=relax.surface_counts)
