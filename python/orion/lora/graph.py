"""The LoRA term of a graph's linear: ``y + B (sum_j A_j x_j)`` with every A_j and B a graph input.

A *site* is one baked linear of a model's graph (maybe fused from several Hugging Face modules, maybe
fed by several input pieces whose results are summed). ``adapters`` maps site names to ranks; a site
absent from it (or ``adapters=None``) adds nothing, so the graph is the base graph node for node.
The scale ``alpha / r`` is folded into B by the caller (``orion.lora.adapter``); the products are
``linear`` ops with runtime weights, one ``matmul`` each (ANE-32), so ``orion.autodiff`` can
differentiate with respect to the A/B inputs like any runtime weight. Training (``orion.lora.train``)
keeps PEFT's unscaled B as the parameter and passes the scale into the graph instead.
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


def adapted(g: Graph, y: Node, pieces: list[Node], site: str, adapters: Sites | None, scale: float = 1.0) -> Node:
    """``y`` (the baked linear's output over ``pieces``) plus the site's low-rank update when adapted."""
    return adapted_parts(g, [y], pieces, site, adapters, scale)[0]


def adapted_parts(g: Graph, ys: list[Node], pieces: list[Node], site: str, adapters: Sites | None,
                  scale: float = 1.0) -> list[Node]:
    """Like :func:`adapted` for a site whose output rows are the channels of several linears ``ys`` in order
    (a fused module computed as separate linears, e.g. GPT-2's ``c_attn`` as q, k and v): B's rows are split
    among them. ``scale`` multiplies ``A x`` in the graph (inference folds it into B instead: ``scale=1``)."""
    rank = (adapters or {}).get(site)
    if not rank:
        return ys
    low = None
    for j, x in enumerate(pieces):
        term = g.linear(x, g.input(a_input(site, j), [1, rank, 1, x.shape[1]]), name=f"lora_a{j}")
        low = term if low is None else g.add(low, term, name=f"lora_a_sum{j}")
    if scale != 1.0:
        low = g.mul(low, float(scale), name="lora_scale")
    widths = [y.shape[1] for y in ys]
    delta = g.linear(low, g.input(b_input(site), [1, sum(widths), 1, rank]), name="lora_b")
    if len(ys) == 1:
        return [g.add(ys[0], delta, name="lora")]
    parts = g.split(delta, widths, axis=1, name="lora_b_rows")
    return [g.add(y, d, name=f"lora{k}") for k, (y, d) in enumerate(zip(ys, parts, strict=True))]
