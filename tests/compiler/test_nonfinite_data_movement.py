"""NaN, +-inf and +-65504 through every legalization that moves data: each value reaches exactly the
positions numpy puts it at (concat, pad, the I/O padding, the KV cache's writes and bucket moves).

A 0/1 placement matrix spread one NaN over a whole row (NaN * 0 = NaN); these tests compare bit patterns
of non-finite values too, so a spread, a lost inf or a rounded 65504 fails."""

from __future__ import annotations

import numpy as np
import pytest

from orion.compiler import compile_graph
from orion.generation.kv_cache import KVCache
from orion.graph import Graph
from orion.graph.ir import Node
from orion.limits import FP16_MAX

SPECIALS = np.array([np.nan, np.inf, -np.inf, FP16_MAX, -FP16_MAX])


def specials(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Ordinary values with a sprinkling of NaN, +-inf and +-65504 (each at least once)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-4, 4, shape).astype(np.float16).astype(np.float64)
    flat = x.reshape(-1)
    where = rng.choice(flat.size, size=min(flat.size, 3 * SPECIALS.size), replace=False)
    flat[where] = np.resize(SPECIALS, where.size)
    return x


def source(g: Graph, name: str, shape: tuple[int, ...], seed: int) -> tuple[Node, dict[str, np.ndarray], np.ndarray]:
    """A node holding :func:`specials` values: programs refuse NaN inputs, so NaN is made inside as
    inf + -inf. Returns the node, its feeds and its values."""
    values = specials(shape, seed)
    nan = np.isnan(values)
    feeds = {f"{name}_a": np.where(nan, np.inf, values), f"{name}_b": np.where(nan, -np.inf, 0.0)}
    node = g.add(g.input(f"{name}_a", list(shape)), g.input(f"{name}_b", list(shape)), name=name)
    return node, feeds, values


def same(actual: np.ndarray, expected: np.ndarray) -> None:
    """Equal element for element, NaN where (and only where) numpy has NaN."""
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), err_msg="NaN positions differ")
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("io_dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("axis", [1, 3])
def test_concat_keeps_each_value_in_its_place(axis: int, io_dtype: str) -> None:
    g = Graph("cat_nonfinite")
    parts, feeds, values = zip(*(source(g, f"x{i}", (1, 8, 1, 32), seed=i) for i in range(3)), strict=True)
    g.output(g.concat(list(parts), axis=axis), "y")
    y = compile_graph(g, io_dtype=io_dtype)(**{k: v for f in feeds for k, v in f.items()})["y"]
    same(y.astype(np.float64), np.concatenate(values, axis=axis))


@pytest.mark.parametrize("io_dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("axis", [1, 3])
def test_pad_keeps_each_value_in_its_place(axis: int, io_dtype: str) -> None:
    g = Graph("pad_nonfinite")
    x, feeds, values = source(g, "x", (1, 8, 1, 32), seed=7)
    g.output(g.pad(x, axis=axis, before=3, after=5), "y")
    widths = [(0, 0)] * 4
    widths[axis] = (3, 5)
    same(compile_graph(g, io_dtype=io_dtype)(**feeds)["y"].astype(np.float64), np.pad(values, widths))


def test_slice_gradient_padding_keeps_values_in_place() -> None:
    """The pads autodiff writes for a split's gradient (gate/up, q/k/v) are the same legalization."""
    g = Graph("split_back")
    dy, feeds, values = source(g, "dy", (1, 4, 1, 32), seed=3)
    g.output(g.add(g.pad(dy, axis=1, before=0, after=4), g.pad(g.neg(dy), axis=1, before=4, after=0)), "dx")
    same(compile_graph(g)(**feeds)["dx"].astype(np.float64), np.concatenate([values, -values], axis=1))


@pytest.mark.parametrize("io_dtype", ["fp16", "fp32"])
def test_io_padding_keeps_values_in_place(io_dtype: str) -> None:
    """A [1, 2, 1, 16] input and output are packed into larger surfaces (ANE-12/-14) and back."""
    g = Graph("small_io")
    x, feeds, values = source(g, "x", (1, 2, 1, 16), seed=5)
    g.output(g.neg(x), "y")
    compiled = compile_graph(g, io_dtype=io_dtype)
    assert all(spec.padded != spec.shape for spec in compiled.layout.inputs + compiled.layout.outputs)
    same(compiled(**feeds)["y"].astype(np.float64), -values)


@pytest.mark.parametrize("io_dtype", ["fp16", "fp32"])
def test_kv_cache_writes_and_bucket_moves_keep_values(io_dtype: str) -> None:
    cache = KVCache(layers=1, kv_heads=2, head_dim=32, context=1024, buckets=(64, 256, 1024))
    dtype = np.float16 if io_dtype == "fp16" else np.float32
    expected = np.zeros((64, 300))
    for pos in range(300):
        bucket = cache.bucket_for(pos + 1)
        if bucket != cache.bucket or not cache.keys:  # the storage the decode programs of a bucket give
            cache.attach(bucket, {n: np.zeros((1, 64, 1, bucket), dtype) for n in ("k0", "v0")},
                         [np.zeros((1, 1, 1, bucket), dtype)])
        column = specials((64,), seed=pos)
        cache.keys[0][0, :, pos] = column
        cache.values[0][0, :, pos] = -column
        cache.filled(0, pos + 1)
        expected[:, pos] = column
    assert cache.bucket == 1024
    same(cache.keys[0][0, :, :300].astype(np.float64), expected)
    same(cache.values[0][0, :, :300].astype(np.float64), -expected)
