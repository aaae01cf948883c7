"""The graph IR and its builder: see :class:`orion.graph.Graph`; the ops it builds are defined in ``orion.ops``."""

from typing import Any

from orion.graph.builder import Graph
from orion.graph.ir import GraphError, Node

__all__ = ["DIALECT_OPS", "HIGH_LEVEL_OPS", "Graph", "GraphError", "Node"]


def __getattr__(name: str) -> Any:
    """``DIALECT_OPS`` and ``HIGH_LEVEL_OPS`` come from the op registry, which itself imports this package."""
    if name in ("DIALECT_OPS", "HIGH_LEVEL_OPS"):
        from orion import ops

        return getattr(ops, name)
    raise AttributeError(f"module 'orion.graph' has no attribute {name!r}")
