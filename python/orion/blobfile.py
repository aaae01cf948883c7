"""BLOBFILE weight files (docs/hardware.md §5), laid out as coremltools' MILBlob StorageWriter writes them:
a 64-byte file header (blob count, version 2), then per tensor a 64-byte chunk header (data-type code,
size, payload offset) and the payload, every chunk starting at a multiple of 64. The MIL ``offset`` of a
tensor is its chunk header: 64 for the first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from orion._core.mil import blobfile_chunk_offsets, blobfile_read_chunk, blobfile_write
from orion.errors import OrionError

__all__ = ["BlobfileError", "DATA_TYPE_CODES", "SUB_BYTE_CODES", "SubByte", "read", "write", "write_many"]

DATA_TYPE_CODES = {np.dtype(np.float16): 1, np.dtype(np.float32): 2, np.dtype(np.uint8): 3, np.dtype(np.int8): 4}
"""The chunk header's data-type code per payload dtype: coremltools' ``MILBlob::Blob::BlobDataType``."""
SUB_BYTE_CODES = {"int4": (8, 4), "uint4": (11, 4), "uint6": (13, 6)}
"""MIL's sub-byte dtypes: their ``BlobDataType`` code and bits per element."""


class SubByte:
    """Values of a sub-byte MIL dtype (``int4``, ``uint4``, ``uint6``) to store in a BLOBFILE: packed LSB first,
    element i at bits [i*b, (i+1)*b) of the payload, the last byte's unused bits counted in the chunk header's
    ``padding_size_in_bits``, as coremltools' MILBlob writer stores them."""

    def __init__(self, values: np.ndarray, dtype: str) -> None:
        if dtype not in SUB_BYTE_CODES:
            raise BlobfileError(f"sub-byte dtype {dtype!r} is not one of {', '.join(SUB_BYTE_CODES)}")
        self.code, self.bits = SUB_BYTE_CODES[dtype]
        lo, hi = (-8, 7) if dtype == "int4" else (0, (1 << self.bits) - 1)
        v = np.asarray(values).reshape(-1)
        if v.size and (int(v.min()) < lo or int(v.max()) > hi):
            raise BlobfileError(f"{dtype} values must be in [{lo}, {hi}], got [{v.min()}, {v.max()}]")
        self.dtype, self.shape, self.count = dtype, tuple(np.shape(values)), v.size
        self.packed = _pack_lsb_first(v, self.bits)
        self.padding = (-self.count * self.bits) % 8


def _pack_lsb_first(v: np.ndarray, bits: int) -> np.ndarray:
    """The integers ``v`` (1-D) as ``bits``-bit fields packed LSB first (element i at bits [i*bits, (i+1)*bits)),
    the last byte's unused bits zero: whole groups of elements filling whole bytes (2 of 4 bits, 4 of 6) combined
    in a uint32 and split into their bytes."""
    per_group = math.lcm(8, bits) // bits  # elements per group, <= 32 bits for every sub-byte dtype
    fields = np.zeros(-(-v.size // per_group) * per_group, np.uint32)
    fields[:v.size] = v.astype(np.int64, copy=False) & ((1 << bits) - 1)
    groups = fields.reshape(-1, per_group)
    word = np.zeros(groups.shape[0], np.uint32)
    for k in range(per_group):
        word |= groups[:, k] << np.uint32(k * bits)
    nbytes = per_group * bits // 8
    packed = np.stack([(word >> np.uint32(8 * j)).astype(np.uint8) for j in range(nbytes)], axis=1).reshape(-1)
    return packed[:-(-v.size * bits // 8)]


class BlobfileError(OrionError, ValueError):
    """A BLOBFILE chunk does not hold the tensor asked for (its size does not fit the dtype or shape), or a
    payload has a dtype BLOBFILEs do not store."""


def _payload(array: np.ndarray | SubByte, float_dtype: Any) -> tuple[np.ndarray, int] | tuple[np.ndarray, int, int]:
    """The array as stored (floats as ``float_dtype``, int8/uint8 as they are, flattened C-order) and its
    data-type code (and, for a :class:`SubByte`, its padding bits)."""
    if isinstance(array, SubByte):
        return array.packed, array.code, array.padding
    array = np.asarray(array)
    if np.issubdtype(array.dtype, np.floating):
        if np.dtype(float_dtype) not in (np.float16, np.float32):
            raise BlobfileError(f"float payloads are stored as float16 or float32, not {np.dtype(float_dtype)}")
        array = array.astype(float_dtype, copy=False)
    elif array.dtype not in (np.int8, np.uint8):
        raise BlobfileError(f"BLOBFILE payloads are fp16, fp32, int8 or uint8; got {array.dtype} (convert it first)")
    return np.ascontiguousarray(array).reshape(-1), DATA_TYPE_CODES[array.dtype]


def write(array: np.ndarray | SubByte, *, float_dtype: Any = np.float16) -> bytes:
    """A one-tensor BLOBFILE; its MIL offset is 64. Floats are stored as ``float_dtype`` (fp16 unless
    float32 is asked for)."""
    return blobfile_write([_payload(array, float_dtype)])


def write_many(arrays: Iterable[np.ndarray | SubByte], *, float_dtype: Any = np.float16) -> tuple[bytes, list[int]]:
    """One BLOBFILE holding every array in order (64-byte aligned chunks, the count field set), and the
    MIL offset of each."""
    payloads = [_payload(a, float_dtype) for a in arrays]
    return blobfile_write(payloads), blobfile_chunk_offsets([p[0].nbytes for p in payloads])


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
