"""The live-lanes hint: the emulator computes only the declared live lanes, and those lanes are
exactly what the full computation gives."""

from __future__ import annotations

import numpy as np
import pytest

import orion
from orion.compiler import compile_graph
from orion.graph import Graph
from orion.runtime import profile
from orion.runtime.stage import Stage
from support.handmil import SEVERAL_SURFACES, const, op, program, ttype
from test_ops import CONV_ARGS, conv_consts

C, S = 48, 64
ACT = ttype("fp16", [1, C, 1, S])


def lane_program() -> str:
    """Lane-separable ops (conv, elementwise, channel reductions, reshape/transpose keeping the lane
    axis) plus a softmax, a reduction and a matmul over the lane axis, fed by x and a cache-like y."""
    w = (np.random.default_rng(3).standard_normal((C, C, 1, 1)) * 0.1).astype(np.float16)
    heads = ttype("fp16", [1, 4, 12, S])
    body = conv_consts() + [
        const("W", "fp16", w, w.shape), const("ax1", "int32", [1], [1]), const("kd", "bool", True),
        const("shape", "int32", [1, 4, 12, S], [4]), const("perm", "int32", [0, 2, 1, 3], [4]),
        const("last", "int32", -1), const("axl", "int32", [3], [1]),
        const("tf", "bool", False), const("tt", "bool", True),
        op("h", ACT, "conv", **CONV_ARGS),
        op("t", ACT, "tanh", x="h"),
        op("s", ttype("fp16", [1, 1, 1, S]), "reduce_sum", x="t", axes="ax1", keep_dims="kd"),
        op("m", ACT, "mul", x="t", y="s"),
        op("r", heads, "reshape", x="m", shape="shape"),
        op("tr", ttype("fp16", [1, 12, 4, S]), "transpose", x="r", perm="perm"),
        op("sm", ttype("fp16", [1, 12, 4, S]), "softmax", x="tr", axis="last"),
        op("lanesum", ttype("fp16", [1, 12, 4, 1]), "reduce_sum", x="sm", axes="axl", keep_dims="kd"),
        op("mm", ttype("fp16", [1, 1, C, C]), "matmul", x="y4", y="y4", transpose_x="tf", transpose_y="tt"),
        op("out_a", ttype("fp16", [1, 12, 4, S]), "add", x="sm", y="lanesum"),
    ]
    body.insert(0, op("y4", ttype("fp16", [1, 1, C, S]), "reshape", x="y", shape="yshape"))
    body.insert(0, const("yshape", "int32", [1, 1, C, S], [4]))
    return program({"x": ACT, "y": ACT}, body, ["out_a", "mm"])


@pytest.mark.parametrize("live", [1, 5, 33, S])
def test_live_lanes_match_the_full_computation(live) -> None:
    p = orion.compile(lane_program(), **SEVERAL_SURFACES)
    rng = np.random.default_rng(live)
    x, y = rng.standard_normal((1, C, 1, S)).astype(np.float16), rng.standard_normal((1, C, 1, S)).astype(np.float16)
    full = p(x=x, y=y)

    ins, outs = p.allocate_surfaces()
    ins["x"].write(np.where(np.arange(S) < live, x, np.float16(np.nan)))  # dead lanes hold garbage
    ins["y"].write(np.where(np.arange(S) < live, y, np.float16(np.nan)))
    sentinel = np.float16(-7.0)
    for s in outs.values():
        s.array[...] = sentinel
    p.evaluate(ins, outs, live_lanes={"x": live, "y": live})

    # Softmax and sums over the lane axis see the live lanes only: compare against the full
    # program run on the live lanes alone, which is what a caller that declares them means.
    live_only = orion.compile(lane_program().replace(f", {S}]", f", {live}]").replace(f",{S}]", f",{live}]"),
                              profile="permissive")  # under 32 lanes, odd softmax extents
    want = live_only(x=x[..., :live], y=y[..., :live])
    np.testing.assert_array_equal(outs["out_a"].array[..., :live], want["out_a"])
    np.testing.assert_array_equal(outs["mm"].array, want["mm"])  # contraction over the live lanes
    if live < S:
        assert np.all(outs["out_a"].array[..., live:] == sentinel)  # dead lanes are never computed or written
    else:
        np.testing.assert_array_equal(outs["out_a"].array, full["out_a"])


def test_bad_live_lanes_are_refused() -> None:
    p = orion.compile(lane_program(), **SEVERAL_SURFACES)
    ins, outs = p.allocate_surfaces()
    for bad in ({"x": 0}, {"x": S + 1}, {"nope": 1}):
        with pytest.raises(orion.EvaluateError, match="live_lanes"):
            p.evaluate(ins, outs, live_lanes=bad)


@pytest.mark.parametrize("live", [1, 7, S])
def test_hints_reach_the_tensors_cut_from_a_packed_input(live) -> None:
    """Under the one-input rule (ANE-37) x and a cache-like k share one surface; a hint on k names the
    tensor the program cuts from it, and its dead lanes (NaN here) are never read. Reference: numpy
    float64 over the live lanes, within fp16 rounding of the sum."""
    g = Graph("packed_lanes")
    x, k = g.input("x", [1, C, 1, 1]), g.input("k", [1, C, 1, S])
    g.output(g.reduce_sum(g.mul(k, x, name="xk"), axis=3, name="total"), "y")
    compiled = compile_graph(g)
    assert {s.surface for s in compiled.layout.inputs} == {"in_packed"}
    assert next(s.mil_name for s in compiled.layout.inputs if s.name == "k") in compiled.program.input_parts
    stage = Stage(compiled)
    rng = np.random.default_rng(live)
    xs, ks = rng.standard_normal((1, C, 1, 1)), rng.standard_normal((1, C, 1, S))
    stage.input("x")[...] = xs
    stage.input("k")[...] = np.where(np.arange(S) < live, ks, np.nan)
    stage.run({"k": live})
    want = (ks[..., :live] * xs).sum(axis=3, keepdims=True)
    np.testing.assert_allclose(stage.output("y").astype(np.float64), want, rtol=0, atol=0.02 * np.abs(want).max() + 0.02)
    with pytest.raises(orion.EvaluateError, match="live_lanes"):
        stage.run({"k": S + 1})  # the runtime's bound check holds for cut tensors too


def test_hints_reach_the_tensor_cut_from_a_padded_input() -> None:
    """A [1, 64, 1, 8] input is flattened into a padded surface (ANE-12/-14); a hint on it names the
    [1, 64, 1, 8] tensor the program cuts back out, so a sum over its lanes skips the dead (NaN) ones.
    Reference: numpy float64 over the live lanes."""
    g = Graph("padded_lanes")
    x = g.input("x", [1, 64, 1, 8])
    g.output(g.reduce_sum(g.mul(x, x, name="sq"), axis=3, name="total"), "y")
    compiled = compile_graph(g)
    assert compiled.layout.inputs[0].padded != (1, 64, 1, 8) and not compiled.layout.inputs[0].surface
    stage = Stage(compiled)
    xs = np.random.default_rng(2).standard_normal((1, 64, 1, 8))
    stage.input("x")[...] = np.where(np.arange(8) < 3, xs, np.nan)
    stage.run({"x": 3})
    want = (xs[..., :3] ** 2).sum(axis=3, keepdims=True)
    np.testing.assert_allclose(stage.output("y").astype(np.float64), want, rtol=0.01, atol=0.01)


@pytest.mark.parametrize("moves", ["transpose"])
def test_moving_the_lane_axis_turns_dead_lanes_into_zeros(moves) -> None:
    """A transpose (and, in the kernel, a reshape) that moves the lane axis makes the dead lanes ordinary elements of rows that later
    ops read whole (a per-head norm, a chunk's own keys): they are zeros there, never the stale (here NaN) values.
    Before, a Gemma 3 chunk over a cache (q/k norms, a live-lanes hint on x) produced NaN. Reference: numpy with
    the dead lanes zeroed, moved the same way."""
    g = Graph("lanes_moved")
    x = g.input("x", [1, 8, 1, 64])  # 64 lanes (rows longer than the 32 computed whole), 10 live
    heads = g.reshape(x, [1, 2, 4, 64], name="heads")  # keeps the lane axis: a view, lanes kept
    moved = g.transpose(heads, [0, 1, 3, 2], name="moved") if moves == "transpose" else \
        g.reshape(heads, [1, 2, 64, 4], name="moved")
    g.output(g.reshape(g.add(moved, 1.0, name="plus"), [1, 512, 1, 1], name="y"), "y")
    stage = Stage(compile_graph(g))
    xs = np.random.default_rng(3).standard_normal((1, 8, 1, 64))
    stage.input("x")[...] = np.where(np.arange(64) < 10, xs, np.nan)
    stage.run({"x": 10})
    zeroed = np.where(np.arange(64) < 10, xs, 0.0).reshape(1, 2, 4, 64)
    want = ((zeroed.transpose(0, 1, 3, 2) if moves == "transpose" else zeroed.reshape(1, 2, 64, 4)) + 1.0
            ).reshape(1, 512, 1, 1)
    np.testing.assert_allclose(stage.output("y").astype(np.float64), want, rtol=1e-3, atol=1e-3)


def decode_attention_stage(lanes: int, width: int, heads: int, positions: int) -> tuple[Stage, dict[str, np.ndarray]]:
    """A decode step's attention over per-lane KV caches (``blocks.cached_attention``: the lane becomes the
    matmuls' leading batch axis) between two projections and a residual add, as in a decode layer; and its
    weights."""
    from orion.models.blocks import cached_attention

    rng = np.random.default_rng(7)
    w = {n: (rng.standard_normal((width, width)) * 0.2).astype(np.float16) for n in "qkvo"}
    g = Graph("decode_lanes")
    x = g.input("x", [1, width, 1, lanes])
    kc, vc = g.input("kc", [1, lanes * width, 1, positions]), g.input("vc", [1, lanes * width, 1, positions])
    mask = g.input("mask", [1, lanes, 1, positions])
    q, k, v = (g.linear(x, w[n], name=n) for n in "qkv")
    ctx = cached_attention(g, q, k, v, kc, vc, mask, heads)
    g.output(g.add(x, g.linear(ctx, w["o"], name="o"), name="res"), "y")
    return Stage(compile_graph(g)), w


def decode_attention_reference(w: dict[str, np.ndarray], x: np.ndarray, kc: np.ndarray, vc: np.ndarray,
                               filled: int, heads: int) -> np.ndarray:
    """numpy float64: per lane, softmax over its first ``filled`` cached keys and its own key."""
    width, lanes = x.shape[1], x.shape[3]
    d = width // heads
    wd = {n: m.astype(np.float64) for n, m in w.items()}
    out = np.zeros((width, lanes))
    for b in range(lanes):
        xb = x[0, :, 0, b]
        q, k, v = (wd[n] @ xb for n in "qkv")
        ctx = np.zeros(width)
        for h in range(heads):
            rows = slice(b * width + h * d, b * width + (h + 1) * d)
            keys = np.concatenate([kc[0, rows, 0, :filled], k[h * d:(h + 1) * d, None]], axis=1)
            values = np.concatenate([vc[0, rows, 0, :filled], v[h * d:(h + 1) * d, None]], axis=1)
            s = q[h * d:(h + 1) * d] @ keys / np.sqrt(d)
            p = np.exp(s - s.max())
            ctx[h * d:(h + 1) * d] = values @ (p / p.sum())
        out[:, b] = xb + wd["o"] @ ctx
    return out[None, :, None, :]


@pytest.mark.parametrize("live", [1, 3, 8])
def test_dead_sequences_of_a_decode_step_are_skipped_and_change_nothing(live) -> None:
    """With 8 sequence lanes of which ``live`` are declared, the dead sequences (NaN in x and in their cache
    rows) are the attention's dead leading batches (skipped: Tensor::live_prefix), and the live lanes'
    outputs are bit for bit those of the run without the lane hint on finite data. That run is checked
    against numpy float64 within fp16 rounding."""
    lanes, width, heads, positions, filled = 8, 64, 4, 64, 40
    stage, w = decode_attention_stage(lanes, width, heads, positions)
    rng = np.random.default_rng(live)
    xs = rng.standard_normal((1, width, 1, lanes)).astype(np.float16).astype(np.float64)
    ks, vs = (rng.standard_normal((1, lanes * width, 1, positions)).astype(np.float16).astype(np.float64)
              for _ in range(2))
    mask = np.where(np.arange(positions) < filled, 0.0, -65504.0) * np.ones((1, lanes, 1, positions))

    def run(x: np.ndarray, k: np.ndarray, v: np.ndarray, hints: dict[str, int]) -> np.ndarray:
        stage.input("x")[...], stage.input("kc")[...], stage.input("vc")[...] = x, k, v
        stage.input("mask")[...] = mask
        stage.run(hints)
        return stage.output("y").astype(np.float64)

    positions_hint = {"kc": filled, "vc": filled, "mask": filled}
    whole = run(xs, ks, vs, positions_hint)
    want = decode_attention_reference(w, xs, ks, vs, filled, heads)
    np.testing.assert_allclose(whole, want, rtol=0, atol=0.01 * np.abs(want).max() + 0.01)
    dead_rows = np.repeat(np.arange(lanes) >= live, width)[None, :, None, None]
    nan_x = np.where(np.arange(lanes) < live, xs, np.nan)
    nan_k, nan_v = (np.where(dead_rows, np.nan, c) for c in (ks, vs))
    hinted = run(nan_x, nan_k, nan_v, positions_hint | {"x": live})
    np.testing.assert_array_equal(hinted[..., :live], whole[..., :live])


@pytest.mark.parametrize("live", [1, 3, 7])
def test_dead_sequences_of_a_fused_elementwise_run_are_skipped_and_change_nothing(profiling, live) -> None:
    """A decode step over 8 sequence lanes (rows of 8: short rows) with ``live`` of them declared: the fused
    LayerNorm and the fused runs after it (GELU, the residual, a per-row scale and a per-lane bias) compute the
    live lanes gathered together (emulator.cpp's add_stable_norm, fused_elementwise.cpp's run_compacted), bit for
    bit what the program without the hint gives on finite data, whatever the dead lanes hold (NaN here)."""
    from test_fused_elementwise import FUSED, layer

    g, xs = layer(768, 8, seed=live)
    stage = Stage(compile_graph(g))
    inputs = {spec.name: xs[spec.name] for spec in stage.compiled.layout.inputs}

    def run(x: np.ndarray, hints: dict[str, int]) -> np.ndarray:
        for name, value in (inputs | {"x": x}).items():
            stage.input(name)[...] = value
        stage.run(hints)
        return stage.output("y").copy()

    whole = run(xs["x"], {})
    assert np.isfinite(whole).all() and np.abs(whole).max() > 0.1
    profile.reset()
    hinted = run(np.where(np.arange(8) < live, xs["x"], np.float16(np.nan)), {"x": live})
    np.testing.assert_array_equal(hinted[..., :live].view(np.uint16), whole[..., :live].view(np.uint16))
    assert sum(r.calls for r in profile.snapshot() if r.op == FUSED) >= 1  # the runs ran as runs
