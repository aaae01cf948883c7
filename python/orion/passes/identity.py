"""Identity elimination: ``identity(x)`` is replaced by ``x`` everywhere (emission re-adds one only where
a returned name needs its own variable)."""

from __future__ import annotations

from orion.graph.builder import Graph
from orion.passes.base import PassContext

NAME = "identity elimination"


def run(graph: Graph, ctx: PassContext) -> list[str]:
    changes = []
    for node in [n for n in graph.nodes if n.op == "identity"]:
        graph.replace_uses(node, node.inputs[0])
        graph.remove(node)
        changes.append(f"removed {node.name}: uses now read {node.inputs[0].name}")
    return changes
