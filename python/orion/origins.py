"""Where a constant's values came from: checkpoint tensors by name, found by memory address.

A loader calls :func:`record` with each tensor it returns (``model.layers.0.mlp.down_proj.weight`` in
``model.safetensors``); the graph builder asks :func:`origin_of` for an array it refuses, so that the
error names the tensor in the user's checkpoint rather than the graph node built from it. Any view of
a recorded array (a reshape, a transpose, a slice) is found too, because it lies in the same memory;
a computed copy (a concatenation, a permutation) is not. Nothing is kept alive: the record holds a
weak reference and lapses with the array.
"""

from __future__ import annotations

import weakref

import numpy as np

_RECORDS: dict[int, tuple[int, weakref.ref, str]] = {}  # start address -> (end address, array, origin)


def record(array: np.ndarray, origin: str) -> None:
    """Remember that ``array``'s memory holds ``origin`` (e.g. ``"model.safetensors: tensor 'x.weight'"``)."""
    start = array.ctypes.data
    if array.nbytes == 0:
        return
    _RECORDS[start] = (start + array.nbytes, weakref.ref(array, lambda _ref, key=start: _forget(key, _ref)), origin)


def _forget(key: int, ref: weakref.ref) -> None:
    entry = _RECORDS.get(key)
    if entry is not None and entry[1] is ref:
        del _RECORDS[key]


def origin_of(array: object) -> str | None:
    """The origin recorded for the memory of ``array`` (None when none is, or it is not an ndarray)."""
    if not isinstance(array, np.ndarray) or array.nbytes == 0:
        return None
    address = array.ctypes.data
    # A copy, made in one C call: building a list of the items allocates, an allocation can run the cyclic garbage
    # collector, and an array it frees drops its record (_forget) from the dict being listed.
    for start, (end, ref, origin) in _RECORDS.copy().items():
        if start <= address < end and ref() is not None:
            return origin
    return None
