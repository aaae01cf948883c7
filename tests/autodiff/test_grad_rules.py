"""Every op's gradient rule against float64 central finite differences of the op's numpy reference, on the
gradient graph itself, its legalized (dialect-only) form, and compiled on the emulator in fp16.

The loss is L = sum(y * R) for a random R, so the gradient graph gets R as ``grad_y``. Tolerances: the
float64 graphs agree with finite differences to 1e-6 (relative and absolute); the fp16 programs with the
float64 gradient to 2e-2 relative plus 2e-2 * max(1, largest gradient magnitude) absolute.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from orion import Graph, compile_graph
from orion.autodiff import GradientError, backward, differentiable_ops
from orion.graph import DIALECT_OPS
from orion.legalize import legalize
from support.compiler.dialect_eval import evaluate

C, S = 32, 8  # every I/O needs >= 32 elements (ANE-14 lanes after repacking)
RNG = np.random.default_rng(7)
Build = Callable[[Graph, dict], object]
POSITIVE = (0.5, 2.0)


def _case(op: str, build: Build, shapes: dict[str, tuple[int, ...]], wrt: tuple[str, ...] | None = None,
          ranges: dict[str, tuple[float, float]] | None = None, fp16: bool = True) -> object:
    return pytest.param(build, shapes, wrt or tuple(shapes), ranges or {}, fp16, id=op)


X = {"x": (1, C, 1, S)}
XY = {"x": (1, C, 1, S), "y": (1, C, 1, S)}


MM = {"x": (1, 8, 1, 8), "y": (1, 8, 1, 8)}


def _mm(g: Graph, i: dict, xs: list[int], ys: list[int], tx: bool, ty: bool) -> object:
    """A batched matmul of reshaped inputs, flattened back to [1, C, 1, S]."""
    z = g.matmul(g.reshape(i["x"], xs), g.reshape(i["y"], ys), transpose_x=tx, transpose_y=ty)
    return g.reshape(z, [1, z.shape[1] * z.shape[2], 1, z.shape[3]])


CASES = [
    _case("add", lambda g, i: g.add(i["x"], i["y"]), {"x": (1, C, 1, S), "y": (1, C, 1, 1)}),
    _case("sub", lambda g, i: g.sub(i["x"], i["y"]), {"x": (1, 4, 1, 32), "y": (1, 1, 1, 32)}),
    _case("mul", lambda g, i: g.mul(i["x"], i["y"]), {"x": (1, C, 1, S), "y": (1, C, 1, 1)}),
    _case("mul_scalar", lambda g, i: g.mul(i["x"], 1.5), X),
    _case("div", lambda g, i: g.div(i["x"], i["y"]), XY, ranges={"y": POSITIVE}),
    _case("pow", lambda g, i: g.pow(i["x"], 3.0), X),
    _case("pow_zero", lambda g, i: g.mul(g.pow(i["x"], 0.0), i["x"]), X),
    _case("pow_neg", lambda g, i: g.pow(i["x"], -1.0), X, ranges={"x": POSITIVE}),
    _case("rsqrt", lambda g, i: g.rsqrt(i["x"]), X, ranges={"x": POSITIVE}),
    _case("sqrt", lambda g, i: g.sqrt(i["x"]), X, ranges={"x": POSITIVE}),
    _case("neg", lambda g, i: g.neg(i["x"]), X),
    _case("tanh", lambda g, i: g.tanh(i["x"]), X),
    _case("sigmoid", lambda g, i: g.sigmoid(i["x"]), X),
    _case("exp", lambda g, i: g.exp(i["x"]), X),
    _case("relu", lambda g, i: g.relu(i["x"]), X),  # no input within the finite difference's step of the kink
    _case("identity", lambda g, i: g.mul(g.identity(i["x"]), i["x"]), X),
    _case("gelu", lambda g, i: g.gelu(i["x"]), X, ranges={"x": (-3.0, 3.0)}),
    _case("silu", lambda g, i: g.silu(i["x"]), X, ranges={"x": (-3.0, 3.0)}),
    _case("softmax_lanes", lambda g, i: g.softmax(i["x"], -1), X),
    _case("softmax_channels", lambda g, i: g.softmax(i["x"], 1), X),
    _case("reduce_sum", lambda g, i: g.mul(g.reduce_sum(i["x"], 1), i["y"]), {"x": (1, C, 1, S), "y": (1, 4, 1, S)}),
    _case("reduce_sum_lanes", lambda g, i: g.reduce_sum(i["x"], 3), X),
    _case("reduce_mean", lambda g, i: g.mul(g.reduce_mean(i["x"], 1), i["y"]), {"x": (1, C, 1, S), "y": (1, 4, 1, S)}),
    _case("layer_norm", lambda g, i: g.layer_norm(i["x"], i["gamma"], i["beta"]),
          {"x": (1, C, 1, S), "gamma": (1, C, 1, 1), "beta": (1, C, 1, 1)}),
    _case("layer_norm_const", lambda g, i: g.layer_norm(i["x"], np.linspace(0.5, 2, C), np.linspace(-1, 1, C)), X),
    _case("rms_norm", lambda g, i: g.rms_norm(i["x"], i["gamma"]), {"x": (1, C, 1, S), "gamma": (1, C, 1, 1)},
          ranges={"gamma": (-2.0, 2.0)}),
    _case("rms_norm_const", lambda g, i: g.rms_norm(i["x"], np.linspace(-2, 2, C)), X),
    _case("attention_causal", lambda g, i: g.attention(i["q"], i["k"], i["v"], 2),
          {"q": (1, 8, 1, S), "k": (1, 8, 1, S), "v": (1, 8, 1, S)}),
    _case("attention_full", lambda g, i: g.attention(i["q"], i["k"], i["v"], 2, causal=False),
          {"q": (1, 8, 1, S), "k": (1, 8, 1, S), "v": (1, 8, 1, S)}),
    _case("reshape_transpose", lambda g, i: g.reshape(g.transpose(g.reshape(i["x"], [1, 2, 16, S]), [0, 3, 2, 1]),
                                                      [1, C, 1, S]), X),
    _case("cast", lambda g, i: g.cast(g.mul(g.cast(i["x"], "fp32"), g.const("k", 2.0, "fp32")), "fp16"), X,
          fp16=False),
    _case("slice_channels", lambda g, i: g.slice(i["x"], 1, 1, 9), X),
    _case("slice_lanes", lambda g, i: g.slice(i["x"], 3, 2, 6), X),
    _case("slice_by_size", lambda g, i: g.apply("slice_by_size", [i["x"]],
                                                {"begin": [0, 3, 0, 0], "size": [1, 4, 1, S]}), X),
    _case("pad", lambda g, i: g.pad(i["x"], 1, 1, 3), X),
    _case("concat", lambda g, i: g.concat([i["x"], g.mul(i["y"], i["y"])], 3), {"x": (1, C, 1, 4), "y": (1, C, 1, S)}),
    _case("matmul", lambda g, i: _mm(g, i, [1, 2, 4, 8], [1, 1, 8, 8], False, False), MM),  # y batch-broadcast
    _case("matmul_tx", lambda g, i: _mm(g, i, [1, 2, 8, 4], [1, 1, 8, 8], True, False), MM),
    _case("matmul_ty", lambda g, i: _mm(g, i, [1, 2, 4, 8], [1, 1, 8, 8], False, True), MM),
    _case("matmul_txty", lambda g, i: _mm(g, i, [1, 2, 8, 4], [1, 1, 8, 8], True, True), MM),
    _case("matmul_x_broadcast", lambda g, i: _mm(g, i, [1, 1, 8, 8], [1, 2, 8, 4], False, False),
          {"x": (1, 8, 1, 8), "y": (1, 8, 1, 8)}),
    _case("conv", lambda g, i: g.apply("conv", [i["x"], RNG.standard_normal((8, C, 1, 1))]), X),
    _case("linear_const", lambda g, i: g.linear(i["x"], RNG.standard_normal((8, C)), np.arange(8.0)), X),
    _case("linear_runtime", lambda g, i: g.linear(i["x"], i["w"], i["b"]),
          {"x": (1, 8, 1, S), "w": (1, 32, 1, 8), "b": (1, 32, 1, 1)}),
]


def _inputs(shapes: dict, ranges: dict) -> dict[str, np.ndarray]:
    lo_hi = {k: ranges.get(k, (-1.5, 1.5)) for k in shapes}
    values = {k: RNG.uniform(*lo_hi[k], size=s) for k, s in shapes.items()}
    return {k: v.astype(np.float16).astype(np.float64) for k, v in values.items()}  # fp16-exact


def _graphs(build: Build, shapes: dict, wrt: tuple[str, ...]) -> tuple[Graph, Graph]:
    g = Graph("op")
    nodes = {k: g.input(k, s) for k, s in shapes.items()}
    g.output(build(g, nodes), "y")
    return g, backward(g, wrt)


def _finite_differences(g: Graph, inputs: dict, r: np.ndarray, name: str, eps: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(inputs[name])
    for idx in np.ndindex(grad.shape):
        losses = []
        for step in (eps, -eps):
            moved = {**inputs, name: inputs[name].copy()}
            moved[name][idx] += step
            losses.append(float((evaluate(g, False, np.float64, **moved)["y"] * r).sum()))
        grad[idx] = (losses[0] - losses[1]) / (2 * eps)
    return grad


@pytest.mark.parametrize(("build", "shapes", "wrt", "ranges", "fp16"), CASES)
def test_rule_matches_finite_differences(build: Build, shapes: dict, wrt: tuple, ranges: dict, fp16: bool) -> None:
    g, dg = _graphs(build, shapes, wrt)
    inputs = _inputs(shapes, ranges)
    r = RNG.uniform(-1, 1, size=g.outputs["y"].shape).astype(np.float16).astype(np.float64)
    analytic = evaluate(dg, False, np.float64, **inputs, grad_y=r)
    legal = legalize(dg)
    assert {n.op for n in legal.nodes} <= DIALECT_OPS
    lowered = evaluate(legal, True, np.float64, **inputs, grad_y=r)
    for name in wrt:
        expected = _finite_differences(g, inputs, r, name)
        np.testing.assert_allclose(analytic[f"grad_{name}"], expected, rtol=1e-6, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(lowered[f"grad_{name}"], expected, rtol=1e-6, atol=1e-6, err_msg=name)
    if fp16:
        got = compile_graph(dg)(**inputs, grad_y=r)
        for name in wrt:
            ref = analytic[f"grad_{name}"]
            np.testing.assert_allclose(got[f"grad_{name}"], ref, rtol=2e-2, atol=2e-2 * max(1.0, np.abs(ref).max()),
                                       err_msg=name)


def test_every_registry_op_has_a_rule_or_is_covered() -> None:
    """Each op of the registry has a rule; reduce_max refuses (no comparison op), the rest are tested above."""
    from orion import ops

    assert differentiable_ops() == frozenset(ops.REGISTRY.ops)
    tested = {"add", "sub", "mul", "div", "pow", "rsqrt", "sqrt", "neg", "tanh", "sigmoid", "exp", "relu", "identity",
              "gelu",
              "silu", "softmax", "reduce_sum", "reduce_mean", "layer_norm", "rms_norm", "attention", "reshape",
              "transpose", "cast", "slice", "slice_by_size", "pad", "concat", "matmul", "conv", "linear"}
    assert set(ops.REGISTRY.ops) - tested == {"reduce_max"}


def test_selection_ops_refuse_with_the_node_named() -> None:
    g = Graph("sel")
    x = g.input("x", [1, C, 1, S])
    g.output(g.mul(x, g.reduce_max(x, 1, name="gate")), "y")
    with pytest.raises(GradientError, match=r"'gate'.*comparison.*Fix"):
        backward(g, ["x"])


def test_relu_slope_is_exact_at_the_kink_and_past_fp16_overflow() -> None:
    """relu's rule at x = 0 (slope 0), at x = 2^-15 (the first power of two past 1/65504) and at fp16's largest values (K x
    overflows to inf): the compiled fp16 gradient is dy times exactly 0 or 1."""
    import orion

    g = Graph("relu")
    g.output(g.relu(g.input("x", [1, C, 1, S])), "y")
    x = np.zeros((1, C, 1, S), np.float32)
    x.flat[:6] = [2.0**-15, 2e-4, 1.0, 300.0, 65504.0, -65504.0]
    x.flat[6:12] = [-1e-4, -1.0, 0.5, -0.5, 7.0, -7.0]
    dy = np.random.default_rng(1).uniform(0.5, 2.0, x.shape).astype(np.float32)
    got = orion.compile_graph(backward(g, ["x"]))(x=x, grad_y=dy)["grad_x"]
    want = np.where(x.astype(np.float16) > 0, dy.astype(np.float16), 0).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_bad_wrt_and_unreached_inputs_are_errors() -> None:
    g = Graph("two")
    x, z = g.input("x", [1, C, 1, S]), g.input("z", [1, C, 1, S])
    g.output(g.mul(x, x), "y")
    with pytest.raises(GradientError, match="'nope'.*Fix"):
        backward(g, ["nope"])
    with pytest.raises(GradientError, match="no output depends"):
        backward(g, ["z"])
    with pytest.raises(GradientError, match="'z' does not reach"):
        backward(g, ["x", "z"])
    assert z.name == "z"
