"""FLOPs of a graph: what its live nodes compute (multiply-adds count two; elementwise ops one per element)."""

from __future__ import annotations

import numpy as np

from orion.graph.builder import Graph
from orion.graph.ir import Node

_FREE = frozenset({"input", "const", "reshape", "transpose", "cast", "identity", "slice", "slice_by_size"})


def node_flops(n: Node) -> float:
    """FLOPs of one node (before legalization)."""
    out = float(np.prod(n.shape))
    if n.op in _FREE:
        return 0.0
    if n.op in ("linear", "conv"):
        cin = n.inputs[0].shape[1]
        return 2.0 * cin * out + (out if len(n.inputs) == 3 else 0.0)
    if n.op == "matmul":
        x = n.inputs[0].shape
        inner = x[-2] if n.attrs["transpose_x"] else x[-1]
        return 2.0 * inner * out
    if n.op == "attention":
        d, s = n.shape[1], n.shape[3]
        return 4.0 * d * s * s + 5.0 * n.attrs["heads"] * s * s  # two matmuls; scale, mask, softmax
    if n.op in ("layer_norm", "rms_norm"):
        return 8.0 * out
    if n.op in ("gelu", "silu", "softmax"):
        return 8.0 * out
    return max(out, float(np.prod(n.inputs[0].shape)) if n.inputs else 0.0)


def graph_flops(graph: Graph) -> float:
    """FLOPs of the nodes the outputs depend on (a gradient graph's unused forward copies are not counted)."""
    live: set[int] = set()
    stack = list(graph.outputs.values())
    while stack:
        n = stack.pop()
        if id(n) not in live:
            live.add(id(n))
            stack.extend(n.inputs)
    return sum(node_flops(n) for n in graph.nodes if id(n) in live)
