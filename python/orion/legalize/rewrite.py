"""Legalization: rewrite a user graph into a new graph that uses only the conservative MIL dialect.

Each high-level op expands by its registry legalization (``OpDef.legalize``, in ``orion.ops``) into
dialect ops (docs/hardware.md §4, §7); expanded nodes are named ``<node>_<part>`` and keep the user
node as their ``origin``. The result of an expansion keeps the user node's name.
"""

from __future__ import annotations

import numpy as np

from orion import ops
from orion.errors import CompileError
from orion.graph.builder import Graph
from orion.graph.ir import Node


class Legalizer:
    """Builds the legalized copy of a graph; the helpers op legalizations use to add nodes."""

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
            self.map[old] = self.g.add_node("const", [], old.attrs, name=old.name, value=old.value, shape=old.shape,
                                            dtype=old.dtype, origin=old.origin)
        return self.map[old]

    def const_as(self, old: Node, shape: tuple[int, ...]) -> Node:
        """A const holding ``old``'s data in ``shape`` (shared between uses)."""
        key = (id(old), shape)
        if key not in self.reshaped:
            attrs = {"quantized": old.attrs["quantized"].reshaped(shape)} if "quantized" in old.attrs else None
            self.reshaped[key] = self.g.add_node("const", [], attrs, name=old.name, value=old.value.reshape(shape),
                                                 shape=shape, dtype=old.dtype, origin=old.origin)
        return self.reshaped[key]

    def const(self, part: str, value: np.ndarray | float) -> Node:
        """A new const ``<node>_<part>`` of the node being expanded."""
        value = np.asarray(value, dtype=np.float64)
        return self.g.add_node("const", [], name=f"{self.cur.name}_{part}", value=value, shape=value.shape,
                               dtype=self.cur.dtype, origin=self.cur.origin)

    def op(self, op: str, inputs: list[Node], attrs: dict | None = None, part: str | None = None) -> Node:
        """Add a dialect op; ``part=None`` gives it the name of the node being expanded."""
        name = self.cur.name if part is None else f"{self.cur.name}_{part}"
        return self.g.add_node(op, inputs, attrs, name=name, origin=self.cur.origin)

    def mul_scalar(self, x: Node, v: float, part: str | None) -> Node:
        """``x * v`` with ``v`` a scalar const."""
        return self.op("mul", [x, self.const(f"{part or 'out'}_y", v)], part=part)

    # -- driver ---------------------------------------------------------------------------------------
    def run(self) -> Graph:
        for node in self.src.nodes:
            self.cur = node
            if node.op == "input":
                self.map[node] = self.g.add_node("input", [], name=node.name, shape=node.shape, dtype=node.dtype)
            elif node.op == "const":
                continue  # materialized on first use
            else:
                self.map[node] = expand(self, node)
        for name, node in self.src.outputs.items():
            self.g.outputs[name] = self.get(node)
        return self.g


def expand(L: Legalizer, node: Node) -> Node:
    """The legalized form of one node: itself for a dialect op, else its registry legalization."""
    definition = ops.get(node.op, node.name)
    if definition.is_dialect:
        return L.op(node.op, [L.get(i) for i in node.inputs], node.attrs)
    return definition.legalize(L, node)


def legalize(graph: Graph) -> Graph:
    """A new graph computing the same outputs with conservative-dialect ops only."""
    out = Legalizer(graph).run()
    bad = sorted({n.op for n in out.nodes} - ops.DIALECT_OPS)
    if bad:
        raise CompileError(f"graph '{graph.name}': the legalizations left ops {bad} that MIL cannot take. "
                           "Fix: make their OpDef.legalize emit dialect ops only")
    return out
