"""Reductions and normalization: softmax, reduce_sum, reduce_max (dialect); reduce_mean, layer_norm,
rms_norm and attention (high-level)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from orion.graph.infer import axis_of, check_cs, check_pow2, fail, reduce, same_dtype
from orion.limits import FP16_MAX
from orion.ops.base import BANNED, CONST, Attr, MilOp, OpDef, Operand, define

if TYPE_CHECKING:
    from orion.emit import Emitter
    from orion.graph.ir import Node
    from orion.legalize.rewrite import Legalizer

MASK_VALUE = -FP16_MAX  # additive causal mask above the diagonal
X = Operand("x")


def _infer_softmax(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    shape = xs[0].shape
    check_pow2(name, shape[axis_of(name, op, attrs["axis"], len(shape))])
    return shape, xs[0].dtype


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


define(OpDef("softmax", (X,), _infer_softmax, lambda xs, a: _softmax(xs[0], a["axis"]), attrs=(Attr("axis", int, -1),),
             emit=lambda e, n, out, refs: [("axis", e.scalar(out, "axis", "int32", n.attrs["axis"])), ("x", refs[0])],
             mil=MilOp("softmax", ("x",), ("axis",)), doc="softmax along axis (a power-of-two extent, ANE-08)"))


def _emit_reduce(e: Emitter, n: Node, out: str, refs: list[str]) -> list[tuple[str, Any]]:
    return [("axes", e.ints(out, "axes", [n.attrs["axis"]])),
            ("keep_dims", e.scalar(out, "keep_dims", "bool", True)), ("x", refs[0])]


define(OpDef("reduce_sum", (X,), reduce, lambda xs, a: xs[0].sum(axis=a["axis"], keepdims=True),
             attrs=(Attr("axis", int),), emit=_emit_reduce,
             mil=MilOp("reduce_sum", ("x",), ("axes", "keep_dims")), doc="sum along axis, kept with size 1"))
define(OpDef("reduce_max", (X,), reduce, lambda xs, a: xs[0].max(axis=a["axis"], keepdims=True),
             attrs=(Attr("axis", int),), emit=_emit_reduce,
             mil=MilOp("reduce_max", ("x",), ("axes", "keep_dims")), doc="maximum along axis, kept with size 1"))


def _legalize_reduce_mean(L: Legalizer, n: Node) -> Node:
    x = L.get(n.inputs[0])
    total = L.op("reduce_sum", [x], n.attrs, part="sum")
    return L.mul_scalar(total, 1.0 / x.shape[n.attrs["axis"]], None)


define(OpDef("reduce_mean", (X,), reduce, lambda xs, a: xs[0].mean(axis=a["axis"], keepdims=True),
             attrs=(Attr("axis", int),), legalize=_legalize_reduce_mean,
             mil=MilOp("reduce_mean", ("x",), ("axes", "keep_dims"), status=BANNED, constraint="ANE-07"),
             doc="mean along axis, kept with size 1"))


# -- normalization ------------------------------------------------------------------------------------
def _infer_norm(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    x = xs[0]
    check_cs(name, op, x)
    for p in xs[1:]:
        if not p.is_const or p.shape != (x.shape[1],):
            raise fail(name, op, f"parameter '{p.name}' of shape {list(p.shape)} is not a const [{x.shape[1]}]",
                       f"pass a numpy array of shape [{x.shape[1]}]")
    return x.shape, x.dtype


def _legalize_norm(L: Legalizer, n: Node, center: bool) -> Node:
    x = L.get(n.inputs[0])
    c = x.shape[1]
    if center:
        mean = L.mul_scalar(L.op("reduce_sum", [x], {"axis": 1}, part="sum"), 1.0 / c, "mean")
        x = L.op("sub", [x, mean], part="centered")
    sq = L.op("mul", [x, x], part="sq")
    var = L.mul_scalar(L.op("reduce_sum", [sq], {"axis": 1}, part="sqsum"), 1.0 / c, "var")
    inv = L.op("pow", [L.op("add", [var, L.const("eps", n.attrs["eps"])], part="vareps"), L.const("rsqrt_y", -0.5)],
               part="rstd")
    normed = L.op("mul", [x, inv], part="normed")
    gamma = L.const_as(n.inputs[1], (1, c, 1, 1))
    if not center:
        return L.op("mul", [normed, gamma])
    scaled = L.op("mul", [normed, gamma], part="scaled")
    return L.op("add", [scaled, L.const_as(n.inputs[2], (1, c, 1, 1))])


def _layer_norm_reference(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, gamma, beta = xs
    mu, var = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(var + attrs["eps"]) * gamma.reshape(1, -1, 1, 1) + beta.reshape(1, -1, 1, 1)


def _rms_norm_reference(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, gamma = xs
    return x / np.sqrt((x**2).mean(axis=1, keepdims=True) + attrs["eps"]) * gamma.reshape(1, -1, 1, 1)


define(OpDef("layer_norm", (X, Operand("gamma", CONST), Operand("beta", CONST)), _infer_norm, _layer_norm_reference,
             attrs=(Attr("eps", float, 1e-5),), legalize=lambda L, n: _legalize_norm(L, n, True),
             mil=MilOp("layer_norm", ("x",), ("axes", "beta", "epsilon", "gamma"), status=BANNED, constraint="ANE-31"),
             doc="LayerNorm over the channels of [1, C, 1, S]"))
define(OpDef("rms_norm", (X, Operand("gamma", CONST)), _infer_norm, _rms_norm_reference,
             attrs=(Attr("eps", float, 1e-5),), legalize=lambda L, n: _legalize_norm(L, n, False), workaround="ANE-31",
             doc="RMSNorm over the channels of [1, C, 1, S]"))


# -- attention ----------------------------------------------------------------------------------------
def causal_mask(heads: int, s: int) -> np.ndarray:
    """``[1, heads, S, S]`` additive mask: 0 on and below the diagonal, -65504 above."""
    upper = np.triu(np.ones((s, s)), k=1) * MASK_VALUE
    return np.broadcast_to(upper, (1, heads, s, s)).copy()


def _infer_attention(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    q = xs[0]
    heads = attrs["heads"]
    for x in xs:
        if x.shape != q.shape or len(x.shape) != 4 or x.shape[0] != 1 or x.shape[2] != 1:
            raise fail(name, op, f"q, k, v shapes {[list(x.shape) for x in xs]} are not one [1, D, 1, S]",
                       "give q, k and v as [1, heads * head_dim, 1, S]")
    if heads <= 0 or q.shape[1] % heads:
        raise fail(name, op, f"{q.shape[1]} channels do not split into {heads} heads", "pick heads dividing D")
    check_pow2(name, q.shape[3])
    return q.shape, same_dtype(name, op, xs)


def _legalize_attention(L: Legalizer, n: Node) -> Node:
    q, k, v = (L.get(i) for i in n.inputs)
    heads, (_, d, _, s) = n.attrs["heads"], n.shape
    hd = d // heads
    split = {"shape": [1, heads, hd, s]}
    qh, kh, vh = (L.op("reshape", [t], split, part=f"{p}_heads") for t, p in ((q, "q"), (k, "k"), (v, "v")))
    scores = L.op("matmul", [qh, kh], {"transpose_x": True, "transpose_y": False}, part="scores")  # [1,H,S,S]
    scaled = L.mul_scalar(scores, 1.0 / math.sqrt(hd), "scaled")
    if n.attrs["causal"]:
        scaled = L.op("add", [scaled, L.const("mask", causal_mask(heads, s))], part="masked")
    probs = L.op("softmax", [scaled], {"axis": -1}, part="probs")
    ctx = L.op("matmul", [vh, probs], {"transpose_x": False, "transpose_y": True}, part="ctx")  # [1,H,hd,S]
    return L.op("reshape", [ctx], {"shape": [1, d, 1, s]})


def _attention_reference(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    """Head by head on ``[S, hd]`` matrices; masked scores are dropped (-inf), not offset."""
    q, k, v = (t[0, :, 0, :] for t in xs)
    heads, (d, s) = attrs["heads"], q.shape
    hd, out = d // heads, np.zeros(q.shape)
    for h in range(heads):
        rows = slice(h * hd, (h + 1) * hd)
        scores = q[rows].T @ k[rows] / math.sqrt(hd)
        if attrs["causal"]:
            scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
        out[rows] = (_softmax(scores, 1) @ v[rows].T).T
    return out[None, :, None, :]


define(OpDef("attention", (Operand("q"), Operand("k"), Operand("v")), _infer_attention, _attention_reference,
             attrs=(Attr("heads", int), Attr("causal", bool, True)), legalize=_legalize_attention,
             mil=MilOp("scaled_dot_product_attention", ("key", "query", "value"), ("attn_mask",), status=BANNED,
                       constraint="ANE-23"),
             doc="multi-head attention of [1, heads*head_dim, 1, S] q, k, v"))
