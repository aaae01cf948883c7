"""Shared prompt prefixes: the keys and values of prompts already computed, kept so that a later prompt
starting with the same tokens (a system prompt, a chat history) copies those positions into its KV cache
instead of recomputing them; only the rest runs, through the chunk programs (``CausalLM.extend``'s path).

Positions depend only on the tokens up to them, so any common prefix of a stored prompt and a new one
is reusable: a prefill takes the stored prompt sharing the longest prefix with it (at least
``min_tokens``, and never the whole prompt: its last position must run to give the logits). Every
prefill stores its prompt; a stored prompt that the new one extends is replaced by it.

The store is bounded by bytes (``max_bytes``: the fp16 keys and values held, ``2 x layers x kv_width
x 2`` bytes a position, 36 KiB for GPT-2 124M), least recently used first out. Entries are per active
LoRA adapter (the adapter changes the keys and values). One cache serves one model and its forks
(they share it; a lock guards it), never two models.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from orion.errors import OrionError

if TYPE_CHECKING:
    from orion.generation.loop import CausalLM

DEFAULT_MIN_TOKENS = 16  # shorter common prefixes are recomputed: a chunk run costs about as much


class PrefixCacheError(OrionError, ValueError):
    """A prefix-cache setting makes no sense."""


@dataclass
class _Entry:
    ids: tuple[int, ...]
    keys: list[np.ndarray]  # per layer [kv_width, len(ids)], the cache's dtype
    values: list[np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys + self.values)


@dataclass
class PrefixCacheStats:
    """Lookups that reused a prefix, positions reused, and entries dropped for room."""

    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    evicted: int = 0


@dataclass
class PrefixCache:
    """Computed prompts' keys and values for reuse, at most ``max_bytes`` of them (least recently used out)."""

    max_bytes: int
    min_tokens: int = DEFAULT_MIN_TOKENS
    stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)

    def __post_init__(self) -> None:
        for name in ("max_bytes", "min_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise PrefixCacheError(f"PrefixCache {name}={value!r}: use a positive integer")
        self._entries: OrderedDict[tuple[str | None, tuple[int, ...]], _Entry] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values held."""
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()

    def reusable(self, model: CausalLM, ids: list[int]) -> int:
        """The positions :meth:`restore` would fill for ``ids`` (0: none), without copying them or counting a lookup
        (a batch reads prompts with none together, ``CausalLM._read_packed``)."""
        with self._lock:
            return self._longest(model, ids)[1]

    def _longest(self, model: CausalLM, ids: list[int]) -> tuple[tuple[str | None, tuple[int, ...]] | None, int]:
        """The key of the stored prompt sharing the longest reusable prefix with ``ids``, and its length (None, 0:
        none of ``min_tokens``). The caller holds the lock."""
        best, reuse = None, 0
        for key, entry in self._entries.items():
            if key[0] != model.active_adapter:
                continue
            n = _common_prefix(entry.ids, ids, len(ids) - 1)
            if n > reuse:
                best, reuse = key, n
        return (None, 0) if best is None or reuse < self.min_tokens else (best, reuse)

    def restore(self, model: CausalLM, ids: list[int], lane: int = 0) -> int:
        """Copy into lane ``lane`` (empty) of ``model``'s KV cache the longest stored prefix of ``ids`` (not all
        of them: the last position must run); returns the positions filled (0 when none of ``min_tokens`` is
        stored)."""
        with self._lock:
            self.stats.lookups += 1
            best, reuse = self._longest(model, ids)
            if best is None:
                return 0
            self._entries.move_to_end(best)
            entry = self._entries[best]
            cache = model.cache
            model._reserve(len(ids))  # the bucket the whole prompt will take
            for mine, stored in zip(cache.keys + cache.values, entry.keys + entry.values):
                mine[lane, :, :reuse] = stored[:, :reuse]
            cache.filled(lane, reuse)
            self.stats.hits += 1
            self.stats.reused_tokens += reuse
            return reuse

    def store(self, model: CausalLM, ids: list[int], lane: int = 0) -> None:
        """Keep the keys and values of prompt ``ids`` (just computed into lane ``lane`` of ``model``'s cache); a stored prompt
        that ``ids`` extends is replaced. Prompts shorter than ``min_tokens`` or larger than the whole budget
        are not kept."""
        cache = model.cache
        n = len(ids)
        if n < self.min_tokens or n > cache.lengths[lane]:
            return
        entry = _Entry(tuple(ids), [k[lane, :, :n].copy() for k in cache.keys],
                       [v[lane, :, :n].copy() for v in cache.values])
        if entry.nbytes > self.max_bytes:
            return
        adapter = model.active_adapter
        with self._lock:
            for key in [k for k, e in self._entries.items() if k[0] == adapter and e.ids == entry.ids[:len(e.ids)]]:
                del self._entries[key]  # a prefix of the new prompt: the new entry holds all of it
            self._entries[(adapter, entry.ids)] = entry
            held = sum(e.nbytes for e in self._entries.values())
            while held > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                held -= dropped.nbytes
                self.stats.evicted += 1


def _common_prefix(a: tuple[int, ...], b: list[int], limit: int) -> int:
    """The length of the common prefix of ``a`` and ``b``, at most ``limit``."""
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n
