"""Baking: runtime inputs of a graph become constants. ``bake(graph, {"w": array})`` returns a new graph in
which input ``w`` is a ``const`` holding ``array`` (same name, shape and dtype), so the compiler folds it
into the program's weight files (a linear with a baked weight lowers to a 1x1 conv, ANE-32); every other
node is rebuilt through the op registry, so an op that needs a runtime operand refuses the baked one by
name. The original graph is not modified.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from orion.graph.builder import Graph
from orion.graph.ir import GraphError, Node


def bake(graph: Graph, values: Mapping[str, np.ndarray]) -> Graph:
    """A copy of ``graph`` with each input named in ``values`` replaced by a const of that value."""
    inputs = {n.name: n for n in graph.inputs}
    for name, value in values.items():
        if name not in inputs:
            raise GraphError(f"bake: graph '{graph.name}' has no input '{name}' (its inputs are {sorted(inputs)}). "
                             "Fix: bake only inputs of this graph")
        shape = np.shape(value)
        if shape != inputs[name].shape:
            raise GraphError(f"bake: input '{name}' of graph '{graph.name}' is {list(inputs[name].shape)}, the value "
                             f"given is {list(shape)}. Fix: pass an array of shape {list(inputs[name].shape)}")
    g = Graph(graph.name)
    copy: dict[int, Node] = {}
    for n in graph.nodes:
        if n.op == "input" and n.name in values:
            copy[id(n)] = g._const(n.name, values[n.name], n.dtype)  # checks the fp16 range (ANE-25)
        elif n.op == "input":
            copy[id(n)] = g.input(n.name, n.shape, n.dtype)
        elif n.op == "const":
            copy[id(n)] = g.add_node("const", [], n.attrs, name=n.name, value=n.value, shape=n.shape, dtype=n.dtype,
                                     origin=n.origin)
        else:
            copy[id(n)] = g.add_node(n.op, [copy[id(i)] for i in n.inputs], n.attrs, name=n.name, origin=n.origin)
    for name, node in graph.outputs.items():
        g.output(copy[id(node)], name)
    return g
