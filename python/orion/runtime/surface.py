"""Surfaces: the byte buffers a program reads its inputs from and writes its outputs to.

On the ANE they are IOSurfaces; on the emulator, aligned host memory. A tensor is stored packed
from offset 0 in its MIL-declared shape; a surface may be larger (the ANE needs at least
49,152 bytes, and one size for all inputs of a program), the tail is padding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np

from orion import _core
from orion.errors import EvaluateError
from orion.limits import MAX_ELEMENTS, MAX_RANK, MIN_SURFACE_BYTES
from orion.runtime.backend import backend
from orion.runtime.dtypes import numpy_dtype


class SurfaceError(EvaluateError, ValueError):
    """A surface's shape, dtype or size makes no sense."""


MAX_SURFACE_BYTES = MAX_ELEMENTS * 4
"""The largest surface: the most elements a tensor may have, of the widest I/O dtype (fp32)."""


class Surface:
    """A surface holding one tensor of ``shape`` and MIL ``dtype``, exposed as a numpy view.

    ``nbytes`` defaults to the tensor's size rounded up to the ANE minimum.
    """

    def __init__(self, shape: Sequence[int], dtype: str = "fp16", nbytes: int | None = None) -> None:
        self.shape = _shape(shape)
        self.dtype = dtype
        try:
            np_dtype = numpy_dtype(dtype)
        except (ValueError, TypeError) as exc:
            raise SurfaceError(f"a surface of dtype {dtype!r}: {exc}") from None
        count = int(np.prod(self.shape, dtype=object))
        needed = count * np_dtype.itemsize
        if count > MAX_ELEMENTS:
            raise SurfaceError(f"a surface for {dtype} {list(self.shape)} holds {count} elements, over the "
                               f"{MAX_ELEMENTS} a tensor may have. Fix: use a smaller shape")
        if nbytes is None:
            nbytes = max(needed, MIN_SURFACE_BYTES)
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)):
            raise TypeError(f"nbytes must be an int (or None), not {type(nbytes).__name__}")
        if nbytes < needed or nbytes > MAX_SURFACE_BYTES:
            raise SurfaceError(f"a surface for {dtype} {list(self.shape)} needs {needed} bytes, got nbytes={nbytes}"
                               f" (at most {MAX_SURFACE_BYTES} bytes)")
        # The allocator is the selected backend's (IOSurfaces under the ane backend, host memory
        # otherwise); a bad ORION_BACKEND raises here as it does in orion.compile.
        self.native = _core.Surface(nbytes, backend())
        try:
            self.array: np.ndarray = np.frombuffer(self.native, dtype=np_dtype, count=count).reshape(self.shape)
        except ValueError as exc:  # e.g. a zero-size shape whose other dims overflow numpy's size
            raise EvaluateError(f"a surface for {dtype} {list(self.shape)}: numpy cannot view this shape ({exc}). "
                                "Fix: declare I/O dimensions whose product (zeros aside) fits in 2**63 bytes") from None
        """Writable view of the tensor, packed from offset 0 (no copy). Under the ane backend, bracket
        direct access with :meth:`cpu_access` (``write``/``read`` do it for you)."""

    def view_as(self, shape: Sequence[int]) -> Surface:
        """This surface's memory holding a tensor of another ``shape`` of the same dtype, packed from
        offset 0 (e.g. a KV cache at a shorter length): the same native surface, so the same size."""
        view = object.__new__(Surface)
        view.shape, view.dtype, view.native = tuple(int(d) for d in shape), self.dtype, self.native
        count = int(np.prod(view.shape, dtype=np.int64))
        if count * self.array.itemsize > self.nbytes:
            raise ValueError(f"a view as {self.dtype} {list(view.shape)} needs {count * self.array.itemsize} "
                             f"bytes; the surface has {self.nbytes}")
        view.array = np.frombuffer(self.native, dtype=self.array.dtype, count=count).reshape(view.shape)
        return view

    @property
    def nbytes(self) -> int:
        """Allocated size in bytes (tensor plus padding)."""
        return self.native.nbytes

    @property
    def kind(self) -> str:
        """``"iosurface"`` (ane backend) or ``"host"``."""
        return self.native.kind

    @contextlib.contextmanager
    def cpu_access(self, read_only: bool = False) -> Iterator[np.ndarray]:
        """Locks the surface for CPU access (IOSurfaceLock) and yields the array; unlocks on exit.
        Never evaluate inside the block."""
        self.native.lock(read_only)
        try:
            yield self.array
        finally:
            self.native.unlock()

    def write(self, values: np.ndarray) -> None:
        """Copies ``values`` into the surface (converted to the surface's dtype), under a lock."""
        with self.cpu_access() as array:
            np.copyto(array, np.asarray(values).reshape(self.shape), casting="same_kind")

    def read(self) -> np.ndarray:
        """A copy of the tensor, taken under a read-only lock."""
        with self.cpu_access(read_only=True) as array:
            return array.copy()

    def __repr__(self) -> str:
        return f"Surface({self.dtype} {list(self.shape)}, {self.nbytes} bytes)"


def _shape(shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` as a tuple of dimensions, each an int >= 0 (TypeError for what is no sequence of ints)."""
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence | np.ndarray):
        raise TypeError(f"a surface's shape is a sequence of ints, not {type(shape).__name__}")
    dims = tuple(shape)
    if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) for d in dims):
        raise TypeError(f"a surface's shape is a sequence of ints, got {list(dims)!r}"[:200])
    if len(dims) > MAX_RANK or any(d < 0 for d in dims):
        raise SurfaceError(f"a surface's shape {list(dims)}: give at most {MAX_RANK} dimensions, none negative")
    return tuple(int(d) for d in dims)
