"""Dead-code elimination: drop every node no output depends on (inputs stay: they are the interface)."""

from __future__ import annotations

from orion.graph.builder import Graph
from orion.passes.base import PassContext

NAME = "dead-code elimination"


def run(graph: Graph, ctx: PassContext) -> list[str]:
    live: set[int] = set()
    stack = list(graph.outputs.values())
    while stack:
        node = stack.pop()
        if id(node) not in live:
            live.add(id(node))
            stack.extend(node.inputs)
    dead = [n for n in graph.nodes if id(n) not in live and n.op != "input"]
    for n in dead:
        graph.remove(n)
    return [f"removed {n.name} ({n.op})" for n in dead]
