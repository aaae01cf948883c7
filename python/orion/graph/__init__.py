"""The graph IR and its builder: see :class:`orion.graph.Graph`."""

from orion.graph.builder import Graph
from orion.graph.ir import DIALECT_OPS, HIGH_LEVEL_OPS, GraphError, Node

__all__ = ["DIALECT_OPS", "HIGH_LEVEL_OPS", "Graph", "GraphError", "Node"]
