"""Fused-attention test twins: a graph's compiled program and the same MIL kept unfused."""

from __future__ import annotations

import re

import orion
from orion.compiler import CompiledGraph, lower_graph
from orion.graph import Graph


def twins(graph: Graph, **lowering) -> tuple[CompiledGraph, CompiledGraph]:
    """The compiled graph, and its unfused twin (the softmax output returned too, outside the layout):
    the chain's own five ops, which the fused causal attention must equal bit for bit. ``lowering``:
    ``lower_graph``'s options (``surface_counts`` and ``min_surface_bytes`` also given to the compiles)."""
    lowered = lower_graph(graph, **lowering)
    probs = re.search(r"(\w+) = softmax", lowered.mil).group(1)
    returned = re.search(r"\} -> \((.*)\);", lowered.mil).group(1)
    unfused = lowered.mil.replace(f"}} -> ({returned});", f"}} -> ({returned}, {probs});")
    counts = {k: v for k, v in lowering.items() if k in ("surface_counts", "min_surface_bytes")}
    return (CompiledGraph(lowered, orion.compile(lowered.mil, lowered.weights, **counts)),
            CompiledGraph(lowered, orion.compile(unfused, lowered.weights, profile="permissive", **counts)))
