"""The KV cache: every layer's keys and values in persistent surfaces the decode programs bind as
inputs, the additive attention mask, and how many positions are filled.

The cache is sized to use: its tensors are ``[1, width, 1, T]`` for the current *bucket* ``T``, the
shortest of :func:`context_buckets` that holds the filled positions. The surfaces have the
full context's size from the start (one size for every decode input, ANE-13), but a surface of
256 KiB or more is an anonymous map whose untouched pages cost no memory, and a bucket's tensors are
packed at the front: a cache holding ``n`` positions has touched ``width * T`` values per surface,
not ``width * context``. Growing to the next bucket moves each row to its new place in the same
surface. Decode programs exist per bucket (``DecodePlan.layers_at``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from orion.limits import FP16_MAX, MIN_SURFACE_BYTES
from orion.passes.io_padding import padded_shape
from orion.runtime.dtypes import numpy_dtype
from orion.runtime.packing import packed_view
from orion.runtime.surface import Surface

MASKED = -FP16_MAX  # additive mask of an empty cache position (fp16's lowest finite value)
FIRST_BUCKET = 64  # positions of the shortest cache (when its surfaces keep the lane layout)
BUCKET_GROWTH = 4  # each bucket holds 4x the last: memory within 4x of the positions held, and for a
#                    1024 context three sets of decode programs (64, 256, 1024) against the compile budget (ANE-11)


def context_buckets(width: int, context: int, io_dtype: str) -> tuple[int, ...]:
    """The cache lengths decode programs are built for, shortest first, the last ``context``.

    Each is a power of two (a softmax over the cache needs one, ANE-08) from :data:`FIRST_BUCKET` up
    by :data:`BUCKET_GROWTH`; a length whose ``[1, width, 1, T]`` surface
    would be flattened by the I/O padding (too few bytes or lanes) is skipped, so every bucket keeps
    the positions on the lane axis (the emulator's live-lanes hint, ``KVCache.lane_hints``)."""
    buckets, t = [], FIRST_BUCKET
    while t < context:
        if padded_shape((1, width, 1, t), io_dtype, "the KV cache") == (1, width, 1, t):
            buckets.append(t)
        t *= BUCKET_GROWTH
    return (*buckets, context)


class KVCache:
    """Keys and values per layer, named ``k<i>``/``v<i>``, and the mask (0 where filled, :data:`MASKED`
    elsewhere), for up to ``context`` positions in ``buckets`` (default: one, the context).

    ``kv_heads`` may be fewer than the query heads (grouped-query attention): the cache holds only
    the key/value heads. ``shape`` is the full context's ``[1, width, 1, context]``; ``bucket`` the
    current length ``T``; ``keys[i]``/``values[i]`` are ``[width, T]`` views and ``mask`` is ``[T]``.
    All surfaces have one size, so the decode programs can bind them (ANE-13).
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, context: int, io_dtype: str,
                 min_bytes: int = 0, buckets: Sequence[int] | None = None) -> None:
        """``min_bytes``: the least surface size (a program reading these surfaces may have larger inputs)."""
        self.shape = (1, kv_heads * head_dim, 1, context)
        self.buckets = tuple(buckets or (context,))
        if list(self.buckets) != sorted(set(self.buckets)) or self.buckets[-1] != context:
            raise ValueError(f"KVCache buckets {self.buckets}: give increasing lengths ending at the context {context}")
        cache_shape = padded_shape(self.shape, io_dtype, "the KV cache")
        mask_shape = padded_shape((1, 1, 1, context), io_dtype, "the attention mask")
        elem = numpy_dtype(io_dtype).itemsize
        nbytes = max(MIN_SURFACE_BYTES, min_bytes, int(np.prod(cache_shape)) * elem, int(np.prod(mask_shape)) * elem)
        self._full = {"mask": Surface(mask_shape, io_dtype, nbytes)}  # the surfaces; ``surfaces``: views at the bucket
        for i in range(layers):
            for kind in "kv":
                self._full[f"{kind}{i}"] = Surface(cache_shape, io_dtype, nbytes)
        self.layers, self.io_dtype = layers, io_dtype
        # The live-lanes hint needs the cache's positions on the lane axis (true unless it was flattened).
        self.lane_hints = cache_shape == self.shape
        self.length = 0
        self._use(self.buckets[0])
        self.clear()

    @property
    def context(self) -> int:
        """Positions the cache can hold."""
        return self.shape[3]

    def clear(self) -> None:
        """Forget every position."""
        self.mask[:] = MASKED
        self.length = 0

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` filled positions and forget the rest: the mask hides them from every
        program that reads the cache, and the next positions written overwrite them."""
        if not 0 <= n <= self.length:
            raise ValueError(f"KVCache.truncate({n}): the cache holds {self.length} positions")
        self.mask[n:self.length] = MASKED
        self.length = n

    def reserve(self, n: int) -> None:
        """Make room for ``n`` positions: the shortest bucket holding them when the cache is empty (it
        may shrink), else, when they do not fit, the next buckets, the filled positions kept."""
        if n > self.context:
            raise ValueError(f"KVCache.reserve({n}): the context is {self.context} positions")
        if self.length and n <= self.bucket:
            return
        bucket = next(t for t in self.buckets if t >= max(n, self.length))
        if bucket != self.bucket:
            self._use(bucket)

    def copy_from(self, other: KVCache) -> None:
        """Take ``other``'s filled positions (a cache of the same shape and buckets)."""
        self.length = 0
        if other.bucket != self.bucket:
            self._use(other.bucket)
        for mine, theirs in zip(self.keys + self.values, other.keys + other.values):
            mine[:, : other.length] = theirs[:, : other.length]
        self.mask[:] = other.mask
        self.length = other.length

    def _use(self, bucket: int) -> None:
        """Switch to length ``bucket``: each filled row moves to its place in the new layout (numpy copies
        overlapping views as if through a temporary), and the mask covers the new length."""
        width, n = self.shape[1], self.length
        for i in range(self.layers):
            for kind in "kv":
                flat = self._full[f"{kind}{i}"].array.reshape(-1)
                if n:
                    flat[: width * bucket].reshape(width, bucket)[:, :n] = flat[: width * self.bucket].reshape(
                        width, self.bucket)[:, :n]
        self.bucket = bucket
        rows = (1, width, 1, bucket)
        cache_shape = padded_shape(rows, self.io_dtype, "the KV cache")
        mask_shape = padded_shape((1, 1, 1, bucket), self.io_dtype, "the attention mask")
        self.surfaces = {name: s.view_as(mask_shape if name == "mask" else cache_shape) for name, s in self._full.items()}
        self.keys = [packed_view(self.surfaces[f"k{i}"].array, rows)[0, :, 0, :] for i in range(self.layers)]
        self.values = [packed_view(self.surfaces[f"v{i}"].array, rows)[0, :, 0, :] for i in range(self.layers)]
        self.mask = packed_view(self.surfaces["mask"].array, (1, 1, 1, bucket))[0, 0, 0, :]
        self.mask[:] = MASKED
        self.mask[:n] = 0.0
