"""The KV cache: every layer's keys and values in persistent surfaces the decode programs bind as
inputs, the additive attention mask, and how many positions are filled."""

from __future__ import annotations

import numpy as np

from orion.limits import FP16_MAX, MIN_SURFACE_BYTES
from orion.passes.io_padding import padded_shape
from orion.runtime.dtypes import numpy_dtype
from orion.runtime.packing import packed_view
from orion.runtime.surface import Surface

MASKED = -FP16_MAX  # additive mask of an empty cache position (fp16's lowest finite value)


class KVCache:
    """Keys and values ``[1, kv_heads * head_dim, 1, context]`` per layer, named ``k<i>``/``v<i>``,
    and the mask ``[1, 1, 1, context]`` (0 where filled, :data:`MASKED` elsewhere).

    ``kv_heads`` may be fewer than the query heads (grouped-query attention): the cache holds only
    the key/value heads. ``keys[i]``/``values[i]`` are ``[width, context]`` views; ``mask`` is
    ``[context]``. All surfaces have one size, so the decode programs can bind them (ANE-13).
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, context: int, io_dtype: str,
                 min_bytes: int = 0) -> None:
        """``min_bytes``: the least surface size (a program reading these surfaces may have larger inputs)."""
        self.shape = (1, kv_heads * head_dim, 1, context)
        cache_shape = padded_shape(self.shape, io_dtype, "the KV cache")
        mask_shape = padded_shape((1, 1, 1, context), io_dtype, "the attention mask")
        elem = numpy_dtype(io_dtype).itemsize
        nbytes = max(MIN_SURFACE_BYTES, min_bytes, int(np.prod(cache_shape)) * elem, int(np.prod(mask_shape)) * elem)
        self.surfaces = {"mask": Surface(mask_shape, io_dtype, nbytes)}
        for i in range(layers):
            for kind in "kv":
                self.surfaces[f"{kind}{i}"] = Surface(cache_shape, io_dtype, nbytes)
        self.keys = [packed_view(self.surfaces[f"k{i}"].array, self.shape)[0, :, 0, :] for i in range(layers)]
        self.values = [packed_view(self.surfaces[f"v{i}"].array, self.shape)[0, :, 0, :] for i in range(layers)]
        self.mask = packed_view(self.surfaces["mask"].array, (1, 1, 1, context))[0, 0, 0, :]
        # The live-lanes hint needs the cache's positions on the lane axis (true unless it was flattened).
        self.lane_hints = cache_shape == self.shape
        self.length = 0
        self.clear()

    @property
    def context(self) -> int:
        """Positions the cache can hold."""
        return self.shape[3]

    def clear(self) -> None:
        """Forget every position."""
        self.mask[:] = MASKED
        self.length = 0

    def copy_from(self, other: KVCache) -> None:
        """Take ``other``'s filled positions (a cache of the same shape)."""
        for mine, theirs in zip(self.keys + self.values, other.keys + other.values):
            mine[:, : other.length] = theirs[:, : other.length]
        self.mask[:] = other.mask
        self.length = other.length
