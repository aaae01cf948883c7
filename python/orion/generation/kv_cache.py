"""The KV cache: every layer's keys and values and the additive attention masks of up to ``lanes``
sequences (one per lane of the decode programs), and how many positions each has filled.

The cache has no storage of its own: it lives in the decode layer programs' input surfaces. Under
the one-input rule (ANE-37) the I/O packing lays a layer program's inputs (the residual stream
``x``, the mask, rotary tables and each of its layers' caches) in one surface, so the cache rows are
bytes of that surface, and a decode step writes only the new tokens' keys and values at their
positions (``attach`` takes the views; without packing they are the caches' own surfaces).

Layout: ``k<i>``/``v<i>`` are ``[1, lanes * width, 1, T]`` (lane ``b``'s ``[width, T]`` block after
lane ``b - 1``'s, position on the lane axis, so the live-lanes hint skips unfilled positions) and
``mask`` ``[1, lanes, 1, T]``, for the current *bucket* ``T``: the shortest of
:func:`context_buckets` that holds the positions of every lane. Growing to the next bucket binds
the programs of that bucket and moves each filled row into their surfaces (``attach``). Memory:
``2 * layers * lanes * width * T`` fp16 values, within ``BUCKET_GROWTH`` x of the positions held by
the longest sequence.

Copies: a chunk program reads a lane's first positions from inputs of its own (``CausalLM.extend``);
``copied`` tells it how many of them it already holds unchanged since its last run, so a speculative
check copies only the positions added since the last one (a full copy is 30 layers' keys and values
for SmolLM2-135M: 7 ms of a 145 ms decode step under load).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from orion.limits import FP16_MAX
from orion.passes.io_padding import padded_shape

MASKED = -FP16_MAX  # additive mask of an empty cache position (fp16's lowest finite value)
FIRST_BUCKET = 64  # positions of the shortest cache (when its surfaces keep the lane layout)
BUCKET_GROWTH = 4  # each bucket holds 4x the last: memory within 4x of the positions held, and for a
#                    1024 context three sets of decode programs (64, 256, 1024) against the compile budget (ANE-11)


def context_buckets(width: int, context: int, io_dtype: str) -> tuple[int, ...]:
    """The cache lengths decode programs are built for, shortest first, the last ``context``.

    Each is a power of two (a softmax over the cache needs one, ANE-08) from :data:`FIRST_BUCKET` up
    by :data:`BUCKET_GROWTH`; a length whose ``[1, width, 1, T]`` surface
    would be flattened by the I/O padding (too few bytes or lanes) is skipped, so every bucket keeps
    the positions on the lane axis (the emulator's live-lanes hint)."""
    buckets, t = [], FIRST_BUCKET
    while t < context:
        if padded_shape((1, width, 1, t), io_dtype, "the KV cache") == (1, width, 1, t):
            buckets.append(t)
        t *= BUCKET_GROWTH
    return (*buckets, context)


class KVCache:
    """Keys and values per layer (``k<i>``/``v<i>``) and the masks (0 where filled, :data:`MASKED`
    elsewhere) of ``lanes`` sequences of up to ``context`` positions each, in ``buckets`` (default:
    one, the context). ``kv_heads`` may be fewer than the query heads (grouped-query attention): the
    cache holds only the key/value heads.

    ``keys[i]``/``values[i]`` are ``[lanes, width, T]`` views and ``masks`` one ``[lanes, T]`` view per
    layer program (each program reads its own copy of the mask); ``lengths[b]`` is lane ``b``'s filled
    positions. Nothing is readable before ``attach`` gives the views.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, context: int,
                 buckets: Sequence[int] | None = None, lanes: int = 1) -> None:
        self.layers, self.width, self.context, self.lanes = layers, kv_heads * head_dim, context, lanes
        self.buckets = tuple(buckets or (context,))
        if list(self.buckets) != sorted(set(self.buckets)) or self.buckets[-1] != context:
            raise ValueError(f"KVCache buckets {self.buckets}: give increasing lengths ending at the context {context}")
        self.lengths = np.zeros(lanes, dtype=np.int64)
        self.bucket = self.buckets[0]
        self.keys: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []
        self._copies: dict[int, tuple[object, int, int]] = {}  # id(holder) -> (holder, lane, positions held)

    @property
    def length(self) -> int:
        """Positions filled by lane 0 (the only lane of a single-sequence model)."""
        return int(self.lengths[0])

    @length.setter
    def length(self, n: int) -> None:
        self.lengths[0] = n

    @property
    def longest(self) -> int:
        """The most positions any lane holds."""
        return int(self.lengths.max())

    def bucket_for(self, n: int) -> int:
        """The bucket that holds ``n`` positions and every lane's filled ones (``n`` at most the context)."""
        if n > self.context:
            raise ValueError(f"KVCache: {n} positions; the context is {self.context}")
        return next(t for t in self.buckets if t >= max(n, self.longest))

    def attach(self, bucket: int, tensors: Mapping[str, np.ndarray], masks: Sequence[np.ndarray]) -> None:
        """Take new storage of length ``bucket``: ``tensors`` by graph name (``k<i>``/``v<i>``, each
        ``[1, lanes * width, 1, bucket]``) and ``masks`` (``[1, lanes, 1, bucket]``), views of the decode
        programs' input surfaces. Every lane's filled positions move there."""
        keys = [tensors[f"k{i}"].reshape(self.lanes, self.width, bucket) for i in range(self.layers)]
        values = [tensors[f"v{i}"].reshape(self.lanes, self.width, bucket) for i in range(self.layers)]
        masks = [m.reshape(self.lanes, bucket) for m in masks]
        for new, old in zip(keys + values, self.keys + self.values):
            for lane, n in enumerate(self.lengths):
                new[lane, :, :n] = old[lane, :, :n]
        self.keys, self.values, self.masks, self.bucket = keys, values, masks, bucket
        for lane, n in enumerate(self.lengths):
            self._mask(lane, int(n))

    def copied(self, holder: object, lane: int, n: int) -> int:
        """How many of lane ``lane``'s first ``n`` positions ``holder`` (a copy of a lane's first positions, e.g. a
        chunk program's cache inputs) still holds unchanged from its last ``copied`` call; records that it now holds
        the first ``n`` (the caller copies the rest)."""
        record = self._copies.get(id(holder))
        same = record[2] if record is not None and record[0] is holder and record[1] == lane else 0
        self._copies[id(holder)] = (holder, lane, n)
        return min(same, n)

    def clear(self, lane: int | None = None) -> None:
        """Forget every position of ``lane`` (None: of every lane)."""
        for b in range(self.lanes) if lane is None else (lane,):
            self.lengths[b] = 0
            self._mask(b, 0)
            self._changed(b, 0)

    def filled(self, lane: int, n: int) -> None:
        """Lane ``lane`` now holds positions ``0..n-1`` (their keys and values were written)."""
        old = int(self.lengths[lane])
        self.lengths[lane] = n
        if n < old:
            self._mask(lane, n)
            self._changed(lane, n)  # the positions from n on will be written again
        for mask in self.masks:
            mask[lane, old:n] = 0.0

    def appended(self, lanes: Sequence[int]) -> None:
        """Each of ``lanes`` now holds one more position (a decode step wrote its key and value there): ``filled``
        of every lane at once, one assignment per mask instead of one per lane and mask."""
        at = self.lengths[lanes]
        self.lengths[lanes] = at + 1
        for mask in self.masks:
            mask[lanes, at] = 0.0

    def copy_lane(self, source: KVCache, source_lane: int, lane: int) -> None:
        """Lane ``lane`` takes ``source``'s lane ``source_lane`` (a cache of the same shape and bucket)."""
        n = int(source.lengths[source_lane])
        for mine, theirs in zip(self.keys + self.values, source.keys + source.values):
            mine[lane, :, :n] = theirs[source_lane, :, :n]
        self._changed(lane, 0)
        self.filled(lane, n)

    def _changed(self, lane: int, n: int) -> None:
        """Lane ``lane``'s positions from ``n`` on are no longer what the copies of them hold."""
        for key, (holder, held_lane, held) in self._copies.items():
            if held_lane == lane and held > n:
                self._copies[key] = (holder, held_lane, n)

    def _mask(self, lane: int, n: int) -> None:
        for mask in self.masks:
            mask[lane, :n] = 0.0
            mask[lane, n:] = MASKED
