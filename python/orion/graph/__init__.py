"""The graph IR and its builder: see :class:`orion.graph.Graph`; the ops it builds are defined in ``orion.ops``."""

from orion.graph.builder import Graph
from orion.graph.ir import GraphError, Node
from orion.ops import DIALECT_OPS, HIGH_LEVEL_OPS

__all__ = ["DIALECT_OPS", "HIGH_LEVEL_OPS", "Graph", "GraphError", "Node"]
