"""The emulator's fused rotary embedding (csrc/emulator/rotary.h): the Llama family's RoPE (models/llama/graphs.py
apply_rope: a matmul by the signed partner permutation, two products with the cos/sin tables and their sum) runs
as one kernel.

It must compute exactly what the four ops do, for any data. The unfused twin is the same MIL with the partner
product also returned: an intermediate something else reads is never fused. Both are compared bit for bit,
and against a float64 numpy rotation."""

from __future__ import annotations

import numpy as np
import pytest

from orion.graph import Graph
from orion.models.llama.config import LlamaConfig
from orion.models.llama.graphs import apply_rope, rope_partner
from support.twins import RAN_ITS_OPS, kernel_calls, stage_twins

FUSED = "rotary (fused)"


def rope_graph(heads: int, d: int, lanes: int, reciprocal: bool = False) -> Graph:
    """x [1, H*D, 1, S] rotated by runtime cos/sin tables [1, D, 1, S] seen as [1, 1, D, S] (a decode step's form);
    ``reciprocal``: the output is 1 / the rotation, which tells -0 (-inf) from +0 (an output's I/O padding adds +0,
    which makes both +0)."""
    config = LlamaConfig(dim=heads * d, n_layers=1, n_heads=heads, n_kv_heads=heads, head_dim=d, hidden_dim=64,
                         vocab_size=32, max_position_embeddings=64)
    g = Graph("rope")
    x = g.input("x", [1, heads * d, 1, lanes])
    cos, sin = (g.reshape(g.input(n, [1, d, 1, lanes]), [1, 1, d, lanes]) for n in ("cos", "sin"))
    y = g.reshape(apply_rope(g, x, heads, cos, sin, rope_partner(g, config), "r"), [1, heads * d, 1, lanes])
    g.output(g.pow(y, -1.0) if reciprocal else y, "y")
    return g



@pytest.mark.parametrize("heads, d, lanes, amplitude, live",
                         [(3, 64, 1, 1.0, None), (2, 16, 32, 1.0, None), (2, 64, 1, 60000.0, None), (2, 16, 8, 1.0, 3),
                          (2, 16, 64, 1.0, 20), (12, 64, 256, 1.0, None)])
def test_rotary_is_its_ops_bit_for_bit(heads, d, lanes, amplitude, live) -> None:
    """A decode step's head group (SmolLM2's), a prompt's lanes, values whose products overflow fp16, a batched
    step of 8 lanes with 3 live and 64 lanes with 20 live (a live-lanes hint on x, cos and sin; NaN in the dead
    lanes, whose outputs are undefined for both; the ops compute an 8-lane row whole and a 64-lane row's live
    lanes only), a training step's 12 heads of 256 lanes (the heads split over the threads). Reference: float64 rotation of each channel pair (the half-split
    convention), within fp16 rounding."""
    fused, unfused = stage_twins(rope_graph(heads, d, lanes), "matmul", "_mate")
    rng = np.random.default_rng(d + lanes)
    x = np.clip(rng.standard_normal((1, heads * d, 1, lanes)) * amplitude, -65504, 65504).astype(np.float16)
    if live is not None:
        x[..., live:] = np.nan
    angles = rng.uniform(0, 2 * np.pi, (1, 1, d // 2, lanes))
    cos = np.concatenate([np.cos(angles)] * 2, axis=2).astype(np.float16)
    sin = np.concatenate([np.sin(angles)] * 2, axis=2).astype(np.float16)
    outs = []
    for stage in (fused, unfused):
        stage.input("x")[...] = x
        stage.input("cos")[...], stage.input("sin")[...] = (t.reshape(1, d, 1, lanes) for t in (cos, sin))
        ops = kernel_calls(stage, None if live is None else {"x": live, "cos": live, "sin": live})
        assert (FUSED in ops and FUSED + RAN_ITS_OPS not in ops) == (stage is fused), ops
        outs.append(stage.output("y").copy()[..., :live])
    x, cos, sin, lanes = x[..., :live], cos[..., :live], sin[..., :live], live or lanes
    np.testing.assert_array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))
    if amplitude > 1:
        return  # overflowed: the bits above are the check
    xh = x.astype(np.float64).reshape(heads, d, lanes)
    half = d // 2
    rotated = np.concatenate([-xh[:, half:], xh[:, :half]], axis=1)
    want = (xh * cos.astype(np.float64)[0] + rotated * sin.astype(np.float64)[0]).reshape(1, heads * d, 1, lanes)
    np.testing.assert_allclose(outs[0].astype(np.float64), want, rtol=0, atol=0.01 * np.abs(want).max())


def run_twins(fused, unfused, inputs: dict[str, np.ndarray], kind: str, output: str = "dx") -> list[np.ndarray]:
    """Each twin's ``output`` on ``inputs``; checks that only the fused twin ran ``kind`` (and never fell back)."""
    outs = []
    for stage in (fused, unfused):
        for name, value in inputs.items():
            stage.input(name)[...] = value
        ops = kernel_calls(stage)
        assert (kind in ops and kind + RAN_ITS_OPS not in ops) == (stage is fused), ops
        outs.append(stage.output(output).copy())
    return outs


def test_rotary_signed_zeros_and_non_finite_values_are_the_ops() -> None:
    """The partner is a signed permutation, which the kernel applies as one (sign * x, +0 for a zero, as the
    matmul's sum from +0 gives) while a head's values are finite: -0 and +0 in x must come out as the ops give
    them, and a head with an infinity takes the matmul (its NaNs where 0 * inf enters a sum)."""
    heads, d, lanes = 2, 16, 4
    fused, unfused = stage_twins(rope_graph(heads, d, lanes, reciprocal=True), "matmul", "_mate")
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, heads * d, 1, lanes)).astype(np.float16)
    # head 0, lane 0: +0, rotated by cos -1 and sin 1: each output is -0 + its mate, and a mate of sign -1 is +0
    # from the matmul's sum (where -1 * x alone would be -0); lane 1: -0
    x[0, :d, 0, 0], x[0, :d, 0, 1] = np.float16(0.0), np.float16(-0.0)
    x[0, d + 5, 0, 2] = np.float16(np.inf)  # head 1, lane 2
    cos = rng.standard_normal((1, d, 1, lanes)).astype(np.float16)
    sin = rng.standard_normal((1, d, 1, lanes)).astype(np.float16)
    cos[..., 0], sin[..., 0] = -1, 1
    outs = run_twins(fused, unfused, {"x": x, "cos": cos, "sin": sin}, FUSED, "y")
    assert np.isnan(outs[1][0, d:, 0, 2]).any()  # the case is reached: 0 * inf in the matmul's sums
    assert (outs[1][0, :d, 0, 0] == np.inf).all()  # and the zeros' case: 1 / +0 from the ops
    np.testing.assert_array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))


def test_rotary_heads_over_the_threads_each_take_their_own_path() -> None:
    """Heads split over the threads (8 of 64 x 128): a head holding an infinity takes the matmul, the others the
    permutation, each as the ops compute it, bit for bit."""
    heads, d, lanes = 8, 64, 128
    fused, unfused = stage_twins(rope_graph(heads, d, lanes), "matmul", "_mate")
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, heads * d, 1, lanes)).astype(np.float16)
    x[0, 5 * d + 3, 0, 7] = np.float16(np.inf)  # head 5
    cos = rng.standard_normal((1, d, 1, lanes)).astype(np.float16)
    sin = rng.standard_normal((1, d, 1, lanes)).astype(np.float16)
    outs = run_twins(fused, unfused, {"x": x, "cos": cos, "sin": sin}, FUSED, "y")
    assert np.isnan(outs[1][0, 5 * d:6 * d, 0, 7]).any() and np.isfinite(outs[1][0, :5 * d]).all()
    np.testing.assert_array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))


FUSED_GRADIENT = "rotary gradient (fused)"


def rope_gradient_graph(heads: int, d: int, lanes: int, reciprocal: bool = False) -> Graph:
    """The input gradient of :func:`rope_graph`'s rotation as the autodiff transform writes it (a layer gradient's
    RoPE): ``dy * cos + partner^T (dy * sin)``, dy ``[1, H*D, 1, S]``, cos/sin tables and ``reciprocal`` as there."""
    config = LlamaConfig(dim=heads * d, n_layers=1, n_heads=heads, n_kv_heads=heads, head_dim=d, hidden_dim=64,
                         vocab_size=32, max_position_embeddings=64)
    g = Graph("rope_gradient")
    dy = g.reshape(g.input("dy", [1, heads * d, 1, lanes]), [1, heads, d, lanes])
    cos, sin = (g.reshape(g.input(n, [1, d, 1, lanes]), [1, 1, d, lanes]) for n in ("cos", "sin"))
    turned = g.mul(dy, sin, name="g_sin")
    mate = g.matmul(rope_partner(g, config), turned, transpose_x=True, name="g_mate")
    dx = g.add(g.mul(dy, cos, name="g_cos"), mate, name="g")
    dx = g.reshape(dx, [1, heads * d, 1, lanes])
    g.output(g.pow(dx, -1.0) if reciprocal else dx, "dx")
    return g




@pytest.mark.parametrize("heads, d, lanes", [(2, 16, 32), (12, 64, 256)])
def test_rotary_gradient_is_its_ops_bit_for_bit(heads, d, lanes) -> None:
    """A layer gradient's RoPE chain (a small one, and a training step's 12 heads of 256 lanes over the threads) runs
    as one kernel, bit for bit the four ops; reference: float64 dy * cos + R^T (dy * sin), R the half-split rotation
    (R^T v = [v2, -v1]), within fp16 rounding."""
    fused, unfused = stage_twins(rope_gradient_graph(heads, d, lanes), "matmul", "_mate")
    rng = np.random.default_rng(d + lanes + 1)
    dy = rng.standard_normal((1, heads * d, 1, lanes)).astype(np.float16)
    angles = rng.uniform(0, 2 * np.pi, (1, d // 2, 1, lanes))
    cos = np.concatenate([np.cos(angles)] * 2, axis=1).astype(np.float16)
    sin = np.concatenate([np.sin(angles)] * 2, axis=1).astype(np.float16)
    outs = run_twins(fused, unfused, {"dy": dy, "cos": cos, "sin": sin}, FUSED_GRADIENT)
    np.testing.assert_array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))
    dh = dy.astype(np.float64).reshape(heads, d, lanes)
    turned = dh * sin.astype(np.float64).reshape(d, lanes)
    half = d // 2
    want = dh * cos.astype(np.float64).reshape(d, lanes) + np.concatenate([turned[:, half:], -turned[:, :half]], axis=1)
    np.testing.assert_allclose(outs[0].astype(np.float64).reshape(heads, d, lanes), want, rtol=0,
                               atol=0.01 * np.abs(want).max())


def test_rotary_gradient_signed_zeros_and_non_finite_values_are_the_ops() -> None:
    """The transposed partner applied as the inverse permutation (sign * v, +0 for a zero) while a head's products
    are finite, and a head whose dy * sin holds an infinity through the matmul (NaN where 0 * inf enters a sum): the
    ops' bits either way, the heads split over the threads."""
    heads, d, lanes = 8, 64, 128
    fused, unfused = stage_twins(rope_gradient_graph(heads, d, lanes, reciprocal=True), "matmul", "_mate")
    rng = np.random.default_rng(12)
    dy = rng.standard_normal((1, heads * d, 1, lanes)).astype(np.float16)
    dy[0, :d, 0, 0], dy[0, :d, 0, 1] = np.float16(0.0), np.float16(-0.0)  # head 0: signed zeros through the mate
    dy[0, 5 * d + 3, 0, 7] = np.float16(np.inf)  # head 5
    cos = rng.standard_normal((1, d, 1, lanes)).astype(np.float16)
    sin = rng.standard_normal((1, d, 1, lanes)).astype(np.float16)
    cos[..., 0], sin[..., 0:2] = -1, 1
    outs = run_twins(fused, unfused, {"dy": dy, "cos": cos, "sin": sin}, FUSED_GRADIENT)
    assert np.isnan(outs[1][0, 5 * d:6 * d, 0, 7]).any()  # the matmul's case is reached
    assert np.isinf(outs[1][0, :d, 0, :2]).all()  # and the zeros' (1 / +-0)
    np.testing.assert_array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))
