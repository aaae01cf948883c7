"""Tensors packed at the front of a larger buffer: how padded surfaces hold their data (ANE-21)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def packed_view(buffer: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """The tensor of ``shape`` stored packed from the start of ``buffer`` (a view: writes go through).

    ``buffer`` is any C-contiguous array at least that large, e.g. a padded surface's array."""
    count = int(np.prod(shape, dtype=np.int64))
    return buffer.reshape(-1)[:count].reshape(tuple(shape))
