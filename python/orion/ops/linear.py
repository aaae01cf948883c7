"""Linear algebra: conv (a 1x1 convolution, dialect), matmul (dialect) and linear (high-level: a conv
with a const weight, plus an add for the bias, ANE-04; or a matmul with a runtime weight, ANE-32)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from orion.constraints import violation
from orion.graph.infer import broadcast, check_cs, fail, same_dtype
from orion.limits import MAX_CONV_INPUT_CHANNELS
from orion.ops.base import CONST, Attr, MilOp, OpDef, Operand, define

if TYPE_CHECKING:
    from orion.autodiff.context import GradContext
    from orion.emit import Emitter
    from orion.graph.ir import Node
    from orion.legalize.rewrite import Legalizer

CONV_ARGS = ("dilations", "groups", "pad", "pad_type", "strides", "weight", "x")  # all seven (ANE-32)
Grads = list["Node | None"]


def _pad4(values: Any) -> tuple[int, ...]:
    pad = tuple(int(v) for v in values)
    if len(pad) != 4 or min(pad) < 0:
        raise ValueError(f"pad {list(pad)} is not [top, bottom, left, right] of non-negative sizes")
    return pad


def conv_pad(attrs: dict[str, Any]) -> tuple[int, ...]:
    """A conv node's zero padding [top, bottom, left, right] (none unless given)."""
    return tuple(attrs.get("pad", (0, 0, 0, 0)))


def _infer_conv(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    x, w = xs
    top, bottom, left, right = conv_pad(attrs)
    return (1, w.shape[0], x.shape[2] + top + bottom, x.shape[3] + left + right), same_dtype(name, op, xs)


def _emit_conv(e: Emitter, n: Node, out: str, refs: list[str]) -> list[tuple[str, Any]]:
    pad = list(conv_pad(n.attrs))
    return [("dilations", e.ints(out, "dilations", [1, 1])),
            ("groups", e.scalar(out, "groups", "int32", 1)),
            ("pad", e.ints(out, "pad", pad)),
            ("pad_type", e.string(out, "pad_type", "custom" if any(pad) else "valid")),
            ("strides", e.ints(out, "strides", [1, 1])), ("weight", refs[1]), ("x", refs[0])]


def _conv_reference(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    top, bottom, left, right = conv_pad(attrs)
    x = np.pad(xs[0], [(0, 0), (0, 0), (top, bottom), (left, right)])
    return np.einsum("oc,bcis->bois", xs[1][:, :, 0, 0], x)


def _grad_conv(ctx: GradContext, n: Node, dy: Node) -> Grads:
    """dx = W^T dy (a conv by the transposed const) over the positions of x (the zero padding cut off)."""
    top, _, left, _ = conv_pad(n.attrs)
    x = n.inputs[0]
    if any(conv_pad(n.attrs)):
        dy = ctx.g.apply("slice_by_size", [dy], {"begin": [0, 0, top, left],
                                                 "size": [dy.shape[0], dy.shape[1], x.shape[2], x.shape[3]]})
    return [ctx.g.apply("conv", [dy, np.transpose(n.inputs[1].value, (1, 0, 2, 3))]), None]


define(OpDef("conv", (Operand("x"), Operand("weight", CONST)), _infer_conv, _conv_reference,
             attrs=(Attr("pad", _pad4, (0, 0, 0, 0)),),
             emit=_emit_conv, mil=MilOp("conv", CONV_ARGS, ("bias",)), grad=_grad_conv,  # bias= is refused by ANE-04
             doc="1x1 convolution of [1, Cin, H, S] by a const [Cout, Cin, 1, 1] weight; ``pad`` [top, bottom, "
                 "left, right] zeros around H and S first (conv's own padding: a value reaches only its position)"))


def _infer_matmul(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    a, b = xs[0].shape, xs[1].shape
    if len(a) < 2 or len(b) < 2:
        raise fail(name, op, f"operands of rank {len(a)} and {len(b)}", "matmul needs rank >= 2 operands")
    m, k = (a[-1], a[-2]) if attrs["transpose_x"] else (a[-2], a[-1])
    k2, n = (b[-1], b[-2]) if attrs["transpose_y"] else (b[-2], b[-1])
    if k != k2:
        raise fail(name, op, f"inner dimensions differ: {list(a)} x {list(b)} (transpose_x={attrs['transpose_x']}, "
                   f"transpose_y={attrs['transpose_y']})", "transpose an operand or fix its shape")
    batch = broadcast(name, op, a[:-2], b[:-2])
    return batch + (m, n), same_dtype(name, op, xs)


def _emit_matmul(e: Emitter, n: Node, out: str, refs: list[str]) -> list[tuple[str, Any]]:
    return [("transpose_x", e.scalar(out, "transpose_x", "bool", n.attrs["transpose_x"])),
            ("transpose_y", e.scalar(out, "transpose_y", "bool", n.attrs["transpose_y"])),
            ("x", refs[0]), ("y", refs[1])]


def _matmul_reference(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x = np.swapaxes(xs[0], -1, -2) if attrs["transpose_x"] else xs[0]
    y = np.swapaxes(xs[1], -1, -2) if attrs["transpose_y"] else xs[1]
    return x @ y


def _grad_matmul(ctx: GradContext, n: Node, dy: Node) -> Grads:
    """Z = op(X) op(Y): each cotangent is one matmul of dZ with the other operand (transposes chosen so none
    is materialized), summed over the batch axes that operand was broadcast along."""
    g, (x, y) = ctx.g, n.inputs
    tx, ty = n.attrs["transpose_x"], n.attrs["transpose_y"]
    dx = dyy = None
    if ctx.needs(0):
        dx = g.matmul(y, dy, transpose_x=ty, transpose_y=True) if tx else g.matmul(dy, y, transpose_y=not ty)
        dx = ctx.unbroadcast(dx, x)
    if ctx.needs(1):
        dyy = g.matmul(dy, x, transpose_x=True, transpose_y=tx) if ty else g.matmul(x, dy, transpose_x=not tx)
        dyy = ctx.unbroadcast(dyy, y)
    return [dx, dyy]


define(OpDef("matmul", (Operand("x"), Operand("y")), _infer_matmul, _matmul_reference,
             attrs=(Attr("transpose_x", bool, False), Attr("transpose_y", bool, False)),
             emit=_emit_matmul, mil=MilOp("matmul", ("x", "y"), ("transpose_x", "transpose_y")), grad=_grad_matmul,
             doc="batched matrix product over the last two axes"))


def runtime_weight_shape(cout: int, cin: int) -> tuple[int, int, int, int]:
    """The layout of a runtime (graph-input) linear weight W[out][in]: ``[1, Cout, 1, Cin]``."""
    return (1, cout, 1, cin)


def _infer_linear(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    x, w = xs[0], xs[1]
    check_cs(name, op, x)
    if w.is_const and len(w.shape) != 4:
        if len(w.shape) != 2:
            raise fail(name, op, f"weight shape {list(w.shape)} is not [Cout, Cin]",
                       "give the weight as W[out][in] (transpose HF GPT-2 Conv1D weights)")
        cout, cin = w.shape
    elif len(w.shape) == 4 and w.shape[0] == 1 and w.shape[2] == 1:  # runtime, or a baked input (a const)
        cout, cin = w.shape[1], w.shape[3]
    else:
        raise violation("ANE-32", name, f"the weight '{w.name}' of shape {list(w.shape)} is computed at runtime, "
                        "conv needs a const weight",
                        "pass the weight as a numpy array or g.const(...), or as a runtime [1, Cout, 1, Cin] tensor "
                        "(lowered to matmul), or use g.matmul for dynamic weights")
    if cin != x.shape[1]:
        raise fail(name, op, f"weight has {cin} input channels, the input has {x.shape[1]}",
                   "transpose the weight to W[out][in] or fix its shape")
    if w.is_const and cin >= MAX_CONV_INPUT_CHANNELS:
        raise violation("ANE-10", name, f"{cin} input channels (limit < {MAX_CONV_INPUT_CHANNELS})",
                        "split the input channels into chunks below 32,000, one linear per chunk, and add the results")
    if len(xs) == 3:
        b = xs[2]
        allowed = ((cout,), (1, cout, 1, 1)) if b.is_const else ((1, cout, 1, 1),)
        if b.shape not in allowed:
            raise fail(name, op, f"bias shape {list(b.shape)} is not {' or '.join(str(list(a)) for a in allowed)}",
                       f"give a bias of shape {list(allowed[-1])}")
    return (1, cout, 1, x.shape[3]), same_dtype(name, op, xs)


def _legalize_linear(L: Legalizer, n: Node) -> Node:
    x, w = L.get(n.inputs[0]), n.inputs[1]
    if w.is_const:
        cout, cin = n.shape[1], x.shape[1]
        y = L.op("conv", [x, L.const_as(w, (cout, cin, 1, 1))], part="conv" if len(n.inputs) == 3 else None)
    else:  # a runtime weight [1, Cout, 1, Cin]: W x as one matmul on [Cout, Cin] x [Cin, S] (ANE-32)
        cout, cin, s = w.shape[1], w.shape[3], x.shape[3]
        w2 = L.op("reshape", [L.get(w)], {"shape": [1, 1, cout, cin]}, part="w")
        x2 = L.op("reshape", [x], {"shape": [1, 1, cin, s]}, part="x")
        prod = L.op("matmul", [w2, x2], {"transpose_x": False, "transpose_y": False}, part="matmul")
        y = L.op("reshape", [prod], {"shape": [1, cout, 1, s]}, part="mm" if len(n.inputs) == 3 else None)
    if len(n.inputs) == 2:
        return y
    b = n.inputs[2]
    return L.op("add", [y, L.const_as(b, (1, cout, 1, 1)) if b.is_const else L.get(b)])


def _grad_linear(ctx: GradContext, n: Node, dy: Node) -> Grads:
    """dx = W^T dy (a conv by the transposed const, or a matmul with the runtime weight); for a runtime weight
    dW = dy x^T, a matmul with both operands at runtime reducing over S; db = sum over S of dy."""
    g, (x, w) = ctx.g, n.inputs[:2]
    grads: Grads = [None] * len(n.inputs)
    if w.is_const:
        grads[0] = g.linear(dy, w.value.reshape(n.shape[1], x.shape[1]).T) if ctx.needs(0) else None
    else:
        cout, cin, s = w.shape[1], w.shape[3], x.shape[3]
        dy2 = g.reshape(dy, [1, 1, cout, s])
        if ctx.needs(0):
            grads[0] = g.reshape(g.matmul(g.reshape(w, [1, 1, cout, cin]), dy2, transpose_x=True), [1, cin, 1, s])
        if ctx.needs(1):
            grads[1] = g.reshape(g.matmul(dy2, g.reshape(x, [1, 1, cin, s]), transpose_y=True), [1, cout, 1, cin])
    if len(n.inputs) == 3 and ctx.needs(2):
        grads[2] = g.reduce_sum(dy, 3)
    return grads


def _linear_reference(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    w = xs[1] if xs[1].ndim == 2 else xs[1][0, :, 0, :]
    y = np.matmul(w, xs[0].transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # one BLAS product per [c, s] slice
    return y + xs[2].reshape(1, -1, 1, 1) if len(xs) == 3 else y


define(OpDef("linear", (Operand("x"), Operand("weight"), Operand("bias", optional=True)),
             _infer_linear, _linear_reference, legalize=_legalize_linear, grad=_grad_linear,
             workaround="ANE-04",
             doc="W @ x (+ b) over channels: a 1x1 conv for a const weight [Cout, Cin] (or [1, Cout, 1, Cin]: a "
                 "baked input), a matmul for a runtime weight [1, Cout, 1, Cin] (both operands at runtime, ANE-32)"))
