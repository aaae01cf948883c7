"""What a gradient rule sees: :class:`GradContext`, the graph under construction plus the helpers rules share.

A rule is ``grad(ctx, node, dy) -> one cotangent per operand`` (``None`` where no gradient is needed or
none flows), registered as ``OpDef.grad``. ``node`` is the forward node as recomputed inside the gradient
graph (its ``inputs`` are the recomputed operands), ``dy`` the cotangent of its result. Rules build with
the ordinary :class:`orion.Graph` methods, so a gradient graph is itself a graph the compiler lowers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orion.errors import CompileError
from orion.graph.builder import Graph
from orion.graph.ir import Node


class GradientError(CompileError):
    """A gradient cannot be derived (an op without a rule, an input that does not reach the outputs, ...)."""


@dataclass
class GradContext:
    """The gradient graph ``g`` and, for the node being differentiated, which operands need a cotangent."""

    g: Graph
    node: Node
    needed: tuple[bool, ...]

    def needs(self, i: int) -> bool:
        """True when operand ``i`` of the node needs a cotangent."""
        return i < len(self.needed) and self.needed[i]

    def fail(self, detail: str, fix: str) -> GradientError:
        """The error of a rule that cannot differentiate this node."""
        return GradientError(f"node '{self.node.name}' ({self.node.op}): {detail}. Fix: {fix}")

    def unbroadcast(self, d: Node, like: Node) -> Node:
        """``d`` summed over the axes ``like`` was broadcast along, in ``like``'s shape."""
        rank = len(d.shape)
        padded = (1,) * (rank - len(like.shape)) + tuple(like.shape)
        for axis in range(rank):
            if padded[axis] == 1 and d.shape[axis] != 1:
                d = self.g.reduce_sum(d, axis)
        return d if d.shape == tuple(like.shape) else self.g.reshape(d, list(like.shape))

    def expand(self, d: Node, shape: Sequence[int]) -> Node:
        """``d`` broadcast to ``shape`` (a product with a ones constant of that shape: one-sided broadcast)."""
        shape = tuple(shape)
        return d if d.shape == shape else self.g.mul(d, self.g.const("ones", np.ones(shape)))

    def scale(self, d: Node, factor: float) -> Node:
        """``d * factor`` for a Python scalar."""
        return self.g.mul(d, float(factor))
