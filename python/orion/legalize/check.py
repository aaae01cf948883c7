"""Whole-graph constraint checks that no single node can make (per-node ones run at build time)."""

from __future__ import annotations

from orion.constraints import violation
from orion.graph.builder import Graph


def check_fusion_depth(graph: Graph, max_layers: int) -> None:
    """ANE-09: at most ``max_layers`` attention blocks (one per transformer layer) in one program."""
    attention = [n.name for n in graph.nodes if n.op == "attention"]
    if len(attention) > max_layers:
        raise violation("ANE-09", attention[max_layers],
                        f"{len(attention)} attention layers fused in one program (max_layers={max_layers})",
                        "build one graph per layer and chain the programs, or raise max_layers once verified")
