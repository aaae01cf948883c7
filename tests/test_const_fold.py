"""Generated causal masks and the emulator's compile-time constant folding (csrc/emulator/const_fold.h).

A prefill graph builds its causal mask from position tables (``orion.ops.generated_causal_mask``); the
emulator evaluates ops whose operands are all constants once, at build, with their own kernels, so
the mask is a constant again and the fused causal attention still applies. Checked: the generated mask
equals the stored one exactly (run as ops, and folded), a folded subgraph computes bit for bit what
the same ops compute at evaluate, and folded ops leave no kernel behind."""

from __future__ import annotations

import numpy as np
import pytest

import orion
from orion.graph import Graph
from orion.ops import causal_mask, graph_causal_mask
from orion.ops.reduction import GENERATED_MASK_LIMIT, MASK_VALUE, generated_causal_mask
from orion.runtime import profile


def mask_graph(seq: int, returned: bool) -> Graph:
    """x + the generated mask; with ``returned`` the mask is an output too (outputs are never folded)."""
    g = Graph(f"mask_{seq}")
    x = g.input("x", [1, seq, 1, seq])
    mask = graph_causal_mask(g, seq)
    g.output(g.reshape(g.add(g.reshape(x, [1, 1, seq, seq], name="rows"), mask, name="masked"), [1, seq, 1, seq],
                       name="y"), "y")
    if returned:
        g.output(g.reshape(mask, [1, seq, 1, seq], name="mask_out"), "mask")
    return g


@pytest.mark.parametrize("seq", [32, 256, 1024])
def test_the_generated_mask_is_the_stored_one_exactly(seq) -> None:
    want = causal_mask(seq).reshape(seq, seq)
    zeros = np.zeros((1, seq, 1, seq), np.float16)
    computed = orion.compile_graph(mask_graph(seq, returned=True))(x=zeros)["mask"].reshape(seq, seq)
    folded = orion.compile_graph(mask_graph(seq, returned=False))(x=zeros)["y"].reshape(seq, seq)
    np.testing.assert_array_equal(computed, want)
    np.testing.assert_array_equal(folded, want)


def test_position_tables_are_exact_in_fp16_up_to_the_limit_and_stored_beyond() -> None:
    g = Graph("tables")
    graph_causal_mask(g, GENERATED_MASK_LIMIT)
    tables = [n.value for n in g.nodes if n.op == "const" and n.value.size > 1]
    assert len(tables) == 2 and all(np.array_equal(t.astype(np.float16), t) for t in tables)
    mask = graph_causal_mask(Graph("long"), GENERATED_MASK_LIMIT + 1)
    assert mask.op == "const" and np.array_equal(mask.value, causal_mask(GENERATED_MASK_LIMIT + 1))


def test_folded_ops_are_their_kernels_bit_for_bit_and_leave_no_kernel(profiling) -> None:
    """A const-only chain (matmul, pow, exp, reduce, relu) feeding a runtime add, folded, against the same
    chain on a runtime input (never folded) fed the same constant, and a float64 reference."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((1, 1, 64, 8)), rng.standard_normal((1, 1, 8, 64))

    def chain(g: Graph, left) -> object:
        product = g.matmul(left, g.const("b", b), name="product")
        wave = g.exp(g.mul(g.relu(product, name="positive"), -0.5, name="halved"), name="wave")
        return g.add(wave, g.reduce_sum(wave, axis=3, name="total"), name="chain")

    def build(runtime_left: bool) -> Graph:
        g = Graph("fold" if not runtime_left else "unfolded")
        x = g.reshape(g.input("x", [1, 64, 1, 64]), [1, 1, 64, 64], name="x_rows")
        left = g.reshape(g.input("a", [1, 8, 1, 64]), [1, 1, 64, 8], name="a_rows") if runtime_left \
            else g.const("a", a)
        g.output(g.reshape(g.add(x, chain(g, left), name="y_rows"), [1, 64, 1, 64], name="y"), "y")
        return g

    x = rng.standard_normal((1, 64, 1, 64)).astype(np.float16)
    folded = orion.compile_graph(build(False))
    got = folded(x=x)["y"]
    folded_kinds = {r.op for r in profile.snapshot()}
    a16 = a.astype(np.float16)
    runtime = orion.compile_graph(build(True))(x=x, a=a16.reshape(1, 8, 1, 64))["y"]
    np.testing.assert_array_equal(got, runtime)
    assert folded_kinds.isdisjoint({"matmul", "exp", "relu", "reduce_sum"}), folded_kinds  # computed at build
    wave = np.exp(-0.5 * np.maximum(a16.astype(np.float64) @ b.astype(np.float16).astype(np.float64), 0))
    want = x.astype(np.float64).reshape(64, 64) + (wave + wave.sum(-1, keepdims=True))[0, 0]
    np.testing.assert_allclose(got.astype(np.float64).reshape(64, 64), want, rtol=0, atol=2e-2 * np.abs(want).max())


def test_a_prefill_attention_with_a_generated_mask_is_still_fused(profiling) -> None:
    g = Graph("attn")
    q, k, v = (g.input(n, [1, 128, 1, 128]) for n in "qkv")
    g.output(g.attention(q, k, v, 2, causal=True, name="core"), "y")
    lowered = orion.compiler.lower_graph(g)
    assert "mask_offset = matmul" in lowered.mil and "core_mask =" in lowered.mil
    assert not any(name.endswith("core_mask.bin") for name in lowered.weights)  # no S*S const is stored
    rng = np.random.default_rng(1)
    orion.compile_graph(g)(**{n: rng.standard_normal((1, 128, 1, 128)).astype(np.float16) for n in "qkv"})
    assert any(r.op == "attention (causal, fused)" for r in profile.snapshot())


@pytest.mark.parametrize("perturbed", [False, True])
def test_a_folded_value_is_shared_only_with_its_exact_derivation(perturbed) -> None:
    """While a live program holds a folded mask (its fused attention's), a later program folding the same ops
    on the same bytes takes those values instead of computing them, and one whose position table differs in
    a single value computes its own: each gets its own tables' mask exactly (float64 reference)."""
    seq = 128
    holder_graph = Graph("attn")
    q, k, v = (holder_graph.input(n, [1, 128, 1, seq]) for n in "qkv")
    holder_graph.output(holder_graph.attention(q, k, v, 2, causal=True, name="core"), "y")
    holder = orion.compile_graph(holder_graph)  # holds its folded [S, S] mask while alive
    assert "mask_offset = matmul" in holder.lowered.mil

    g = Graph(f"masked_{perturbed}")
    x = g.input("x", [1, seq, 1, seq])
    tables = {}

    def const(name: str, value):
        value = np.asarray(value, np.float64).copy()
        if perturbed and name == "mask_rows":
            value[0, 0, 5, 0] += 1.0  # row 5 sees one key more
        tables[name] = value
        return g.const(name, value)

    mask = generated_causal_mask(const, lambda op, xs, attrs, name: g.apply(op, xs, attrs, name=name), seq)
    g.output(g.reshape(g.add(g.reshape(x, [1, 1, seq, seq], name="rows"), mask, name="masked"), [1, seq, 1, seq],
                       name="y"), "y")
    got = orion.compile_graph(g)(x=np.zeros((1, seq, 1, seq), np.float16))["y"].reshape(seq, seq)
    offset = tables["mask_rows"][0, 0] @ tables["mask_cols"][0, 0]
    want = np.maximum(1.0 - np.maximum(offset, 0.0), 0.0) * MASK_VALUE
    np.testing.assert_array_equal(got.astype(np.float64), want)
    assert perturbed == (not np.array_equal(want, causal_mask(seq).reshape(seq, seq)))
    del holder
