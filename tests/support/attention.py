"""Fused-attention test twins: a graph's compiled program and the same MIL kept unfused."""

from __future__ import annotations

import orion
from orion.compiler import CompiledGraph, lower_graph
from orion.graph import Graph
from support.twins import also_returning


def twins(graph: Graph, **lowering) -> tuple[CompiledGraph, CompiledGraph]:
    """The compiled graph, and its unfused twin (the softmax output returned too, outside the layout):
    the chain's own five ops, which the fused causal attention must equal bit for bit. ``lowering``:
    ``lower_graph``'s options (``surface_counts`` and ``min_surface_bytes`` also given to the compiles)."""
    lowered = lower_graph(graph, **lowering)
    unfused = also_returning(lowered.mil, "softmax")
    counts = {k: v for k, v in lowering.items() if k in ("surface_counts", "min_surface_bytes")}
    return (CompiledGraph(lowered, orion.compile(lowered.mil, lowered.weights, **counts)),
            CompiledGraph(lowered, orion.compile(unfused, lowered.weights, profile="permissive", **counts)))
