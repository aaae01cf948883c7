"""The emulator's fused chunk attention (csrc/emulator/chunk_attention.h): a prompt chunk's attention over its
KV cache plus itself (``blocks.chunk_attention``: a speculative check's drafts, a prompt read in pieces), 23
MIL ops, runs as one kernel.

It must compute exactly what the ops do, for any data. The unfused twin is the same MIL with one intermediate
(the past exponentials) also returned: an intermediate something else reads is never fused. Both are compared
as numbers (a zero's sign aside: the gemm's tiles may differ in it) and against a float64 numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from orion.graph import Graph
from orion.models.blocks import (
    WINDOW_MASK_INPUT,
    causal_mask_node,
    chunk_attention,
    window_mask_columns,
    window_mask_input,
)
from support.twins import RAN_ITS_OPS, kernel_calls, stage_twins

FUSED = "attention (chunk, fused)"


def chunk_graph(heads: int, d: int, seq: int, positions: int, window: bool = False) -> Graph:
    """q, k, v [1, H*D, 1, S], caches [1, H*D, 1, T] and the past mask ([1, 1, 1, T], or with ``window`` a row
    per query, ``[1, 1, S, T]`` from the model's window input) -> the context [1, H*D, 1, S]; the causal mask
    within the chunk a const."""
    g = Graph("chunk_attention")
    c = heads * d
    q, k, v = (g.input(n, [1, c, 1, seq]) for n in "qkv")
    kc, vc = g.input("kc", [1, c, 1, positions]), g.input("vc", [1, c, 1, positions])
    mask = window_mask_input(g, positions, seq) if window else g.input("mask", [1, 1, 1, positions])
    g.output(chunk_attention(g, q, k, v, kc, vc, mask, causal_mask_node(g, seq, None), heads), "y")
    return g



def run_both(graph: Graph, xs: dict[str, np.ndarray], hints: dict[str, int] | None) -> list[np.ndarray]:
    """Output "y" of the fused program and of its twin on ``xs``; checks which one fused."""
    outs = []
    for stage in stage_twins(graph, "exp"):
        for name, x in xs.items():
            stage.input(name)[...] = x
        calls = kernel_calls(stage, hints)
        assert (FUSED in calls and FUSED + RAN_ITS_OPS not in calls) == (not outs), calls
        outs.append(stage.output("y").copy())
    return outs


def inputs(graph_shapes: dict[str, tuple[int, ...]], filled: int, seed: int, amplitude: float = 1.0
           ) -> dict[str, np.ndarray]:
    """Random q, k, v and caches, and the past mask of the first ``filled`` positions."""
    rng = np.random.default_rng(seed)
    xs = {n: (rng.standard_normal(graph_shapes[n]) * amplitude).astype(np.float16) for n in ("q", "k", "v", "kc", "vc")}
    positions = graph_shapes["kc"][3]
    xs["mask"] = np.where(np.arange(positions) < filled, 0.0, -65504.0).reshape(1, 1, 1, positions).astype(np.float16)
    return xs


def reference(xs: dict[str, np.ndarray], heads: int, filled: int, queries: int, window: np.ndarray | None = None
              ) -> np.ndarray:
    """float64: per head and query i, softmax over the unmasked cached keys and the chunk's keys 0..i."""
    x = {n: a.astype(np.float64) for n, a in xs.items()}
    c = x["q"].shape[1]
    d = c // heads
    out = np.zeros((c, queries))
    for h in range(heads):
        rows = slice(h * d, (h + 1) * d)
        for i in range(queries):
            past = np.flatnonzero(window[0, 0, i] == 0) if window is not None else np.arange(filled)
            keys = np.concatenate([x["kc"][0, rows, 0][:, past], x["k"][0, rows, 0, :i + 1]], axis=1)
            values = np.concatenate([x["vc"][0, rows, 0][:, past], x["v"][0, rows, 0, :i + 1]], axis=1)
            s = x["q"][0, rows, 0, i] @ keys / np.sqrt(d)
            p = np.exp(s - s.max())
            out[rows, i] = values @ (p / p.sum())
    return out


def shapes(heads: int, d: int, seq: int, positions: int) -> dict[str, tuple[int, ...]]:
    """The inputs' shapes."""
    c = heads * d
    return {"q": (1, c, 1, seq), "k": (1, c, 1, seq), "v": (1, c, 1, seq), "kc": (1, c, 1, positions),
            "vc": (1, c, 1, positions)}


@pytest.mark.parametrize("heads, d, seq, positions, filled", [(3, 64, 8, 256, 170), (2, 32, 64, 100, 100),
                                                              (4, 16, 3, 64, 1), (1, 64, 300, 260, 200)])
def test_chunk_attention_is_its_ops(heads, d, seq, positions, filled) -> None:
    """A speculative check's bucket (8 queries over SmolLM2's head groups), a full cache, a chunk of 3 (the gemm's
    streamed rows), and chunk and cache longer than the gemm's 256-long K slices. Reference: float64, within fp16
    rounding of the ~20 steps."""
    graph = chunk_graph(heads, d, seq, positions)
    xs = inputs(shapes(heads, d, seq, positions), filled, seed=heads + seq)
    fused, unfused = run_both(graph, xs, None)
    np.testing.assert_array_equal(fused, unfused)
    np.testing.assert_allclose(fused[0, :, 0].astype(np.float64), reference(xs, heads, filled, seq), rtol=0, atol=0.02)


def test_chunk_attention_with_live_lanes() -> None:
    """3 drafts checked in an 8-token bucket over a cache live on 96 of 256 positions (the hints a check gives):
    the kernel computes the 3 live queries and reads nothing dead (NaN there), their lanes equal to the ops'."""
    heads, d, seq, positions, live, filled = 3, 64, 8, 256, 96, 90
    xs = inputs(shapes(heads, d, seq, positions), filled, seed=11)
    queries = 3
    for n in ("q", "k", "v"):
        xs[n][..., queries:] = np.nan
    for n in ("kc", "vc"):
        xs[n][..., live:] = np.nan
    hints = {"q": queries, "k": queries, "v": queries, "kc": live, "vc": live, "mask": live}
    fused, unfused = run_both(chunk_graph(heads, d, seq, positions), xs, hints)
    np.testing.assert_array_equal(fused[..., :queries], unfused[..., :queries])
    assert np.isfinite(fused[..., :queries]).all()
    np.testing.assert_allclose(fused[0, :, 0, :queries].astype(np.float64),
                               reference(xs, heads, filled, queries), rtol=0, atol=0.02)


def test_chunk_attention_with_a_window_mask_per_query() -> None:
    """A sliding window's past mask, one row per query ([1, 1, S, T]: Gemma's and Mistral's local layers)."""
    heads, d, seq, positions, cached = 2, 32, 16, 64, 50
    columns = window_mask_columns(range(cached, cached + seq), cached, positions, 20)  # [T, S]
    xs = inputs(shapes(heads, d, seq, positions), cached, seed=3)
    del xs["mask"]
    xs[WINDOW_MASK_INPUT] = columns.astype(np.float16).reshape(1, positions, 1, seq)
    fused, unfused = run_both(chunk_graph(heads, d, seq, positions, window=True), xs, None)
    window = columns.T.reshape(1, 1, seq, positions)
    np.testing.assert_array_equal(fused, unfused)
    np.testing.assert_allclose(fused[0, :, 0].astype(np.float64), reference(xs, heads, cached, seq, window),
                               rtol=0, atol=0.02)


def test_chunk_attention_overflow_is_the_ops_overflow() -> None:
    """Activations so large that scores overflow fp16 (inf, then NaN in the softmax): the kernel gives the ops'
    values there too, NaNs and infinities included."""
    heads, d, seq, positions = 2, 32, 8, 64
    xs = inputs(shapes(heads, d, seq, positions), 40, seed=5, amplitude=300.0)
    fused, unfused = run_both(chunk_graph(heads, d, seq, positions), xs, None)
    assert not np.isfinite(unfused).all()  # the case is reached
    np.testing.assert_array_equal(fused, unfused)
