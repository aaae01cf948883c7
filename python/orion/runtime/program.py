"""Compiled programs: compile MIL text + BLOBFILE weights, then evaluate on surfaces."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple, TypeVar

import numpy as np

from orion import _core
from orion.errors import CompileError, EvaluateError, ParseError
from orion.limits import MIN_SURFACE_BYTES
from orion.runtime.backend import backend
from orion.runtime.dtypes import numpy_dtype
from orion.runtime.surface import Surface

T = TypeVar("T")


def _has_nan(array: np.ndarray) -> bool:
    """Whether a float array holds a NaN: one multithreaded pass over the bits of an fp16/fp32 surface array."""
    if array.dtype in (np.float16, np.float32) and array.flags.c_contiguous:
        return bool(_core.kernels.has_nan(array))
    return bool(np.isnan(array).any())


class TensorSpec(NamedTuple):
    """Shape and numpy dtype of a program input or output."""

    shape: tuple[int, ...]
    dtype: np.dtype


def _specs(native_specs: list[tuple[str, list[int], str]]) -> dict[str, TensorSpec]:
    return {name: TensorSpec(tuple(shape), numpy_dtype(dtype)) for name, shape, dtype in native_specs}


class Program:
    """A compiled, loaded MIL program. Call it with numpy arrays, or ``evaluate`` on surfaces.

    Inputs and outputs bind to the hardware in alphabetical order of their names; this class
    does the sorting, callers pass names.

    Threads: a program is thread-safe. Calls (``program(**arrays)``) from several threads are
    serialized on the program's own surfaces; ``evaluate`` and bound programs may run from several
    threads as long as each thread uses its own surfaces (a :class:`Surface` is not thread-safe).
    """

    def __init__(self, native: _core.LoadedProgram, mil_dtypes: dict[str, str]) -> None:
        self._native = native
        self._mil_dtypes = mil_dtypes
        self.inputs: dict[str, TensorSpec] = _specs(native.inputs)
        """name -> (shape, dtype) of each MIL parameter."""
        self.outputs: dict[str, TensorSpec] = _specs(native.outputs)
        """name -> (shape, dtype) of each returned value."""
        self._surfaces: tuple[dict[str, Surface], dict[str, Surface]] | None = None
        self._call_lock = threading.Lock()  # guards _surfaces: one __call__ at a time writes and reads them
        self._filled_in_place = False  # the cached input surfaces were last written by call_in_place

    @property
    def backend(self) -> str:
        return self._native.backend

    @property
    def input_parts(self) -> dict[str, tuple[str, int, tuple[int, ...]]]:
        """name -> (input, element offset, shape) of each tensor the program cuts from an input surface by
        slices and reshapes (the I/O packing and padding): a ``live_lanes`` hint may name it."""
        return {name: (source, offset, tuple(shape)) for name, source, offset, shape in self._native.input_parts}

    @property
    def loaded(self) -> bool:
        return self._native.loaded

    def allocate_surfaces(self) -> tuple[dict[str, Surface], dict[str, Surface]]:
        """New input and output surfaces that satisfy the ANE's size rules (each at least
        49,152 bytes, one size for all inputs and one for all outputs)."""
        return self._allocate(self.inputs), self._allocate(self.outputs)

    def _allocate(self, specs: Mapping[str, TensorSpec]) -> dict[str, Surface]:
        minimum = self._native.min_surface_bytes  # MIN_SURFACE_BYTES unless a probe report relaxed it
        size = max([minimum] + [int(np.prod(s.shape)) * s.dtype.itemsize for s in specs.values()])
        return {name: Surface(s.shape, self._mil_dtypes[name], nbytes=size) for name, s in specs.items()}

    def evaluate(
        self,
        inputs: Mapping[str, Surface],
        outputs: Mapping[str, Surface],
        *,
        live_lanes: Mapping[str, int] | None = None,
    ) -> None:
        """Runs the program once on caller-owned surfaces (zero-copy; reuse them across calls).

        ``live_lanes`` optionally declares, per input, that only its first n lanes (entries of the
        last axis) hold data the outputs depend on, e.g. one live token in a 32-lane decode input
        or the filled part of a KV cache. A name may also be one of :attr:`input_parts`, a tensor the
        program cuts from an input surface (the I/O packing's, ANE-37). The emulator then computes only those lanes (reductions
        and matmuls over the lane axis see the live ones only); the ANE ignores the hint and
        computes everything. Declare lanes dead only where they cannot change the live outputs
        (e.g. masked cache positions), or the two backends disagree. Output lanes past the live
        ones are undefined.
        """
        self.bind(inputs, outputs)(live_lanes)

    def bind(self, inputs: Mapping[str, Surface], outputs: Mapping[str, Surface],
             copy_in: Iterable[tuple[np.ndarray, np.ndarray]] = (),
             copy_out: Iterable[tuple[np.ndarray, np.ndarray]] = ()) -> BoundProgram:
        """Checks the surfaces once and returns a callable evaluating the program on them: the
        fast path for loops that reuse the same surfaces every call (e.g. a decode step). ``copy_in`` /
        ``copy_out``: ``(source, target)`` views of one shape and dtype copied before / after each evaluate
        (a tensor shared with another program and packed with others here, ``orion.runtime.stage``)."""
        self._check_surfaces("input", self.inputs, inputs)
        self._check_surfaces("output", self.outputs, outputs)
        return BoundProgram(self, [(name, inputs[name].native) for name in sorted(inputs)],
                            [(name, outputs[name].native) for name in sorted(outputs)], copy_in, copy_out)

    def __call__(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        """Runs the program on numpy arrays (by input name); returns arrays by output name.
        Thread-safe: concurrent calls take turns on the program's cached surfaces."""
        with self._call_lock:
            if self._surfaces is None:
                self._surfaces = self.allocate_surfaces()
            self._filled_in_place = False
            return self._call_on(*self._surfaces, arrays)

    def call_in_place(self, fill: Callable[[dict[str, np.ndarray]], None],
                      read: Callable[[dict[str, np.ndarray]], T]) -> T:
        """Runs the program on its cached surfaces with no array copied whole: ``fill`` writes into the input
        surfaces' arrays (by input name; whatever it leaves unwritten holds zeros, or what the last
        ``call_in_place`` wrote there), and ``read`` takes what it needs from the output arrays. Inputs holding
        NaN are refused, as by ``__call__``. Thread-safe as ``__call__``."""
        with self._call_lock:
            if self._surfaces is None:
                self._surfaces = self.allocate_surfaces()
            in_surfaces, out_surfaces = self._surfaces
            if not self._filled_in_place:  # __call__ wrote whole arrays: padding zeroed again
                for surface in in_surfaces.values():
                    surface.write(np.zeros(surface.shape, surface.array.dtype))
            with contextlib.ExitStack() as locks:
                arrays = {name: locks.enter_context(s.cpu_access()) for name, s in in_surfaces.items()}
                fill(arrays)
                for name, array in arrays.items():
                    if array.dtype.kind == "f" and _has_nan(array):
                        raise EvaluateError(f"input {name!r} contains NaN")
            self._filled_in_place = True
            self.evaluate(in_surfaces, out_surfaces)
            with contextlib.ExitStack() as locks:
                return read({name: locks.enter_context(s.cpu_access(read_only=True)) for name, s in out_surfaces.items()})

    def _call_on(self, in_surfaces: dict[str, Surface], out_surfaces: dict[str, Surface],
                 arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        _check_names("input", self.inputs, arrays)
        for name, value in arrays.items():
            spec = self.inputs[name]
            value = np.asarray(value)
            if value.shape != spec.shape:
                raise EvaluateError(f"input {name!r} has shape {list(value.shape)}, the program expects {list(spec.shape)}")
            if not np.can_cast(value.dtype, spec.dtype, casting="same_kind"):
                raise EvaluateError(f"input {name!r} is {value.dtype}, which does not convert to {spec.dtype}")
            if value.dtype.kind == "f" and _has_nan(value):
                raise EvaluateError(f"input {name!r} contains NaN")
            in_surfaces[name].write(value)
        self.evaluate(in_surfaces, out_surfaces)
        return {name: surface.read() for name, surface in out_surfaces.items()}

    def _check_surfaces(self, side: str, specs: Mapping[str, TensorSpec], surfaces: Mapping[str, Surface]) -> None:
        _check_names(side, specs, surfaces)
        for name, surface in surfaces.items():
            spec = specs[name]
            if not isinstance(surface, Surface):
                raise EvaluateError(f"{side} {name!r} must be an orion.Surface, got {type(surface).__name__}")
            if surface.shape != spec.shape or surface.dtype != self._mil_dtypes[name]:
                raise EvaluateError(
                    f"{side} {name!r}: the surface holds {surface.dtype} {list(surface.shape)} but the program "
                    f"reads {self._mil_dtypes[name]} {list(spec.shape)}"
                )

    def with_weights(self, weights: Mapping[str, bytes | bytearray | memoryview], *,
                     unverified_patch: bool = False) -> Program:
        """A new program of the same MIL with new weight files, loaded without compiling: the
        compile count does not move. The emulator re-bakes the weights; the ANE loads through the
        weight-patch path (docs/hardware.md §6). Give every BLOBFILE path again; this program stays valid.

        On the ane backend a program with several weight files is refused (the patch is verified on
        hardware for one file only) unless ``unverified_patch=True``: pass it only when
        ``python -m orion doctor --probe`` showed ``weight_patch_multi_file`` working on this machine.
        """
        return Program(self._native.with_weights(dict(weights), unverified_patch=unverified_patch), self._mil_dtypes)

    def unload(self) -> None:
        """Releases the program on the device. Further evaluates raise EvaluateError."""
        self._native.unload()

    def __enter__(self) -> Program:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unload()

    def __repr__(self) -> str:
        fmt = lambda specs: ", ".join(f"{n}: {s.dtype} {list(s.shape)}" for n, s in specs.items())  # noqa: E731
        return f"Program(inputs={{{fmt(self.inputs)}}}, outputs={{{fmt(self.outputs)}}}, backend={self.backend!r})"


class BoundProgram:
    """A program with its surfaces bound in binding (alphabetical) order (``inputs``, ``outputs``: ``[(name,
    native surface)]``) and its copies (``Program.bind``); call it to evaluate."""

    def __init__(self, program: Program, inputs: list, outputs: list,
                 copy_in: Iterable[tuple[np.ndarray, np.ndarray]],
                 copy_out: Iterable[tuple[np.ndarray, np.ndarray]]) -> None:
        self.program, self.inputs, self.outputs = program, inputs, outputs
        self.native = program._native.bind(inputs, outputs, list(copy_in), list(copy_out))

    def __call__(self, live_lanes: Mapping[str, int] | None = None) -> None:
        """Runs the program once (see :meth:`Program.evaluate` for ``live_lanes``)."""
        self.native(live_lanes or {})

    @staticmethod
    def in_turn(calls: Iterable[tuple[BoundProgram, Mapping[str, int] | None]]) -> None:
        """Runs bound programs one after another, each with its live-lanes hint, in one native call: no Python
        (and no interpreter's cache misses) between them, as a decode step's layer and head programs want."""
        _core.evaluate_in_turn([(bound.native, live or {}) for bound, live in calls])


def _check_names(side: str, specs: Mapping[str, object], given: Mapping[str, object]) -> None:
    missing = sorted(set(specs) - set(given))
    unknown = sorted(set(given) - set(specs))
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing {side}s {missing}")
        if unknown:
            parts.append(f"unknown {side}s {unknown}")
        raise EvaluateError(f"{'; '.join(parts)} (the program's {side}s are {sorted(specs)})")


def _mil_bytes(mil: str | bytes) -> bytes:
    """The MIL text as UTF-8 bytes (TypeError for what is no text, before anything is allocated)."""
    if isinstance(mil, str):
        try:
            return mil.encode("utf-8")
        except UnicodeEncodeError as exc:
            line = mil.count("\n", 0, exc.start) + 1
            column = exc.start - (mil.rfind("\n", 0, exc.start) + 1) + 1
            raise ParseError(f"line {line}:{column}: the MIL text holds a lone surrogate "
                             f"({mil[exc.start:exc.end]!a}), which is no Unicode character. Fix: remove it",
                             line, column) from None
    if not isinstance(mil, (bytes, bytearray, memoryview)):
        raise TypeError(f"the MIL text must be a str or bytes, not {type(mil).__name__}")
    return bytes(mil)


def compile(  # noqa: A001 - mirrors the ANE API's verb
    mil: str | bytes,
    weights: Mapping[str, bytes | bytearray | memoryview] | None = None,
    *,
    profile: str = "hardware",
    min_surface_bytes: int | None = None,
    relaxed_ops: Iterable[str] = (),
    surface_counts: tuple[int, int] | None = None,
    build_info: bool = True,
    weight_keys: Mapping[str, str] | None = None,
    packed_weights: Mapping[str, str] | None = None,
) -> Program:
    """Compiles and loads MIL text.

    ``weights`` maps each BLOBFILE ``path`` string of the MIL (e.g. ``"@model_path/weights/w.bin"``)
    to the whole file's bytes; they are baked in, later changes to the buffers change nothing.
    ``profile="permissive"`` lifts the ANE's op and form bans (experiments only). Counts one
    compile toward the per-process budget. ``min_surface_bytes`` lowers the surface minimum below the
    conservative 49,152 bytes; only pass what a probe report proved (``orion.probes``). ``relaxed_ops``
    names disputed ops (``_core.op_table()`` status ``"disputed"``, e.g. ``quantize``, ANE-35) that a probe
    report proved on this machine (``orion.probes.Relaxations.ops``); the hardware profile refuses them
    otherwise. ``surface_counts``: the ``(inputs, outputs)`` surfaces a probe report proved a program may
    bind on this machine (``orion.probes.Relaxations.surface_counts``); without it the hardware profile
    allows one input surface and six output surfaces (ANE-37; ``orion.compile_graph`` packs I/O to fit).
    A text without a ``buildInfo`` block gets the default one (the block every program that ran on hardware
    carries), the same bytes on either backend; ``build_info=False`` sends it as written (the
    ``build_info_absent`` probe). ``weight_keys`` maps a weight file's path to a name its bytes alone determine
    (their SHA-256, as ``Lowered.file_digests``): the emulator then finds the packed weights it already holds
    by that name instead of hashing and comparing every weight of every program (a key seen before with
    other bytes, at a few sampled places, is refused). ``packed_weights`` maps a keyed weight
    (``"<key>@<offset>/<cout>x<cin>"``, as ``_core.kernels.keyed_conv_panels()`` names them) to a file of its
    packed panels (those bytes, checked by the caller: the program cache's ``panels/``): the emulator maps the
    file instead of packing the weight; a file of the wrong size or values raises ValueError naming it.
    """
    if surface_counts is not None and (len(surface_counts) != 2 or any(
            not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1 for n in surface_counts)):
        raise CompileError(f"surface_counts={surface_counts!r}: give (inputs, outputs), two counts of at least 1, "
                           "as a probe report proved them (orion.probes.Relaxations.surface_counts)")
    if isinstance(relaxed_ops, str):
        raise CompileError(f"relaxed_ops must be a collection of op names, not the string {relaxed_ops!r}: "
                           f"write relaxed_ops=({relaxed_ops!r},)")
    text = _mil_bytes(mil)
    if weights is not None and not isinstance(weights, Mapping):
        raise TypeError(f"weights must map BLOBFILE paths to bytes (a dict), not a {type(weights).__name__}")
    if min_surface_bytes is not None and (isinstance(min_surface_bytes, bool) or not isinstance(min_surface_bytes, int)):
        raise TypeError(f"min_surface_bytes must be an int (or None), not {type(min_surface_bytes).__name__}")
    if min_surface_bytes is not None and not 0 <= min_surface_bytes <= MIN_SURFACE_BYTES:
        raise CompileError(f"min_surface_bytes={min_surface_bytes}: a probe report can only lower the surface minimum "
                           f"to a size in [1, {MIN_SURFACE_BYTES}] (or pass None for the conservative minimum)")
    backend()  # selects the backend (and its surface kind), warns once about a fallback
    native = _core.compile(text, dict(weights or {}), profile, min_surface_bytes=min_surface_bytes or 0,
                           relaxed_ops=sorted(relaxed_ops),
                           surface_counts=tuple(int(n) for n in surface_counts) if surface_counts else (0, 0),
                           build_info=build_info, weight_keys=dict(weight_keys or {}),
                           packed_weights=dict(packed_weights or {}))
    return Program(native, {name: dtype for name, _, dtype in native.inputs + native.outputs})
