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
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = sum(a.nbytes for a in self.keys + self.values)


_Key = tuple[str | None, tuple[int, ...]]  # (adapter, prompt ids)


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
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()
        # The entries by adapter and first min_tokens ids: a reusable prefix (min_tokens or more) starts with them,
        # so a lookup reads only the entries that could give one, not the whole store.
        self._by_start: dict[_Key, set[_Key]] = {}
        self._held = 0  # bytes of the entries
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values held."""
        with self._lock:
            return self._held

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self._by_start.clear()
            self._held = 0

    def _start(self, adapter: str | None, ids: tuple[int, ...] | list[int]) -> _Key:
        return adapter, tuple(ids[:self.min_tokens])

    def _drop(self, key: _Key) -> None:
        """Remove entry ``key``; the caller holds the lock."""
        self._held -= self._entries.pop(key).nbytes
        start = self._start(*key)
        self._by_start[start].discard(key)
        if not self._by_start[start]:
            del self._by_start[start]

    def reusable(self, model: CausalLM, ids: list[int]) -> int:
        """The positions :meth:`restore` would fill for ``ids`` (0: none), without copying them or counting a lookup
        (a batch reads prompts with none together, ``CausalLM._read_packed``)."""
        with self._lock:
            return self._longest(model, ids)[1]

    def _longest(self, model: CausalLM, ids: list[int]) -> tuple[tuple[str | None, tuple[int, ...]] | None, int]:
        """The key of the stored prompt sharing the longest reusable prefix with ``ids``, and its length (None, 0:
        none of ``min_tokens``). The caller holds the lock."""
        best, reuse = None, 0
        if len(ids) <= self.min_tokens:  # the last position always runs: min_tokens reused needs one more
            return None, 0
        for key in self._by_start.get(self._start(model.active_adapter, ids), ()):
            n = _common_prefix(key[1], ids, len(ids) - 1)
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
        key, start = (adapter, entry.ids), self._start(adapter, entry.ids)
        with self._lock:
            for old in [k for k in self._by_start.get(start, ()) if k[1] == entry.ids[:len(k[1])]]:
                self._drop(old)  # a prefix of the new prompt (or the same prompt): the new entry holds all of it
            self._entries[key] = entry
            self._by_start.setdefault(start, set()).add(key)
            self._held += entry.nbytes
            while self._held > self.max_bytes:
                self._drop(next(iter(self._entries)))
                self.stats.evicted += 1


def _common_prefix(a: tuple[int, ...], b: list[int], limit: int) -> int:
    """The length of the common prefix of ``a`` and ``b``, at most ``limit``."""
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n
