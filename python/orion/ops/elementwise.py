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


def _binary(name: str, fn: Any, doc: str) -> None:
    define(OpDef(name, (X, Y), elementwise, lambda xs, a: fn(xs[0], xs[1]), emit=emit_xy,
                 mil=MilOp(name, ("x", "y")), doc=doc))


def _activation(name: str, fn: Any, doc: str) -> None:
    define(OpDef(name, (X,), unary, lambda xs, a: fn(xs[0]), emit=emit_x, mil=MilOp(name, ("x",)), doc=doc))


_binary("add", np.add, "x + y with broadcasting")
_binary("sub", np.subtract, "x - y with broadcasting")
_binary("mul", np.multiply, "x * y with broadcasting")
_activation("tanh", np.tanh, "hyperbolic tangent")
_activation("sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x)), "logistic sigmoid")
_activation("exp", np.exp, "e ** x")
_activation("relu", lambda x: np.maximum(x, 0.0), "max(x, 0)")
_activation("identity", lambda x: x, "x unchanged")


def _infer_pow(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    if not (xs[1].is_const and xs[1].shape == ()):
        raise fail(name, op, "the exponent is not a scalar const", "pass the exponent as a Python float")
    return xs[0].shape, xs[0].dtype


define(OpDef("pow", (X, Operand("y", CONST)), _infer_pow, lambda xs, a: np.power(xs[0], xs[1]), emit=emit_xy,
             mil=MilOp("pow", ("x", "y")), doc="x ** y for a scalar const exponent y"))


# -- high-level ---------------------------------------------------------------------------------------
def _legalize_neg(L: Legalizer, n: Node) -> Node:
    return L.mul_scalar(L.get(n.inputs[0]), -1.0, None)


def _legalize_div(L: Legalizer, n: Node) -> Node:
    x, y = n.inputs
    if y.is_const:
        if np.any(y.value == 0):
            raise CompileError(f"node '{n.name}' (div): division by a constant zero. Fix: remove the zero")
        return L.op("mul", [L.get(x), L.const("recip", 1.0 / y.value)])
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


define(OpDef("neg", (X,), unary, lambda xs, a: -xs[0], legalize=_legalize_neg, doc="-x"))
define(OpDef("div", (X, Y), elementwise, lambda xs, a: xs[0] / xs[1], legalize=_legalize_div,
             mil=MilOp("real_div", ("x", "y"), status=BANNED, constraint="ANE-30"), doc="x / y"))
define(OpDef("gelu", (X,), unary, lambda xs, a: _gelu_tanh(xs[0]), legalize=_legalize_gelu,
             mil=MilOp("gelu", ("x",), ("mode",), status=BANNED, constraint="ANE-02"),
             doc="GELU, the tanh approximation"))
define(OpDef("silu", (X,), unary, lambda xs, a: xs[0] / (1.0 + np.exp(-xs[0])), legalize=_legalize_silu,
             doc="x * sigmoid(x)"))
define(OpDef("rsqrt", (X,), unary, lambda xs, a: 1.0 / np.sqrt(xs[0]), legalize=_legalize_pow_of(-0.5),
             mil=MilOp("rsqrt", ("x",), ("epsilon",), status=BANNED, constraint="ANE-03"), doc="1 / sqrt(x)"))
define(OpDef("sqrt", (X,), unary, lambda xs, a: np.sqrt(xs[0]), legalize=_legalize_pow_of(0.5),
             mil=MilOp("sqrt", ("x",), status=BANNED, constraint="ANE-03"), doc="sqrt(x)"))
