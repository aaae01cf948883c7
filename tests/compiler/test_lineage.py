"""orion.graph.lineage: keys that stand for a weight's values (views of a read-only map, derivations of them)
without hashing them, and the fp16 range check's bit test (reference: numpy's isfinite)."""

from __future__ import annotations

import gc
import mmap

import numpy as np
import pytest

from orion.graph import lineage
from orion.graph.builder import _all_finite

VALUES = np.random.default_rng(3).standard_normal((2, 8, 16)).astype(np.float16)


def open_map(tmp_path) -> mmap.mmap:
    path = tmp_path / "w.bin"
    path.write_bytes(VALUES.tobytes())
    with path.open("rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def views(found: mmap.mmap) -> tuple[np.ndarray, np.ndarray]:
    return tuple(np.frombuffer(found, np.float16, 128, offset=i * 256).reshape(8, 16) for i in range(2))


def test_views_of_a_read_only_map_have_keys_by_place_shape_and_strides(tmp_path) -> None:
    found = open_map(tmp_path)
    (a, b), (a2, _) = views(found), views(found)
    assert lineage.key_of(a) == lineage.key_of(a2) != lineage.key_of(b)
    assert lineage.key_of(a.T) not in (lineage.key_of(a), None) and lineage.key_of(a[:4]) != lineage.key_of(a)
    assert lineage.key_of(np.array(a)) is None and lineage.key_of(3.0) is None  # a copy, not an array: no key


def test_a_derivation_has_its_sources_keys_and_its_result_stays_read_only(tmp_path) -> None:
    a, b = views(open_map(tmp_path))
    first = lineage.derived(np.concatenate([a, b]), "concatenate", [a, b])
    again = lineage.derived(np.concatenate([a, b]), "concatenate", [a, b])
    other = lineage.derived(np.concatenate([b, a]), "concatenate", [b, a])
    assert lineage.key_of(first) == lineage.key_of(again) != lineage.key_of(other)
    assert not first.flags.writeable and np.array_equal(first, VALUES.reshape(16, 16))
    assert lineage.key_of(first.reshape(-1)) == lineage.key_of(again.reshape(-1)) != lineage.key_of(first)
    loose = lineage.derived(np.concatenate([a, np.ones_like(a)]), "concatenate", [a, np.ones_like(a)])
    assert lineage.key_of(loose) is None  # a source without a key
    again.flags.writeable = True
    assert lineage.key_of(again) is None  # made writable: its values may change


def test_facts_are_kept_while_the_map_lives(tmp_path) -> None:
    a, b = views(open_map(tmp_path))
    key = lineage.key_of(a)
    lineage.remember(key, "seen", 1)
    lineage.remember(None, "seen", 2)  # no key: nothing to remember
    assert lineage.recall(key, "seen") == 1 and lineage.recall(lineage.key_of(b), "seen") is None
    assert lineage.recall(None, "seen") is None
    derived = lineage.derived(a * 2, "double", [a])
    lineage.remember(lineage.key_of(derived), "seen", 3)
    assert lineage.recall(lineage.key_of(derived), "seen") == 3
    del a, b, derived
    gc.collect()
    assert lineage.recall(key, "seen") is None  # forgotten with the map (a new map never reuses its number)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan, -np.nan, None])
def test_the_fp16_finite_check_agrees_with_numpy(bad) -> None:
    values = np.random.default_rng(4).standard_normal((3, (1 << 20) + 5)).astype(np.float16)
    values[0, :4] = [65504, -65504, 6e-8, -0.0]
    if bad is not None:
        values[2, -1] = bad
    for view in (values, values[:, ::3], values.T, values[:2]):
        assert _all_finite(view) == bool(np.isfinite(view).all())
    assert _all_finite(values.astype(np.float32)) == bool(np.isfinite(values).all())
    assert _all_finite(np.zeros((0, 4), np.float16))
