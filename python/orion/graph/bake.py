"""Baking: runtime inputs of a graph become constants. ``bake(graph, {"w": array})`` returns a new graph in
which input ``w`` is a ``const`` holding ``array`` (same name, shape and dtype), so the compiler folds it
into the program's weight files (a linear with a baked weight lowers to a 1x1 conv, ANE-32); every other
node is rebuilt through the op registry, so an op that needs a runtime operand refuses the baked one by
name. The original graph is not modified.

A linear's input gradient through a baked weight, which the backward transform builds as the matmul
``reshape(W)^T @ reshape(dy)`` (the weight was a runtime input then), becomes the linear ``W^T dy`` by the
transposed const: a 1x1 conv, ANE-27's fast form (and the emulator's pre-packed conv kernel), instead of a
matmul with a const operand.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from orion.graph.builder import Graph
from orion.graph.ir import GraphError, Node
from orion.limits import MAX_CONV_INPUT_CHANNELS


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
        elif (product := _baked_input_gradient(n, values)) is not None:
            dy, transposed = product
            copy[id(n)] = g.linear(copy[id(dy)], transposed, name=n.name)
        elif n.op == "const":
            copy[id(n)] = g.add_node("const", [], n.attrs, name=n.name, value=n.value, shape=n.shape, dtype=n.dtype,
                                     origin=n.origin)
        else:
            copy[id(n)] = g.add_node(n.op, [copy[id(i)] for i in n.inputs], n.attrs, name=n.name, origin=n.origin)
    for name, node in graph.outputs.items():
        g.output(copy[id(node)], name)
    return g


def _baked_input_gradient(n: Node, values: Mapping[str, np.ndarray]) -> tuple[Node, np.ndarray] | None:
    """``(dy, W^T [Cin, Cout])`` when ``n`` is ``reshape(matmul(reshape(W), reshape(dy), transpose_x=True))`` to
    ``[1, Cin, 1, S]`` with ``W`` a baked ``[1, Cout, 1, Cin]`` input and ``dy`` ``[1, Cout, 1, S]`` (a linear's
    input gradient, :func:`orion.ops.linear._grad_linear`); None otherwise."""
    if n.op != "reshape" or n.inputs[0].op != "matmul":
        return None
    product = n.inputs[0]
    if not product.attrs["transpose_x"] or product.attrs["transpose_y"]:
        return None
    w2, dy2 = product.inputs
    if w2.op != "reshape" or dy2.op != "reshape":
        return None
    w, dy = w2.inputs[0], dy2.inputs[0]
    if w.op != "input" or w.name not in values or len(w.shape) != 4 or len(dy.shape) != 4:
        return None
    _, cout, _, cin = w.shape
    s = dy.shape[3]
    if (w.shape, w2.shape, dy.shape, dy2.shape, n.shape) != ((1, cout, 1, cin), (1, 1, cout, cin), (1, cout, 1, s),
                                                          (1, 1, cout, s), (1, cin, 1, s)):
        return None
    if cout >= MAX_CONV_INPUT_CHANNELS:  # the conv's input channels (ANE-10): the matmul stays
        return None
    return dy, np.asarray(values[w.name])[0, :, 0, :].T
