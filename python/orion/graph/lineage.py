"""What a weight's values are a function of: a key that stands for them, so work on them is done once.

A model's weights are views of a read-only checkpoint map (their values cannot change while it is open)
or arrays computed from such views (a fused projection stacks several, a query group takes some rows):
:func:`derived` records the computation and makes its result read-only. :func:`key_of` names any view of
either by where its values come from (the map or the derivation, the view's place, shape, strides and
dtype; a derivation by its operation and its sources' keys), never by hashing them. Equal keys mean
equal values, so what was learnt about one array holds for every array of the same key: :func:`recall`
and :func:`remember` keep such facts (the values are finite, the SHA-256 of the weight file written from
them, the read-only map of that file) for as long as the source maps are open.
The decode programs and every prefill bucket of a model bake the same layer weights: each is checked,
serialized and hashed once per process, not once per program.

Any other array (computed, writable) has no key and is handled afresh every time. Once a map's file is hashed
(:func:`name_source`), :func:`stable` names the keys of its values in any process (the program cache names the
weight files written from them so, instead of hashing those files).
"""

from __future__ import annotations

import hashlib
import itertools
import mmap
import weakref
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

Key = tuple
_TOKENS: weakref.WeakKeyDictionary[mmap.mmap, int] = weakref.WeakKeyDictionary()  # a map's number, never reused
_COUNTER = itertools.count()
_FACTS: dict[int, dict[tuple[Key, str], Any]] = {}  # per source map's number (dropped with the map): facts by key
_DERIVED: dict[int, tuple[weakref.ref, Key]] = {}  # id(array) -> (the array, its key), while the array lives
_NAMES: dict[int, str] = {}  # per source map's number: a name its bytes alone determine (name_source)


def _token(found: mmap.mmap) -> int:
    token = _TOKENS.get(found)
    if token is None:
        token = _TOKENS[found] = next(_COUNTER)
        _FACTS[token] = {}
        weakref.finalize(found, _forget_map, token)
    return token


def _forget_map(token: int) -> None:
    _FACTS.pop(token, None)
    _NAMES.pop(token, None)


def name_source(found: mmap.mmap, name: str) -> None:
    """Records ``name`` as standing for the bytes of the read-only map ``found`` in any process (the SHA-256 of
    the file it maps, as hashed from the mapped version), so that :func:`stable` can name its keys."""
    _NAMES[_token(found)] = name


def stable(key: Key | None) -> str | None:
    """A text naming the values of ``key`` in any process: the key with each source map's number replaced by
    the name :func:`name_source` recorded for it (None when a map has none, or for no key). Equal texts mean
    equal values as long as every derivation is computed by the same code (the caller's part: the program
    cache names weight files by it together with the compiler's fingerprint)."""
    def named(k: Key) -> Key:
        if k[0] == "map":
            return ("file", _NAMES[k[1]], *k[2:])
        if k[0] == "view":
            return ("view", named(k[1]), *k[2:])
        return ("derived", k[1], tuple(named(s) for s in k[2]), k[3])

    try:
        return None if key is None else repr(named(key))
    except KeyError:
        return None


def key_of(array: Any) -> Key | None:
    """The key of ``array``'s values: for a view of an open read-only map, its place in the map; for an
    array :func:`derived` recorded, its derivation; else None."""
    if not isinstance(array, np.ndarray):
        return None
    view = (array.shape, array.strides, array.dtype.str)
    owner: Any = array
    for _ in range(16):  # an array, a view of it, a view of that... (numpy collapses most chains to one step)
        entry = _DERIVED.get(id(owner))
        if entry is not None and entry[0]() is owner:
            if owner.flags.writeable:  # made writable again since: its values may have changed
                return None
            return entry[1] if owner is array else ("view", entry[1], array.ctypes.data - owner.ctypes.data, *view)
        if isinstance(owner, mmap.mmap):
            if owner.closed or not memoryview(owner).readonly:
                return None
            start = np.frombuffer(owner, dtype=np.uint8, count=1).ctypes.data
            return ("map", _token(owner), array.ctypes.data - start, *view)
        owner = owner.obj if isinstance(owner, memoryview) else getattr(owner, "base", None)
        if owner is None:
            return None
    return None


def derived(result: np.ndarray, operation: str, sources: Sequence[np.ndarray], *params: Hashable) -> np.ndarray:
    """``result``, computed by ``operation`` (with ``params``) from ``sources`` alone, made read-only and
    recorded under a key made of those (when every source has a key). The caller vouches that the
    computation is deterministic and reads nothing else. ``result`` must own its data or view a buffer that is
    not an array: numpy makes a view of a view point at the first array, so views of ``result`` (a reshape for a
    conv weight) could not be traced to it."""
    if isinstance(result.base, np.ndarray):
        raise ValueError(f"lineage.derived({operation!r}): the result is a view of another array, so views of it "
                         "would not be traced to it; pass an array owning its data (np.take, not fancy indexing "
                         "past the first axis) or a view of a buffer (np.ndarray(buffer=...))")
    result.flags.writeable = False
    keys = [key_of(s) for s in sources]
    if all(k is not None for k in keys):
        key = ("derived", operation, tuple(keys), params)  # type: ignore[arg-type]
        array_id = id(result)
        _DERIVED[array_id] = (weakref.ref(result, lambda _ref: _forget(array_id, _ref)), key)
    return result


def index_key(indices: np.ndarray) -> tuple:
    """A short parameter of :func:`derived` standing for an index array (its dtype, shape and SHA-256)."""
    indices = np.ascontiguousarray(indices)
    return indices.dtype.str, indices.shape, hashlib.sha256(indices.tobytes()).digest()


def _forget(array_id: int, ref: weakref.ref) -> None:
    entry = _DERIVED.get(array_id)
    if entry is not None and entry[0] is ref:
        del _DERIVED[array_id]


def _facts(key: Key) -> dict[tuple[Key, str], Any] | None:
    """The facts of the map ``key`` starts from (its first source's, for a derivation)."""
    while key[0] != "map":
        key = key[1] if key[0] == "view" else key[2][0]
    return _FACTS.get(key[1])


def recall(key: Key | None, fact: str) -> Any:
    """What :func:`remember` recorded as ``fact`` of the values of ``key`` (None when nothing)."""
    facts = None if key is None else _facts(key)
    return None if facts is None else facts.get((key, fact))


def remember(key: Key | None, fact: str, value: Any) -> None:
    """Records ``value`` as ``fact`` of the values of ``key`` (nothing when ``key`` is None), for as long
    as the map they come from is open."""
    facts = None if key is None else _facts(key)
    if facts is not None:
        facts[(key, fact)] = value
