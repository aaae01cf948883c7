"""Linear algebra: conv (a 1x1 convolution, dialect), matmul (dialect) and linear (high-level: a conv
with a const weight, plus an add for the bias, ANE-04)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from orion.constraints import violation
from orion.graph.infer import broadcast, check_cs, fail, same_dtype
from orion.limits import MAX_CONV_INPUT_CHANNELS
from orion.ops.base import CONST, Attr, MilOp, OpDef, Operand, define

if TYPE_CHECKING:
    from orion.emit import Emitter
    from orion.graph.ir import Node
    from orion.legalize.rewrite import Legalizer

CONV_ARGS = ("dilations", "groups", "pad", "pad_type", "strides", "weight", "x")  # all seven (ANE-32)


def _infer_conv(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    x, w = xs
    return (1, w.shape[0], 1, x.shape[3]), same_dtype(name, op, xs)


def _emit_conv(e: Emitter, n: Node, out: str, refs: list[str]) -> list[tuple[str, Any]]:
    return [("dilations", e.ints(out, "dilations", [1, 1])),
            ("groups", e.scalar(out, "groups", "int32", 1)),
            ("pad", e.ints(out, "pad", [0, 0, 0, 0])),
            ("pad_type", e.string(out, "pad_type", "valid")),
            ("strides", e.ints(out, "strides", [1, 1])), ("weight", refs[1]), ("x", refs[0])]


define(OpDef("conv", (Operand("x"), Operand("weight", CONST)), _infer_conv,
             lambda xs, a: np.einsum("oc,bcis->bois", xs[1][:, :, 0, 0], xs[0]),
             emit=_emit_conv, mil=MilOp("conv", CONV_ARGS, ("bias",)),  # bias= is MIL's, refused by ANE-04
             doc="1x1 convolution of [1, Cin, 1, S] by a const [Cout, Cin, 1, 1] weight"))


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


define(OpDef("matmul", (Operand("x"), Operand("y")), _infer_matmul, _matmul_reference,
             attrs=(Attr("transpose_x", bool, False), Attr("transpose_y", bool, False)),
             emit=_emit_matmul, mil=MilOp("matmul", ("x", "y"), ("transpose_x", "transpose_y")),
             doc="batched matrix product over the last two axes"))


def _infer_linear(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    x, w = xs[0], xs[1]
    if not w.is_const:
        raise violation("ANE-32", name, f"the weight '{w.name}' is computed at runtime, conv needs a const weight",
                        "pass the weight as a numpy array or g.const(...), or use g.matmul for dynamic weights")
    check_cs(name, op, x)
    if len(w.shape) != 2:
        raise fail(name, op, f"weight shape {list(w.shape)} is not [Cout, Cin]",
                   "give the weight as W[out][in] (transpose HF GPT-2 Conv1D weights)")
    cout, cin = w.shape
    if cin != x.shape[1]:
        raise fail(name, op, f"weight has {cin} input channels, the input has {x.shape[1]}",
                   "transpose the weight to W[out][in] or fix its shape")
    if cin >= MAX_CONV_INPUT_CHANNELS:
        raise violation("ANE-10", name, f"{cin} input channels (limit < {MAX_CONV_INPUT_CHANNELS})",
                        "split the input channels into chunks below 32,000, one linear per chunk, and add the results")
    if len(xs) == 3 and xs[2].shape not in ((cout,), (1, cout, 1, 1)):
        raise fail(name, op, f"bias shape {list(xs[2].shape)} is not [{cout}]", f"give a bias of shape [{cout}]")
    return (1, cout, 1, x.shape[3]), same_dtype(name, op, xs)


def _legalize_linear(L: Legalizer, n: Node) -> Node:
    x, w = L.get(n.inputs[0]), n.inputs[1]
    cout, cin = w.shape
    weight = L.const_as(w, (cout, cin, 1, 1))
    if len(n.inputs) == 2:
        return L.op("conv", [x, weight])
    conv = L.op("conv", [x, weight], part="conv")
    return L.op("add", [conv, L.const_as(n.inputs[2], (1, cout, 1, 1))])


def _linear_reference(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    y = np.einsum("oc,bcis->bois", xs[1], xs[0])
    return y + xs[2].reshape(1, -1, 1, 1) if len(xs) == 3 else y


define(OpDef("linear", (Operand("x"), Operand("weight", CONST), Operand("bias", CONST, optional=True)),
             _infer_linear, _linear_reference, legalize=_legalize_linear,
             workaround="ANE-04",
             doc="W @ x (+ b) over channels: a 1x1 conv"))
