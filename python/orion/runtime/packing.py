"""Tensors packed in a larger buffer: how padded surfaces hold their data (ANE-21), and how a surface
packing several tensors (ANE-37, ``orion.passes.io_packing``) holds each at its offset."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from orion._core import kernels

# Below this many bytes numpy's one-thread copy is as fast as waking the pool's threads.
PARALLEL_COPY_BYTES = 1 << 18


def packed_view(buffer: np.ndarray, shape: Sequence[int], offset: int = 0) -> np.ndarray:
    """The tensor of ``shape`` stored packed from element ``offset`` of ``buffer`` (a view: writes go through).

    ``buffer`` is any C-contiguous array large enough, e.g. a padded or packed surface's array; ``offset``
    is an :class:`orion.legalize.io.IOSpec`'s (0 for a tensor with a surface of its own)."""
    count = int(np.prod(shape, dtype=np.int64))
    flat = buffer.reshape(-1)
    if offset < 0 or offset + count > flat.size:
        raise ValueError(f"a packed view of {list(shape)} at element {offset} needs {offset + count} elements; "
                         f"the buffer has {flat.size}")
    return flat[offset:offset + count].reshape(tuple(shape))


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src, casting="same_kind")``, on every core when both are C-contiguous arrays of one shape
    of at least :data:`PARALLEL_COPY_BYTES`, of one dtype (``orion._core.kernels.copy``) or float32 into float16
    (``kernels.to_fp16``, which rounds as numpy): the same bytes either way. A training step copies hundreds of
    MB of weights, activations and gradients through program surfaces."""
    whole = (isinstance(src, np.ndarray) and src.shape == dst.shape and src.nbytes >= PARALLEL_COPY_BYTES
             and src.flags.c_contiguous and dst.flags.c_contiguous)
    if whole and src.dtype == dst.dtype:
        kernels.copy(dst, src)
    elif whole and src.dtype == np.float32 and dst.dtype == np.float16:
        kernels.to_fp16(src, dst)
    else:
        np.copyto(dst, src, casting="same_kind")


def copied(array: np.ndarray) -> np.ndarray:
    """``array.copy()`` (C order), by :func:`copy_into`."""
    out = np.empty(array.shape, array.dtype)
    copy_into(out, array)
    return out
