"""Tensors packed in a larger buffer: how padded surfaces hold their data (ANE-21), and how a surface
packing several tensors (ANE-37, ``orion.passes.io_packing``) holds each at its offset."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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
