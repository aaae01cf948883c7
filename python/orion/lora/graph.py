"""The LoRA term of a graph's linear: ``y + B (sum_j A_j x_j)`` with every A_j and B a graph input.

A *site* is one baked linear of a model's graph (maybe fused from several Hugging Face modules, maybe
fed by several input pieces whose results are summed). ``adapters`` maps site names to ranks; a site
absent from it (or ``adapters=None``) adds nothing, so the graph is the base graph node for node.
The scale ``alpha / r`` is folded into B by the caller (``orion.lora.adapter``); the products are
``linear`` ops with runtime weights, one ``matmul`` each (ANE-32), so ``orion.autodiff`` can
differentiate with respect to the A/B inputs like any runtime weight.
"""

from __future__ import annotations

from collections.abc import Mapping

from orion.graph import Graph
from orion.graph.ir import Node

Sites = Mapping[str, int]  # site name -> rank of the adapted program variant


def a_input(site: str, piece: int) -> str:
    """Graph input name of ``A`` for input piece ``piece`` of ``site``: ``[1, rank, 1, in_piece]``."""
    return f"lora_a_{site}_{piece}"


def b_input(site: str) -> str:
    """Graph input name of ``B`` (scale folded in) of ``site``: ``[1, out, 1, rank]``."""
    return f"lora_b_{site}"


def adapted(g: Graph, y: Node, pieces: list[Node], site: str, adapters: Sites | None) -> Node:
    """``y`` (the baked linear's output over ``pieces``) plus the site's low-rank update when adapted."""
    rank = (adapters or {}).get(site)
    if not rank:
        return y
    low = None
    for j, x in enumerate(pieces):
        term = g.linear(x, g.input(a_input(site, j), [1, rank, 1, x.shape[1]]), name=f"lora_a{j}")
        low = term if low is None else g.add(low, term, name=f"lora_a_sum{j}")
    delta = g.linear(low, g.input(b_input(site), [1, y.shape[1], 1, rank]), name="lora_b")
    return g.add(y, delta, name="lora")
