"""Every legalization: a graph using the high-level op becomes conservative-dialect ops only and matches an
independent numpy reference (in numpy on the legalized IR, and on the emulator once it is merged)."""

from __future__ import annotations

import numpy as np
import pytest

from orion.graph import Graph
from orion.legalize import legalize
from orion.ops import causal_mask
from support.compiler import reference as ref
from support.compiler.checks import run, tolerance

RNG = np.random.default_rng(1234)
C, S = 64, 32


def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def unary_graph(op: str) -> Graph:
    g = Graph(op)
    g.output(getattr(g, op)(g.input("x", [1, C, 1, S])), "y")
    return g


def test_gelu(mode: str) -> None:
    """ANE-02: gelu is rejected, so it becomes the tanh approximation."""
    x = rand(1, C, 1, S, scale=2)
    y = run(unary_graph("gelu"), mode, x=x)["y"]
    np.testing.assert_allclose(y, ref.gelu(x), atol=2e-3 if mode == "ir" else 3e-2, rtol=2e-2)  # tanh approx


def test_silu(mode: str) -> None:
    x = rand(1, C, 1, S, scale=2)
    np.testing.assert_allclose(run(unary_graph("silu"), mode, x=x)["y"], ref.silu(x), **tolerance(mode))


def test_rsqrt_sqrt(mode: str) -> None:
    """ANE-03: rsqrt and sqrt are rejected, so they become pow."""
    x = np.abs(rand(1, C, 1, S)) + 0.5
    np.testing.assert_allclose(run(unary_graph("rsqrt"), mode, x=x)["y"], 1 / np.sqrt(x), **tolerance(mode))
    np.testing.assert_allclose(run(unary_graph("sqrt"), mode, x=x)["y"], np.sqrt(x), **tolerance(mode))
    assert {n.op for n in legalize(unary_graph("rsqrt")).nodes} == {"input", "const", "pow"}


def test_neg(mode: str) -> None:
    x = rand(1, C, 1, S)
    np.testing.assert_allclose(run(unary_graph("neg"), mode, x=x)["y"], -x, **tolerance(mode))
    assert "mul" in {n.op for n in legalize(unary_graph("neg")).nodes}


def test_div(mode: str) -> None:
    """ANE-30: real_div is rejected, so div becomes a mul by 1/c or by pow(y, -1)."""
    g = Graph("div")
    x, z = g.input("x", [1, C, 1, S]), g.input("z", [1, C, 1, S])
    g.output(g.div(x, 4.0), "by_const")
    g.output(g.div(x, z), "by_value")
    xv, zv = rand(1, C, 1, S), np.abs(rand(1, C, 1, S)) + 1
    out = run(g, mode, x=xv, z=zv)
    np.testing.assert_allclose(out["by_const"], xv / 4, **tolerance(mode))
    np.testing.assert_allclose(out["by_value"], xv / zv, **tolerance(mode))


def test_reduce_mean(mode: str) -> None:
    """ANE-07: reduce_mean is rejected, so it becomes reduce_sum times 1/N."""
    g = Graph("mean")
    x = g.input("x", [1, C, 1, S])
    g.output(g.reduce_mean(x, axis=1), "over_channels")
    g.output(g.reduce_mean(x, axis=3), "over_tokens")
    xv = rand(1, C, 1, S)
    out = run(g, mode, x=xv)
    np.testing.assert_allclose(out["over_channels"], xv.mean(axis=1, keepdims=True), **tolerance(mode))
    np.testing.assert_allclose(out["over_tokens"], xv.mean(axis=3, keepdims=True), **tolerance(mode))
    assert "reduce_mean" not in {n.op for n in legalize(g).nodes}


def test_linear_bias(mode: str) -> None:
    """ANE-04: conv takes no bias, so linear becomes a conv plus an add."""
    w, b = rand(96, C, scale=0.1), rand(96)
    g = Graph("linear")
    g.output(g.linear(g.input("x", [1, C, 1, S]), w, b), "y")
    x = rand(1, C, 1, S)
    expected = ref.tensor(w @ ref.cs(x) + b[:, None])
    np.testing.assert_allclose(run(g, mode, x=x)["y"], expected, **tolerance(mode))
    legal = legalize(g)
    conv = next(n for n in legal.nodes if n.op == "conv")
    assert len(conv.inputs) == 2 and conv.inputs[1].shape == (96, C, 1, 1)  # no bias argument
    assert any(n.op == "add" and conv in n.inputs for n in legal.nodes)


def test_layer_norm(mode: str) -> None:
    """ANE-31: layer_norm is rejected, so it becomes reductions, mul and pow."""
    gamma, beta = rand(C), rand(C)
    g = Graph("ln")
    g.output(g.layer_norm(g.input("x", [1, C, 1, S]), gamma, beta, eps=1e-5), "y")
    x = rand(1, C, 1, S, scale=3) + 1
    expected = ref.tensor(ref.layer_norm(ref.cs(x), gamma, beta, 1e-5))
    np.testing.assert_allclose(run(g, mode, x=x)["y"], expected, **tolerance(mode, 5))


def test_rms_norm(mode: str) -> None:
    gamma = rand(C)
    g = Graph("rms")
    g.output(g.rms_norm(g.input("x", [1, C, 1, S]), gamma, eps=1e-6), "y")
    x = rand(1, C, 1, S)
    expected = ref.tensor(ref.rms_norm(ref.cs(x), gamma, 1e-6))
    np.testing.assert_allclose(run(g, mode, x=x)["y"], expected, **tolerance(mode, 5))


@pytest.mark.parametrize("causal", [True, False])
def test_attention(mode: str, causal: bool) -> None:
    """ANE-23: SDPA ignores its mask, so attention becomes matmul, scale, mask add, softmax, matmul."""
    heads = 4
    g = Graph("attn")
    q, k, v = (g.input(n, [1, C, 1, S]) for n in ("q", "k", "v"))
    g.output(g.attention(q, k, v, heads=heads, causal=causal), "y")
    qv, kv, vv = rand(1, C, 1, S), rand(1, C, 1, S), rand(1, C, 1, S)
    expected = ref.tensor(ref.causal_attention(ref.cs(qv), ref.cs(kv), ref.cs(vv), heads, causal))
    np.testing.assert_allclose(run(g, mode, q=qv, k=kv, v=vv)["y"], expected, **tolerance(mode))
    ops = [n.op for n in legalize(g).nodes]
    assert ops.count("matmul") == 2 + causal and "softmax" in ops  # the causal mask's positions: one more
    assert ("add" in ops) == causal  # additive mask, not an SDPA attn_mask


def test_causal_mask_values() -> None:
    m = causal_mask(4)
    assert m.shape == (1, 1, 4, 4)  # broadcast over the heads
    assert np.all(m[0, 0][np.tril_indices(4)] == 0) and np.all(m[0, 0][np.triu_indices(4, 1)] == -65504)


def test_slice_split(mode: str) -> None:
    """ANE-29: slice_by_index is rejected, so slices become slice_by_size."""
    g = Graph("slices")
    x = g.input("x", [1, C, 1, S])
    a, b = g.split(x, [16, C - 16], axis=1)
    g.output(a, "a")
    g.output(b, "b")
    g.output(g.slice(x, 3, 8, 24), "mid")
    xv = rand(1, C, 1, S)
    out = run(g, mode, x=xv)
    np.testing.assert_allclose(out["a"], xv[:, :16], **tolerance(mode))
    np.testing.assert_allclose(out["b"], xv[:, 16:], **tolerance(mode))
    np.testing.assert_allclose(out["mid"], xv[..., 8:24], **tolerance(mode))
    assert {n.op for n in legalize(g).nodes} == {"input", "slice_by_size"}


@pytest.mark.parametrize("axis", [1, 3])
def test_concat(mode: str, axis: int) -> None:
    """ANE-01: concat is rejected, so it becomes placement convs/matmuls summed with add."""
    g = Graph("cat")
    x, z = g.input("x", [1, C, 1, S]), g.input("z", [1, C, 1, S])
    g.output(g.relu(g.concat([x, g.neg(z), x], axis=axis)), "y")
    xv, zv = rand(1, C, 1, S), rand(1, C, 1, S)
    expected = np.maximum(np.concatenate([xv, -zv, xv], axis=axis), 0)
    np.testing.assert_allclose(run(g, mode, x=xv, z=zv)["y"], expected, **tolerance(mode))
    assert "concat" not in {n.op for n in legalize(g).nodes}


@pytest.mark.parametrize("axis", [1, 3])
def test_pad(mode: str, axis: int) -> None:
    g = Graph("pad")
    g.output(g.pad(g.input("x", [1, C, 1, S]), axis=axis, before=3, after=5), "y")
    xv = rand(1, C, 1, S)
    widths = [(0, 0)] * 4
    widths[axis] = (3, 5)
    np.testing.assert_allclose(run(g, mode, x=xv)["y"], np.pad(xv, widths), **tolerance(mode))


def test_mlp_with_dialect_ops_passes_through(mode: str) -> None:
    w1, w2 = rand(128, C, scale=0.1), rand(C, 128, scale=0.1)
    g = Graph("mlp")
    x = g.input("x", [1, C, 1, S])
    h = g.sigmoid(g.tanh(g.exp(g.mul(g.relu(g.linear(x, w1)), 0.1))))
    g.output(g.sub(g.linear(h, w2), g.pow(x, 2.0)), "y")
    xv = rand(1, C, 1, S)
    H = 1 / (1 + np.exp(-np.tanh(np.exp(0.1 * np.maximum(w1 @ ref.cs(xv), 0)))))
    np.testing.assert_allclose(run(g, mode, x=xv)["y"], ref.tensor(w2 @ H) - xv**2, **tolerance(mode))
