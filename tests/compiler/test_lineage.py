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


def test_the_models_derivations_keep_their_keys_through_a_reshape(tmp_path) -> None:
    """A conv weight is a reshaped view of the linear's: it must still be traced to its derivation (a query group's
    columns, a fused projection's stack on huge pages). numpy points a view of a view at the first array, so a
    derivation that is itself a view of another array is refused (its reshapes had no key: Qwen2.5-0.5B's prefill
    hashed and stored 457 MB of weight files again)."""
    from orion.models.blocks import BakedParams
    from orion.models.llama.graphs import group_split

    a, b = views(open_map(tmp_path))
    rows = np.arange(4, 8)
    wq_g, wo_g = group_split(a, b, rows)
    np.testing.assert_array_equal(wo_g, b[:, rows])
    big = tmp_path / "big.bin"  # a stack of 4 MiB: on huge pages (an anonymous map), not np.empty
    big.write_bytes(np.arange(2 << 20, dtype=np.float16).tobytes())
    with big.open("rb") as f:
        found = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    top, bottom = (np.frombuffer(found, np.float16, 1 << 20, offset=i << 21).reshape(1024, 1024) for i in range(2))
    stacked = BakedParams({"top": top, "bottom": bottom}, {}, None, "fp16")._stacked(["top", "bottom"])
    np.testing.assert_array_equal(stacked, np.arange(2 << 20, dtype=np.float16).reshape(2048, 1024))
    for derived, shape in ((wq_g, (4, 16, 1, 1)), (wo_g, (8, 4, 1, 1)), (stacked, (2048, 1024, 1, 1))):
        assert lineage.key_of(derived) is not None
        assert lineage.key_of(derived.reshape(shape)) == lineage.key_of(np.reshape(derived, shape)) is not None
    with pytest.raises(ValueError, match="view of another array"):
        lineage.derived(b[:, rows], "columns", [b], lineage.index_key(rows))  # fancy indexing past axis 0: a view


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
