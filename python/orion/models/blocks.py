"""Graph building blocks shared by the models: pieces written once and used by several families."""

from __future__ import annotations

import math

import numpy as np

from orion.graph import Graph
from orion.graph.ir import Node
from orion.quant import weight_operand


def linear(g: Graph, x: Node, weight: np.ndarray, bias: np.ndarray | None, quant: str, name: str) -> Node:
    """``g.linear`` by a const ``weight`` [Cout, Cin] stored as ``quant`` says ("fp16", or "int8": W8A16
    with per-output-channel scales, orion.quant); the bias stays fp16."""
    return g.linear(x, weight_operand(g, weight, quant, name), bias, name=name)


def cached_attention(g: Graph, q: Node, k: Node, v: Node, k_cache: Node, v_cache: Node, mask: Node,
                     heads: int, scale: float | None = None) -> Node:
    """One token's multi-head attention over a KV cache plus its own key/value; the scores are scaled
    by ``scale`` (default ``1/sqrt(head_dim)``).

    ``q``, ``k``, ``v`` are ``[1, C, 1, 1]``, the caches ``[1, C, 1, T]`` and ``mask`` ``[1, 1, 1, T]``
    (additive: 0 for filled positions). softmax([q.K_cache + mask, q.k]) . [V_cache, v] written with
    reductions, so the new key needs no concat: m = max(max_t s_t, s_self);
    out = (sum_t e_t V_t + e_self v) / (sum_t e_t + e_self).
    """
    c, t = q.shape[1], k_cache.shape[3]
    d = c // heads
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qh = g.reshape(g.mul(q, scale, name="qs"), [1, heads, 1, d], name="qh")
    kh, vh = (g.reshape(n, [1, heads, 1, d], name=f"{p}h") for n, p in ((k, "k"), (v, "v")))
    keys = g.reshape(k_cache, [1, heads, d, t], name="keys")
    values = g.reshape(v_cache, [1, heads, d, t], name="values")
    scores = g.add(g.matmul(qh, keys, name="scores"), mask, name="masked")  # [1,H,1,T]
    self_score = g.reduce_sum(g.mul(qh, kh, name="qk"), axis=3, name="self")  # [1,H,1,1]
    top = g.reduce_max(scores, axis=3, name="top")
    m = g.add(self_score, g.relu(g.sub(top, self_score, name="gap"), name="over"),
              name="max")  # max(top, self_score) without a max op
    e = g.exp(g.sub(scores, m, name="shift"), name="e")
    e_self = g.exp(g.sub(self_score, m, name="shift_self"), name="e_self")
    denom = g.add(g.reduce_sum(e, axis=3, name="esum"), e_self, name="denom")
    num = g.add(g.matmul(e, values, transpose_y=True, name="ev"), g.mul(e_self, vh, name="ev_self"),
                name="num")  # [1,H,1,D]
    out = g.mul(num, g.pow(denom, -1.0, name="inv"), name="ctx")
    return g.reshape(out, [1, c, 1, 1], name="merged")
