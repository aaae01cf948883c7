"""Reductions and normalization: softmax, reduce_sum, reduce_max (dialect); reduce_mean, layer_norm,
rms_norm and attention (high-level)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from orion.graph.infer import axis_of, check_cs, check_pow2, fail, reduce, same_dtype
from orion.limits import FP16_MAX
from orion.ops.base import BANNED, Attr, MilOp, OpDef, Operand, define
from orion.ops.elementwise import no_comparison

if TYPE_CHECKING:
    from orion.autodiff.context import GradContext
    from orion.emit import Emitter
    from orion.graph.builder import Graph
    from orion.graph.ir import Node
    from orion.legalize.rewrite import Legalizer

MASK_VALUE = -FP16_MAX  # additive causal mask above the diagonal
X = Operand("x")
Grads = list["Node | None"]


def _infer_softmax(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    shape = xs[0].shape
    check_pow2(name, shape[axis_of(name, op, attrs["axis"], len(shape))])
    return shape, xs[0].dtype


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _grad_softmax(ctx: GradContext, n: Node, dy: Node) -> Grads:  # p * (dy - sum(dy * p))
    g = ctx.g
    return [g.mul(n, g.sub(dy, g.reduce_sum(g.mul(dy, n), n.attrs["axis"])))]


define(OpDef("softmax", (X,), _infer_softmax, lambda xs, a: _softmax(xs[0], a["axis"]), attrs=(Attr("axis", int, -1),),
             emit=lambda e, n, out, refs: [("axis", e.scalar(out, "axis", "int32", n.attrs["axis"])), ("x", refs[0])],
             mil=MilOp("softmax", ("x",), ("axis",)), grad=_grad_softmax,
             doc="softmax along axis (a power-of-two extent, ANE-08)"))


def _emit_reduce(e: Emitter, n: Node, out: str, refs: list[str]) -> list[tuple[str, Any]]:
    return [("axes", e.ints(out, "axes", [n.attrs["axis"]])),
            ("keep_dims", e.scalar(out, "keep_dims", "bool", True)), ("x", refs[0])]


def _grad_reduce_sum(ctx: GradContext, n: Node, dy: Node) -> Grads:
    return [ctx.expand(dy, n.inputs[0].shape)]


def _grad_reduce_mean(ctx: GradContext, n: Node, dy: Node) -> Grads:
    x = n.inputs[0]
    return [ctx.scale(ctx.expand(dy, x.shape), 1.0 / x.shape[n.attrs["axis"]])]


define(OpDef("reduce_sum", (X,), reduce, lambda xs, a: xs[0].sum(axis=a["axis"], keepdims=True),
             attrs=(Attr("axis", int),), emit=_emit_reduce,
             mil=MilOp("reduce_sum", ("x",), ("axes", "keep_dims")), grad=_grad_reduce_sum,
             doc="sum along axis, kept with size 1"))
define(OpDef("reduce_max", (X,), reduce, lambda xs, a: xs[0].max(axis=a["axis"], keepdims=True),
             attrs=(Attr("axis", int),), emit=_emit_reduce,
             mil=MilOp("reduce_max", ("x",), ("axes", "keep_dims")), grad=no_comparison,
             doc="maximum along axis, kept with size 1"))


def _legalize_reduce_mean(L: Legalizer, n: Node) -> Node:
    x = L.get(n.inputs[0])
    total = L.op("reduce_sum", [x], n.attrs, part="sum")
    return L.mul_scalar(total, 1.0 / x.shape[n.attrs["axis"]], None)


define(OpDef("reduce_mean", (X,), reduce, lambda xs, a: xs[0].mean(axis=a["axis"], keepdims=True),
             attrs=(Attr("axis", int),), legalize=_legalize_reduce_mean, grad=_grad_reduce_mean,
             mil=MilOp("reduce_mean", ("x",), ("axes", "keep_dims"), status=BANNED, constraint="ANE-07"),
             doc="mean along axis, kept with size 1"))


# -- normalization ------------------------------------------------------------------------------------
def _infer_norm(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    x = xs[0]
    check_cs(name, op, x)
    c = x.shape[1]
    for p in xs[1:]:  # a const may also come in the runtime layout (a baked input, orion.graph.bake)
        if p.shape not in (((c,), (1, c, 1, 1)) if p.is_const else ((1, c, 1, 1),)):
            raise fail(name, op, f"parameter '{p.name}' of shape {list(p.shape)} is not a const [{c}] "
                       f"or a runtime [1, {c}, 1, 1]", f"pass a numpy array of shape [{c}] or a runtime [1, {c}, 1, 1]")
    return x.shape, x.dtype


NORM_FLOOR = 2.0 ** -14  # added to max|x| before dividing by it: fp16's smallest normal, keeps 1/s finite

Apply = Callable[[str, list["Node"], dict, str], "Node"]  # (op, inputs, attrs, part) -> a new node
Const = Callable[[str, float], "Node"]  # (part, value) -> a new scalar const


def stable_norm(apply: Apply, const: Const, x: Node, eps: float, center: bool) -> tuple[Node, Node, Node]:
    """LayerNorm's or RMSNorm's normalized ``x`` over the channels of ``[1, C, 1, S]``, exact for any fp16 input:
    ``(x_hat, rstd_y, inv)`` with ``x_hat = (x - [mean]) / sqrt(var + eps)`` and the rstd of ``x`` equal to
    ``rstd_y * inv``.

    With s = max|x| + 2^-14 and y = x / s (so |y| <= 1 and every sum below is at most 4C),
    x_hat = (y - mean(y)) / sqrt(var(y) + eps / s^2). The naive form squares x first, and sum(x^2)
    overflows fp16 once RMS(x) > sqrt(65504 / C) (9.2 at C = 768; a trained model's residual stream passes
    that within a few layers), which turns the norm's output to 0. eps / s^2 is formed as (sqrt(eps) / s)^2,
    which stays finite for s >= 2^-14. ``apply``/``const`` build nodes in a graph or a legalizer."""
    c = x.shape[1]
    top = apply("reduce_max", [x], {"axis": 1}, "top")
    bottom = apply("reduce_max", [apply("mul", [x, const("neg_y", -1.0)], {}, "neg")], {"axis": 1}, "bottom")
    over = apply("relu", [apply("sub", [bottom, top], {}, "gap")], {}, "over")
    peak = apply("add", [top, over], {}, "peak")
    inv = apply("pow", [apply("add", [peak, const("floor", NORM_FLOOR)], {}, "scale"), const("inv_y", -1.0)], {},
                "inv")
    y = apply("mul", [x, inv], {}, "unit")
    if center:
        mean = apply("mul", [apply("reduce_sum", [y], {"axis": 1}, "sum"), const("mean_y", 1.0 / c)], {}, "mean")
        y = apply("sub", [y, mean], {}, "centered")
    sq_sum = apply("reduce_sum", [apply("mul", [y, y], {}, "sq")], {"axis": 1}, "sqsum")
    mean_sq = apply("mul", [sq_sum, const("meansq_y", 1.0 / c)], {}, "meansq")
    root_eps = apply("mul", [inv, const("root_eps_y", math.sqrt(eps))], {}, "root_eps")
    scaled_eps = apply("mul", [root_eps, root_eps], {}, "eps")
    rstd = apply("pow", [apply("add", [mean_sq, scaled_eps], {}, "var"), const("rsqrt_y", -0.5)], {}, "rstd")
    return apply("mul", [y, rstd], {}, "normed"), rstd, inv


def _legalize_norm(L: Legalizer, n: Node, center: bool) -> Node:
    x = L.get(n.inputs[0])
    c = x.shape[1]
    normed, _, _ = stable_norm(lambda op, xs, attrs, part: L.op(op, xs, attrs, part=part), L.const, x,
                               n.attrs["eps"], center)
    gamma, *beta = (L.const_as(p, (1, c, 1, 1)) if p.is_const else L.get(p) for p in n.inputs[1:])
    if not center:
        return L.op("mul", [normed, gamma])
    scaled = L.op("mul", [normed, gamma], part="scaled")
    return L.op("add", [scaled, beta[0]])


def _layer_norm_reference(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, gamma, beta = xs
    mu, var = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(var + attrs["eps"]) * gamma.reshape(1, -1, 1, 1) + beta.reshape(1, -1, 1, 1)


def _rms_norm_reference(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    x, gamma = xs
    return x / np.sqrt((x**2).mean(axis=1, keepdims=True) + attrs["eps"]) * gamma.reshape(1, -1, 1, 1)


def _norm_param(ctx: GradContext, p: Node) -> Node:
    """A norm parameter as ``[1, C, 1, 1]``: runtime ones already are; a const ``[C]`` is reshaped."""
    return p if not p.is_const or p.shape == (1, p.shape[0] if len(p.shape) == 1 else p.shape[1], 1, 1) \
        else ctx.g.const(f"{p.name}_col", p.value.reshape(1, -1, 1, 1))


def _grad_norm(ctx: GradContext, n: Node, dy: Node, center: bool) -> Grads:
    """Direct rule, for any gamma: with x_hat = (x - mean) * r and r = (mean((x - mean)^2) + eps)^-1/2,
    dx = r * (gy - mean(gy) - x_hat * mean(gy * x_hat)) with gy = gamma * dy (no centring terms for RMSNorm);
    dgamma = sum over S of dy * x_hat, dbeta = sum over S of dy. x_hat and r are recomputed by
    :func:`stable_norm`, so the backward overflows no more than the forward."""
    g, x = ctx.g, n.inputs[0]
    c = x.shape[1]

    def mean(t: Node) -> Node:
        return ctx.scale(g.reduce_sum(t, 1), 1.0 / c)

    x_hat, rstd_y, inv = stable_norm(lambda op, xs, attrs, part: g.apply(op, xs, attrs),
                                     lambda part, value: g.const(f"{n.name}_{part}", value), x, n.attrs["eps"], center)
    grads: Grads = [None] * len(n.inputs)
    if ctx.needs(0):
        gy = g.mul(dy, _norm_param(ctx, n.inputs[1]))
        inner = g.sub(gy, g.mul(x_hat, mean(g.mul(gy, x_hat))))
        grads[0] = g.mul(g.mul(rstd_y, inv), g.sub(inner, mean(gy)) if center else inner)
    if ctx.needs(1):
        grads[1] = g.reduce_sum(g.mul(dy, x_hat), 3)
    if center and ctx.needs(2):
        grads[2] = g.reduce_sum(dy, 3)
    return grads


define(OpDef("layer_norm", (X, Operand("gamma"), Operand("beta")), _infer_norm, _layer_norm_reference,
             attrs=(Attr("eps", float, 1e-5),), legalize=lambda L, n: _legalize_norm(L, n, True),
             grad=lambda ctx, n, dy: _grad_norm(ctx, n, dy, True),
             mil=MilOp("layer_norm", ("x",), ("axes", "beta", "epsilon", "gamma"), status=BANNED, constraint="ANE-31"),
             doc="LayerNorm over the channels of [1, C, 1, S] (gamma, beta: const [C] or runtime [1, C, 1, 1])"))
define(OpDef("rms_norm", (X, Operand("gamma")), _infer_norm, _rms_norm_reference,
             attrs=(Attr("eps", float, 1e-5),), legalize=lambda L, n: _legalize_norm(L, n, False), workaround="ANE-31",
             grad=lambda ctx, n, dy: _grad_norm(ctx, n, dy, False),
             doc="RMSNorm over the channels of [1, C, 1, S] (gamma: const [C] or runtime [1, C, 1, 1])"))


# -- attention ----------------------------------------------------------------------------------------
def causal_mask(s: int) -> np.ndarray:
    """``[1, 1, S, S]`` additive mask, broadcast over the heads: 0 on and below the diagonal, -65504 above.
    One [S, S] block rather than one per head (a 12-head 1024 bucket's would be 25 MB per layer)."""
    return (np.triu(np.ones((s, s)), k=1) * MASK_VALUE).reshape(1, 1, s, s)


PACKED_MASK_INPUT = "mask_packed"  # the graph input of packed prompts' mask (``prefill_graph(..., packed=True)``)
PACKED_WINDOW_MASK_INPUT = "mask_packed_window"  # and of their sliding-window layers'


def packed_causal_mask(lengths: Sequence[int], seq: int, window: int | None = None) -> np.ndarray:
    """The ``mask_packed`` input of prompts of ``lengths`` tokens laid one after the other on ``seq`` lanes:
    float32 ``[seq, seq]``, row i (a query) 0 at the keys j of the same prompt with j <= i (and, with a sliding
    ``window``, j > i - window: lanes and positions differ by the prompt's offset alone) and -65504 elsewhere;
    the lanes past the prompts (padding) see only themselves, so every row keeps a finite softmax."""
    if sum(lengths) > seq or min(lengths, default=1) < 1:
        raise ValueError(f"packed_causal_mask: prompts of {list(lengths)} tokens do not fit {seq} lanes")
    segment = np.repeat(np.arange(len(lengths) + 1), [*lengths, seq - sum(lengths)])
    segment[sum(lengths):] = len(lengths) + np.arange(seq - sum(lengths))  # padding: one lane each
    i, j = np.arange(seq)[:, None], np.arange(seq)[None, :]
    seen = (segment[:, None] == segment[None, :]) & (j <= i) & (j > i - (window or seq))
    return np.where(seen, 0.0, MASK_VALUE).astype(np.float32)


GENERATED_MASK_LIMIT = 2048  # fp16 holds every integer up to 2048: the position tables below stay exact


def generated_causal_mask(const: Callable[[str, Any], Node], apply: Callable[[str, list[Node], dict, str], Node],
                          s: int) -> Node:
    """:func:`causal_mask` ``(s)`` computed in the graph from position tables (4S values, not S*S).

    ``const(name, value)`` makes a const and ``apply(op, inputs, attrs, name)`` a dialect op (a graph's or
    a legalizer's). d = 1 + i - j is a matmul of ``[S, 2]`` rows ``(1 + i, -1)`` by ``[2, S]`` columns
    ``(1, j)``, exact in fp16; d >= 1 on and below the diagonal, d <= 0 above, so relu(1 - relu(d)) is
    0 below and 1 above, times -65504. Beyond :data:`GENERATED_MASK_LIMIT` positions it is the stored
    const (the tables would round). The emulator folds the ops back into the constant (its const folding)."""
    if s > GENERATED_MASK_LIMIT:
        return const("mask", causal_mask(s))
    i = np.arange(s, dtype=np.float64)
    rows = const("mask_rows", np.stack([1.0 + i, -np.ones(s)], axis=1).reshape(1, 1, s, 2))
    cols = const("mask_cols", np.stack([np.ones(s), i]).reshape(1, 1, 2, s))
    d = apply("matmul", [rows, cols], {"transpose_x": False, "transpose_y": False}, "mask_offset")
    below = apply("relu", [d], {}, "mask_below")
    negated = apply("mul", [below, const("mask_neg", -1.0)], {}, "mask_negated")
    above = apply("relu", [apply("add", [negated, const("mask_one", 1.0)], {}, "mask_flipped")], {}, "mask_above")
    return apply("mul", [above, const("mask_scale", MASK_VALUE)], {}, "mask")


def graph_causal_mask(g: Graph, s: int) -> Node:
    """:func:`generated_causal_mask` built in graph ``g`` (names under its current scope)."""
    return generated_causal_mask(g.const, lambda op, xs, attrs, name: g.apply(op, xs, attrs, name=name), s)


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
        mask = generated_causal_mask(L.const, lambda op, xs, attrs, part: L.op(op, xs, attrs, part=part), s)
        scaled = L.op("add", [scaled, mask], part="masked")
    probs = L.op("softmax", [scaled], {"axis": -1}, part="probs")
    ctx = L.op("matmul", [vh, probs], {"transpose_x": False, "transpose_y": True}, part="ctx")  # [1,H,hd,S]
    return L.op("reshape", [ctx], {"shape": [1, d, 1, s]})


def _grad_attention(ctx: GradContext, n: Node, dy: Node) -> Grads:
    """Recomputes the softmax P of each head (S = q^T k / sqrt(hd) + mask, ctx = v P^T), then
    dv = dctx P, dP = dctx^T v, dS = P * (dP - rowsum(P * dP)) / sqrt(hd), dq = k dS^T, dk = q dS."""
    g = ctx.g
    heads, (_, d, _, s) = n.attrs["heads"], n.shape
    hd = d // heads
    qh, kh, vh, dh = (g.reshape(t, [1, heads, hd, s]) for t in (*n.inputs, dy))
    scores = g.mul(g.matmul(qh, kh, transpose_x=True), 1.0 / math.sqrt(hd))  # [1, H, S, S]
    if n.attrs["causal"]:
        scores = g.add(scores, g.const("mask", causal_mask(s)))
    probs = g.softmax(scores, -1)
    d_probs = g.matmul(dh, vh, transpose_x=True)
    d_scores = ctx.scale(g.mul(probs, g.sub(d_probs, g.reduce_sum(g.mul(probs, d_probs), -1))), 1.0 / math.sqrt(hd))
    dq = g.matmul(kh, d_scores, transpose_y=True) if ctx.needs(0) else None
    dk = g.matmul(qh, d_scores) if ctx.needs(1) else None
    dv = g.matmul(dh, probs) if ctx.needs(2) else None
    return [None if t is None else g.reshape(t, [1, d, 1, s]) for t in (dq, dk, dv)]


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
             attrs=(Attr("heads", int), Attr("causal", bool, True)), legalize=_legalize_attention, grad=_grad_attention,
             mil=MilOp("scaled_dot_product_attention", ("key", "query", "value"), ("attn_mask",), status=BANNED,
                       constraint="ANE-23"),
             doc="multi-head attention of [1, heads*head_dim, 1, S] q, k, v"))
