"""Elementwise ops: arithmetic and activations (dialect), and neg, div, gelu, silu, rsqrt, sqrt
(high-level, legalized into the dialect)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from orion.errors import CompileError
from orion.graph.infer import elementwise, fail, unary
from orion.ops.base import BANNED, CONST, MilOp, OpDef, Operand, define

if TYPE_CHECKING:
    from orion.autodiff.context import GradContext
    from orion.emit import Emitter
    from orion.graph.ir import Node
    from orion.legalize.rewrite import Legalizer

GELU_C = math.sqrt(2.0 / math.pi)
X, Y = Operand("x"), Operand("y")


def emit_x(e: Emitter, n: Node, out: str, refs: list[str]) -> list[tuple[str, Any]]:
    """The arguments of a unary MIL op: ``x`` only."""
    return [("x", refs[0])]


def emit_xy(e: Emitter, n: Node, out: str, refs: list[str]) -> list[tuple[str, Any]]:
    """The arguments of a binary MIL op: ``x`` and ``y``."""
    return [("x", refs[0]), ("y", refs[1])]


# -- gradient rules (see orion.autodiff.context): one cotangent per operand, None where none is needed ------
Grads = list["Node | None"]


def _grad_add(ctx: GradContext, n: Node, dy: Node) -> Grads:
    x, y = n.inputs
    return [ctx.unbroadcast(dy, x) if ctx.needs(0) else None, ctx.unbroadcast(dy, y) if ctx.needs(1) else None]


def _grad_sub(ctx: GradContext, n: Node, dy: Node) -> Grads:
    x, y = n.inputs
    return [ctx.unbroadcast(dy, x) if ctx.needs(0) else None,
            ctx.unbroadcast(ctx.scale(dy, -1.0), y) if ctx.needs(1) else None]


def _grad_mul(ctx: GradContext, n: Node, dy: Node) -> Grads:
    x, y = n.inputs
    return [ctx.unbroadcast(ctx.g.mul(dy, y), x) if ctx.needs(0) else None,
            ctx.unbroadcast(ctx.g.mul(dy, x), y) if ctx.needs(1) else None]


def _grad_tanh(ctx: GradContext, n: Node, dy: Node) -> Grads:  # dy * (1 - t^2)
    return [ctx.g.sub(dy, ctx.g.mul(ctx.g.mul(dy, n), n))]


def _grad_sigmoid(ctx: GradContext, n: Node, dy: Node) -> Grads:  # dy * s * (1 - s)
    ds = ctx.g.mul(dy, n)
    return [ctx.g.sub(ds, ctx.g.mul(ds, n))]


def _grad_exp(ctx: GradContext, n: Node, dy: Node) -> Grads:
    return [ctx.g.mul(dy, n)]


def _grad_identity(ctx: GradContext, n: Node, dy: Node) -> Grads:
    return [dy]


RELU_STEP_GAIN = 65504.0  # fp16's largest: relu's gradient rule selects exactly wherever x >= 1 / RELU_STEP_GAIN


def _grad_relu(ctx: GradContext, n: Node, dy: Node) -> Grads:
    """dy * [x > 0] without a comparison op, from relu's own output y: the step is 1 - relu(1 - K y), which is
    exactly 0 at y = 0 and exactly 1 for y >= 1/K (K y may overflow to inf: 1 - inf = -inf, relu gives 0), K
    times y in between (0 < x < 1.5e-5, where the slope is off by at most that fraction); written as
    dy - dy * relu(1 - K y)."""
    off = ctx.g.relu(ctx.g.add(ctx.g.mul(n, -RELU_STEP_GAIN), 1.0))
    return [ctx.g.sub(dy, ctx.g.mul(dy, off))]


def no_comparison(ctx: GradContext, n: Node, dy: Node) -> Grads:
    """The rule of ops whose gradient is a selection of one element (reduce_max): refused, naming the node."""
    raise ctx.fail("its gradient needs a comparison (x == max), which the ANE dialect has no op for",
                   "keep this op off the differentiated path (compute it on the CPU or from inputs that need no "
                   "gradient), or use an op with a direct rule (rms_norm, layer_norm, softmax, attention)")


def _binary(name: str, fn: Any, grad: Any, doc: str) -> None:
    define(OpDef(name, (X, Y), elementwise, lambda xs, a: fn(xs[0], xs[1]), emit=emit_xy,
                 mil=MilOp(name, ("x", "y")), grad=grad, doc=doc))


def _activation(name: str, fn: Any, grad: Any, doc: str) -> None:
    define(OpDef(name, (X,), unary, lambda xs, a: fn(xs[0]), emit=emit_x, mil=MilOp(name, ("x",)), grad=grad,
                 doc=doc))


_binary("add", np.add, _grad_add, "x + y with broadcasting")
_binary("sub", np.subtract, _grad_sub, "x - y with broadcasting")
_binary("mul", np.multiply, _grad_mul, "x * y with broadcasting")
_activation("tanh", np.tanh, _grad_tanh, "hyperbolic tangent")
_activation("sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x)), _grad_sigmoid, "logistic sigmoid")
_activation("exp", np.exp, _grad_exp, "e ** x")
_activation("relu", lambda x: np.maximum(x, 0.0), _grad_relu, "max(x, 0)")
_activation("identity", lambda x: x, _grad_identity, "x unchanged")


def _infer_pow(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    if not (xs[1].is_const and xs[1].shape == ()):
        raise fail(name, op, "the exponent is not a scalar const", "pass the exponent as a Python float")
    return xs[0].shape, xs[0].dtype


def _grad_pow(ctx: GradContext, n: Node, dy: Node) -> Grads:  # dy * c * x^(c-1)
    x, c = n.inputs[0], float(n.inputs[1].value)
    slope = ctx.g.pow(x, c - 1.0) if c not in (0.0, 1.0) else None  # x^0 is constant: no x^-1 (inf at 0)
    return [ctx.scale(dy if slope is None else ctx.g.mul(dy, slope), c), None]


define(OpDef("pow", (X, Operand("y", CONST)), _infer_pow, lambda xs, a: np.power(xs[0], xs[1]), emit=emit_xy,
             mil=MilOp("pow", ("x", "y")), grad=_grad_pow, doc="x ** y for a scalar const exponent y"))


# -- high-level ---------------------------------------------------------------------------------------
def _legalize_neg(L: Legalizer, n: Node) -> Node:
    return L.mul_scalar(L.get(n.inputs[0]), -1.0, None)


def _legalize_div(L: Legalizer, n: Node) -> Node:
    x, y = n.inputs
    if y.is_const:
        if np.any(y.value == 0):
            raise CompileError(f"node '{n.name}' (div): division by a constant zero. Fix: remove the zero")
        return L.op("mul", [L.get(x), L.const("recip", 1.0 / np.asarray(y.value, np.float64))])
    recip = L.op("pow", [L.get(y), L.const("recip_y", -1.0)], part="recip")
    return L.op("mul", [L.get(x), recip])


def _legalize_gelu(L: Legalizer, n: Node) -> Node:
    x = L.get(n.inputs[0])
    x2 = L.op("mul", [x, x], part="x2")
    x3 = L.op("mul", [x2, x], part="x3")
    inner = L.op("add", [x, L.mul_scalar(x3, 0.044715, "cubic")], part="inner")
    t = L.op("tanh", [L.mul_scalar(inner, GELU_C, "scaled")], part="tanh")
    half_x = L.mul_scalar(x, 0.5, "half")
    return L.op("mul", [half_x, L.op("add", [t, L.const("one", 1.0)], part="onep")])


def _legalize_silu(L: Legalizer, n: Node) -> Node:
    x = L.get(n.inputs[0])
    return L.op("mul", [x, L.op("sigmoid", [x], part="sigmoid")])


def _legalize_pow_of(exponent: float) -> Any:
    def expand(L: Legalizer, n: Node) -> Node:
        return L.op("pow", [L.get(n.inputs[0]), L.const("y", exponent)])
    return expand


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * x**3)))


def _grad_neg(ctx: GradContext, n: Node, dy: Node) -> Grads:
    return [ctx.scale(dy, -1.0)]


def _grad_div(ctx: GradContext, n: Node, dy: Node) -> Grads:  # d/dx = dy / y, d/dy = -(dy / y) * (x / y)
    x, y = n.inputs
    dx = ctx.g.div(dy, y)
    return [ctx.unbroadcast(dx, x) if ctx.needs(0) else None,
            ctx.unbroadcast(ctx.scale(ctx.g.mul(dx, n), -1.0), y) if ctx.needs(1) else None]


def _grad_gelu(ctx: GradContext, n: Node, dy: Node) -> Grads:
    """d/dx of 0.5 x (1 + t), t = tanh(c (x + a x^3)): 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2)."""
    g, x = ctx.g, n.inputs[0]
    x2 = g.mul(x, x)
    t = g.tanh(ctx.scale(g.add(x, ctx.scale(g.mul(x2, x), 0.044715)), GELU_C))
    one_minus_t2 = ctx.scale(g.sub(g.mul(t, t), 1.0), -1.0)
    inner = g.mul(one_minus_t2, g.add(ctx.scale(x2, 3 * 0.044715 * GELU_C), GELU_C))
    slope = ctx.scale(g.add(g.add(t, 1.0), g.mul(x, inner)), 0.5)
    return [g.mul(dy, slope)]


def _grad_silu(ctx: GradContext, n: Node, dy: Node) -> Grads:  # dy * s * (1 + x (1 - s))
    g, x = ctx.g, n.inputs[0]
    s = g.sigmoid(x)
    return [g.mul(g.mul(dy, s), g.add(g.sub(x, g.mul(x, s)), 1.0))]


def _grad_pow_of(exponent: float) -> Any:
    def rule(ctx: GradContext, n: Node, dy: Node) -> Grads:
        return [ctx.scale(ctx.g.mul(dy, ctx.g.pow(n.inputs[0], exponent - 1.0)), exponent)]
    return rule


define(OpDef("neg", (X,), unary, lambda xs, a: -xs[0], legalize=_legalize_neg, grad=_grad_neg, doc="-x"))
define(OpDef("div", (X, Y), elementwise, lambda xs, a: xs[0] / xs[1], legalize=_legalize_div,
             mil=MilOp("real_div", ("x", "y"), status=BANNED, constraint="ANE-30"), grad=_grad_div, doc="x / y"))
define(OpDef("gelu", (X,), unary, lambda xs, a: _gelu_tanh(xs[0]), legalize=_legalize_gelu,
             mil=MilOp("gelu", ("x",), ("mode",), status=BANNED, constraint="ANE-02"), grad=_grad_gelu,
             doc="GELU, the tanh approximation"))
define(OpDef("silu", (X,), unary, lambda xs, a: xs[0] / (1.0 + np.exp(-xs[0])), legalize=_legalize_silu,
             grad=_grad_silu, doc="x * sigmoid(x)"))
define(OpDef("rsqrt", (X,), unary, lambda xs, a: 1.0 / np.sqrt(xs[0]), legalize=_legalize_pow_of(-0.5),
             mil=MilOp("rsqrt", ("x",), ("epsilon",), status=BANNED, constraint="ANE-03"), grad=_grad_pow_of(-0.5),
             doc="1 / sqrt(x)"))
define(OpDef("sqrt", (X,), unary, lambda xs, a: np.sqrt(xs[0]), legalize=_legalize_pow_of(0.5),
             mil=MilOp("sqrt", ("x",), status=BANNED, constraint="ANE-03"), grad=_grad_pow_of(0.5), doc="sqrt(x)"))
