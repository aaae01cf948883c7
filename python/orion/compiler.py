"""The compiler driver: check -> legalize -> I/O -> optimize (fixed point) -> pad I/O -> analyze -> emit
-> ``orion.compile``.

``lower(graph)`` gives the MIL text and weight files without compiling; ``compile_graph(graph)`` compiles
them (once per content hash in this process, to spare the compile budget, ANE-11) and returns a
:class:`CompiledGraph` that takes and returns unpadded arrays under the graph's own I/O names.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from orion import mil
from orion.emit import to_program
from orion.errors import EvaluateError
from orion.graph.builder import Graph
from orion.legalize import IOLayout, check_fusion_depth, legalize, prepare_io
from orion.limits import MIN_SURFACE_BYTES, SRAM_BYTES
from orion.passes import PassContext, PipelineReport, run_pipeline
from orion.runtime.packing import packed_view
from orion.runtime.pages import release_pages

_NUMPY_DTYPES = {"fp16": np.float16, "fp32": np.float32}
_PROGRAMS: dict[tuple[str, str, tuple[str, ...]], Any] = {}  # (content hash, profile, relaxed ops) -> Program
_COMPILING: dict[tuple[str, str, tuple[str, ...]], threading.Lock] = {}  # per key: one thread compiles it
_COMPILING_LOCK = threading.Lock()


@dataclass(frozen=True)
class Lowered:
    """Everything lowering produces: MIL text, weight files by path, I/O layout and the pass report.

    ``digests`` (path -> SHA-256 hex of the file) may be given when they are known already (the
    program cache's blobs are named by them); otherwise each file is hashed once, on first use."""

    mil: str
    weights: dict[str, bytes]
    layout: IOLayout
    report: PipelineReport | None  # None when read back from the on-disk program cache
    digests: dict[str, str] | None = field(default=None, compare=False, repr=False)

    @cached_property
    def file_digests(self) -> dict[str, str]:
        """SHA-256 (hex) of every weight file by path, computed at most once."""
        if self.digests is not None and set(self.digests) == set(self.weights):
            return dict(self.digests)
        return {path: hashlib.sha256(data).hexdigest() for path, data in self.weights.items()}

    @cached_property
    def content_hash(self) -> str:
        """SHA-256 over the MIL text and every weight file (path, size and the file's own SHA-256):
        the in-process program key. Computed once; the weight bytes are hashed once (``file_digests``)."""
        h = hashlib.sha256(self.mil.encode())
        digests = self.file_digests
        for path in sorted(self.weights):
            h.update(path.encode() + b"\0" + len(self.weights[path]).to_bytes(8, "little") + bytes.fromhex(digests[path]))
        return h.hexdigest()


def lower_graph(graph: Graph, *, io_dtype: str = "fp16", max_layers: int = 1,
                sram_budget: int = SRAM_BYTES, min_surface_bytes: int = MIN_SURFACE_BYTES) -> Lowered:
    """Run the whole pipeline up to MIL text; ``graph`` itself is not modified."""
    check_fusion_depth(graph, max_layers)
    legal = legalize(graph)
    layout = prepare_io(legal, io_dtype)
    report = run_pipeline(legal, PassContext(layout, sram_budget, min_surface_bytes))  # optimize, pad, analyze
    program, weights = to_program(legal)
    return Lowered(mil.emit(program), weights, layout, report)


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

    def pack_inputs(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Unpadded arrays by graph name -> packed, zero-padded surface arrays by MIL name (ANE-21)."""
        missing = sorted({s.name for s in self.layout.inputs} - set(arrays))
        extra = sorted(set(arrays) - {s.name for s in self.layout.inputs})
        if missing or extra:
            raise EvaluateError(f"inputs: missing {missing}, unexpected {extra}. "
                                f"Fix: pass exactly {[s.name for s in self.layout.inputs]}")
        packed = {}
        for spec in self.layout.inputs:
            a = np.asarray(arrays[spec.name])
            if a.shape != spec.shape:
                raise EvaluateError(f"input '{spec.name}': shape {list(a.shape)}, expected {list(spec.shape)}. "
                                    "Fix: pass the shape the graph declares")
            buf = np.zeros(spec.padded, dtype=_NUMPY_DTYPES[spec.dtype])
            packed_view(buf, spec.shape)[...] = a  # packed at the front (ANE-21)
            packed[spec.mil_name] = buf
        return packed

    def unpack_outputs(self, results: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Surface arrays by MIL name -> unpadded arrays by graph name."""
        return {s.name: packed_view(np.asarray(results[s.mil_name]), s.shape).copy() for s in self.layout.outputs}

    def __call__(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        return self.unpack_outputs(self.program(**self.pack_inputs(arrays)))


def compile_lowered(lowered: Lowered, *, profile: str = "hardware", min_surface_bytes: int | None = None,
                    relaxed_ops: tuple[str, ...] = ()) -> CompiledGraph:
    """Compile an already lowered program; identical content is compiled once per process (and again
    if that program was unloaded). Programs of identical content are shared: unloading one unloads
    it for every holder. Thread-safe: concurrent calls for one program compile it once. ``min_surface_bytes``: a smaller surface minimum a probe report proved
    and ``relaxed_ops``: disputed ops (ANE-35) a probe report proved on this machine (see ``compile_graph``)."""
    import orion

    key = (lowered.content_hash, profile, tuple(sorted(relaxed_ops)))
    with _COMPILING_LOCK:
        lock = _COMPILING.setdefault(key, threading.Lock())
    with lock:  # threads compiling one program wait for the first instead of spending the budget twice
        if key not in _PROGRAMS or not _PROGRAMS[key].loaded:
            _PROGRAMS[key] = orion.compile(lowered.mil, lowered.weights, profile=profile,
                                           min_surface_bytes=min_surface_bytes, relaxed_ops=relaxed_ops)
        release_pages(lowered.weights.values())  # the program holds its own copy now
        return CompiledGraph(lowered, _PROGRAMS[key])


def compile_graph(graph: Graph, *, io_dtype: str = "fp16", profile: str = "hardware", max_layers: int = 1,
                  sram_budget: int = SRAM_BYTES, verbose: bool = False, probe_report: Any = None) -> CompiledGraph:
    """Lower and compile ``graph``; programs with an identical content hash are compiled once.

    ``probe_report``: a saved ``python -m orion doctor --probe`` report (path) or the
    :class:`orion.probes.Relaxations` of one; conservative rules it proved safe on this machine are
    relaxed (a smaller minimum surface size, disputed ops that compiled and ran here)."""
    from orion import probes

    relax = probes.load_report(probe_report) if isinstance(probe_report, (str, bytes)) or hasattr(probe_report, "__fspath__") \
        else (probe_report or probes.Relaxations())
    lowered = lower_graph(graph, io_dtype=io_dtype, max_layers=max_layers, sram_budget=sram_budget,
                          min_surface_bytes=relax.min_surface_bytes or MIN_SURFACE_BYTES)
    if verbose:
        print(f"graph '{graph.name}' ({lowered.content_hash[:12]}):\n{lowered.report}")
    return compile_lowered(lowered, profile=profile, min_surface_bytes=relax.min_surface_bytes,
                           relaxed_ops=relax.ops)
