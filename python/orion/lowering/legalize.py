"""Legalization: rewrite a user graph into a new graph that uses only the conservative MIL dialect.

Each high-level op expands into ops of :data:`orion.graph.DIALECT_OPS` (FACTS sections 4 and 7);
expanded nodes are named ``<node>_<part>`` and keep the user node as their ``origin``. The result of
an expansion keeps the user node's name.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from orion.errors import CompileError
from orion.graph.builder import Graph
from orion.graph.ir import DIALECT_OPS, Node
from orion.limits import FP16_MAX

MASK_VALUE = -FP16_MAX  # additive causal mask above the diagonal
GELU_C = math.sqrt(2.0 / math.pi)


class _Legalizer:
    """Replays a graph node by node into a fresh graph, expanding high-level ops."""

    def __init__(self, source: Graph) -> None:
        self.src = source
        self.g = Graph(source.name)
        self.map: dict[Node, Node] = {}
        self.reshaped: dict[tuple[int, tuple[int, ...]], Node] = {}
        self.cur: Node = source.nodes[0] if source.nodes else Node("const", "", [], {}, (), "fp16")

    # -- helpers ----------------------------------------------------------------------------------
    def get(self, old: Node) -> Node:
        """The new node for ``old``; consts are materialized on first use."""
        if old not in self.map:
            self.map[old] = self.g.add_node("const", [], name=old.name, value=old.value, shape=old.shape,
                                            dtype=old.dtype, origin=old.origin)
        return self.map[old]

    def const_as(self, old: Node, shape: tuple[int, ...]) -> Node:
        """A const holding ``old``'s data in ``shape`` (shared between uses)."""
        key = (id(old), shape)
        if key not in self.reshaped:
            self.reshaped[key] = self.g.add_node("const", [], name=old.name, value=old.value.reshape(shape),
                                                 shape=shape, dtype=old.dtype, origin=old.origin)
        return self.reshaped[key]

    def const(self, part: str, value: np.ndarray | float) -> Node:
        value = np.asarray(value, dtype=np.float64)
        return self.g.add_node("const", [], name=f"{self.cur.name}_{part}", value=value, shape=value.shape,
                               dtype=self.cur.dtype, origin=self.cur.origin)

    def op(self, op: str, inputs: list[Node], attrs: dict | None = None, part: str | None = None) -> Node:
        """Add a dialect op; ``part=None`` gives it the name of the node being expanded."""
        name = self.cur.name if part is None else f"{self.cur.name}_{part}"
        return self.g.add_node(op, inputs, attrs, name=name, origin=self.cur.origin)

    def mul_scalar(self, x: Node, v: float, part: str | None) -> Node:
        return self.op("mul", [x, self.const(f"{part or 'out'}_y", v)], part=part)

    # -- driver ---------------------------------------------------------------------------------------
    def run(self) -> Graph:
        for node in self.src.nodes:
            self.cur = node
            if node.op == "input":
                self.map[node] = self.g.add_node("input", [], name=node.name, shape=node.shape, dtype=node.dtype)
            elif node.op == "const":
                continue  # materialized on first use
            elif node.op in DIALECT_OPS:
                self.map[node] = self.op(node.op, [self.get(i) for i in node.inputs], node.attrs)
            else:
                self.map[node] = EXPANSIONS[node.op](self, node)
        for name, node in self.src.outputs.items():
            self.g.outputs[name] = self.get(node)
        return self.g


def _linear(L: _Legalizer, n: Node) -> Node:
    x, w = L.get(n.inputs[0]), n.inputs[1]
    cout, cin = w.shape
    weight = L.const_as(w, (cout, cin, 1, 1))
    if len(n.inputs) == 2:
        return L.op("conv", [x, weight])
    conv = L.op("conv", [x, weight], part="conv")
    return L.op("add", [conv, L.const_as(n.inputs[2], (1, cout, 1, 1))])


def _neg(L: _Legalizer, n: Node) -> Node:
    return L.mul_scalar(L.get(n.inputs[0]), -1.0, None)


def _div(L: _Legalizer, n: Node) -> Node:
    x, y = n.inputs
    if y.is_const:
        if np.any(y.value == 0):
            raise CompileError(f"node '{n.name}' (div): division by a constant zero. Fix: remove the zero")
        return L.op("mul", [L.get(x), L.const("recip", 1.0 / y.value)])
    recip = L.op("pow", [L.get(y), L.const("recip_y", -1.0)], part="recip")
    return L.op("mul", [L.get(x), recip])


def _reduce_mean(L: _Legalizer, n: Node) -> Node:
    x = L.get(n.inputs[0])
    total = L.op("reduce_sum", [x], n.attrs, part="sum")
    return L.mul_scalar(total, 1.0 / x.shape[n.attrs["axis"]], None)


def _slice(L: _Legalizer, n: Node) -> Node:
    x = L.get(n.inputs[0])
    axis = n.attrs["axis"] % len(x.shape)
    begin = [0] * len(x.shape)
    begin[axis] = n.attrs["start"]
    return L.op("slice_by_size", [x], {"begin": begin, "size": list(n.shape)})


def placement(n_in: int, n_out: int, offset: int) -> np.ndarray:
    """``[n_in, n_out]`` 0/1 matrix moving element i to position ``offset + i``."""
    p = np.zeros((n_in, n_out))
    p[np.arange(n_in), offset + np.arange(n_in)] = 1.0
    return p


def _place(L: _Legalizer, x: Node, axis: int, total: int, offset: int, part: str | None) -> Node:
    """``x`` moved to ``offset`` of a zero tensor of extent ``total`` along axis 1 (conv) or 3 (matmul)."""
    size = x.shape[axis]
    if axis == 1:
        w = L.const(f"{part or 'out'}_weight", placement(size, total, offset).T.reshape(total, size, 1, 1))
        return L.op("conv", [x, w], part=part)
    p = L.const(f"{part or 'out'}_y", placement(size, total, offset).reshape(1, 1, size, total))
    return L.op("matmul", [x, p], {"transpose_x": False, "transpose_y": False}, part=part)


def _pad(L: _Legalizer, n: Node) -> Node:
    axis = n.attrs["axis"] % 4
    return _place(L, L.get(n.inputs[0]), axis, n.shape[axis], n.attrs["before"], None)


def _concat(L: _Legalizer, n: Node) -> Node:
    axis, offset = n.attrs["axis"] % 4, 0
    acc = None
    for i, src in enumerate(n.inputs):
        last = i == len(n.inputs) - 1
        placed = _place(L, L.get(src), axis, n.shape[axis], offset, f"part{i}")
        offset += src.shape[axis]
        acc = placed if acc is None else L.op("add", [acc, placed], part=None if last else f"sum{i}")
    return acc if len(n.inputs) > 1 else L.op("identity", [acc])


def _gelu(L: _Legalizer, n: Node) -> Node:
    x = L.get(n.inputs[0])
    x2 = L.op("mul", [x, x], part="x2")
    x3 = L.op("mul", [x2, x], part="x3")
    inner = L.op("add", [x, L.mul_scalar(x3, 0.044715, "cubic")], part="inner")
    t = L.op("tanh", [L.mul_scalar(inner, GELU_C, "scaled")], part="tanh")
    half_x = L.mul_scalar(x, 0.5, "half")
    return L.op("mul", [half_x, L.op("add", [t, L.const("one", 1.0)], part="onep")])


def _silu(L: _Legalizer, n: Node) -> Node:
    x = L.get(n.inputs[0])
    return L.op("mul", [x, L.op("sigmoid", [x], part="sigmoid")])


def _pow_of(exponent: float) -> Callable[[_Legalizer, Node], Node]:
    def expand(L: _Legalizer, n: Node) -> Node:
        return L.op("pow", [L.get(n.inputs[0]), L.const("y", exponent)])
    return expand


def _norm(L: _Legalizer, n: Node, center: bool) -> Node:
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


def causal_mask(heads: int, s: int) -> np.ndarray:
    """``[1, heads, S, S]`` additive mask: 0 on and below the diagonal, -65504 above."""
    upper = np.triu(np.ones((s, s)), k=1) * MASK_VALUE
    return np.broadcast_to(upper, (1, heads, s, s)).copy()


def _attention(L: _Legalizer, n: Node) -> Node:
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


EXPANSIONS: dict[str, Callable[[_Legalizer, Node], Node]] = {
    "linear": _linear, "neg": _neg, "div": _div, "reduce_mean": _reduce_mean, "slice": _slice, "pad": _pad,
    "concat": _concat, "gelu": _gelu, "silu": _silu, "rsqrt": _pow_of(-0.5), "sqrt": _pow_of(0.5),
    "layer_norm": lambda L, n: _norm(L, n, True), "rms_norm": lambda L, n: _norm(L, n, False),
    "attention": _attention,
}


def legalize(graph: Graph) -> Graph:
    """A new graph computing the same outputs with conservative-dialect ops only."""
    out = _Legalizer(graph).run()
    bad = sorted({n.op for n in out.nodes} - DIALECT_OPS)
    if bad:
        raise CompileError(f"graph '{graph.name}': no legalization for ops {bad}")
    return out
