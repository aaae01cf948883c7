"""Cast fusion: no-op casts disappear and ``cast(cast(x))`` becomes one cast (or ``x``), so no cast pair
is left. fp32 -> fp16 -> fp32 folds to nothing: the ANE computes in fp16 either way."""

from __future__ import annotations

from orion.graph.builder import Graph
from orion.passes.base import PassContext

NAME = "cast fusion"


def run(graph: Graph, ctx: PassContext) -> list[str]:
    changes = []
    for node in [n for n in graph.nodes if n.op == "cast"]:
        src = node.inputs[0]
        if src.op == "cast":
            node.inputs = [src.inputs[0]]
            changes.append(f"fused {src.name} into {node.name}")
            src = node.inputs[0]
        if src.dtype == node.dtype:
            graph.replace_uses(node, src)
            graph.remove(node)
            changes.append(f"removed no-op {node.name} ({src.dtype})")
    return changes
