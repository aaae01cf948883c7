"""BLOBFILE weight files (docs/hardware.md §5): a 64-byte file header, then per tensor a 64-byte chunk
header and the payload. The MIL ``offset`` of a tensor is its chunk header: 64 for a one-tensor file.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from orion._core.mil import blobfile_chunk_offsets, blobfile_read_chunk, blobfile_write
from orion.errors import OrionError

__all__ = ["BlobfileError", "read", "write", "write_many"]


class BlobfileError(OrionError, ValueError):
    """A BLOBFILE chunk does not hold the tensor asked for (its size does not fit the dtype or shape), or a
    payload has a dtype BLOBFILEs do not store."""


def _payload(array: np.ndarray) -> np.ndarray:
    """The array as stored: floats as fp16, int8/uint8 as they are, flattened C-order."""
    array = np.asarray(array)
    if np.issubdtype(array.dtype, np.floating):
        array = array.astype(np.float16, copy=False)
    elif array.dtype not in (np.int8, np.uint8):
        raise BlobfileError(f"BLOBFILE payloads are fp16, int8 or uint8; got {array.dtype} (convert it first)")
    return np.ascontiguousarray(array).reshape(-1)


def write(array: np.ndarray) -> bytes:
    """A one-tensor BLOBFILE; its MIL offset is 64."""
    return blobfile_write([_payload(array)])


def write_many(arrays: Iterable[np.ndarray]) -> tuple[bytes, list[int]]:
    """One BLOBFILE holding every array in order, and the MIL offset of each."""
    payloads = [_payload(a) for a in arrays]
    return blobfile_write(payloads), blobfile_chunk_offsets([p.nbytes for p in payloads])


def read(data: Any, offset: int = 64, dtype: Any = np.float16, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """A copy of the tensor whose chunk header is at ``offset`` (reshaped when ``shape`` is given).

    Raises ``orion.ConstraintError`` (ANE-22) when ``offset`` is not a chunk header,
    ``orion.CompileError`` when the file is truncated, and :class:`BlobfileError` when the chunk's size
    does not fit ``dtype`` or ``shape``.
    """
    data_offset, size = blobfile_read_chunk(data, offset)
    dtype = np.dtype(dtype)
    if shape is not None:
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if expected != size:
            raise BlobfileError(f"chunk at offset {offset} holds {size} bytes, but shape {tuple(shape)} of {dtype} "
                                f"needs {expected}; read it with the shape and dtype it was written with")
    elif size % dtype.itemsize:
        raise BlobfileError(f"chunk at offset {offset} holds {size} bytes, not a whole number of {dtype} "
                            f"elements; read it with the dtype it was written with")
    array = np.frombuffer(data, dtype=np.uint8, count=size, offset=data_offset).view(dtype).copy()
    return array if shape is None else array.reshape(shape)
