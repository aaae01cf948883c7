"""A numpy evaluator of graphs by the registry's references (``OpDef.reference``), so legalizations are
checked numerically without the emulator: a legalized graph evaluated here must match an independent
reference of the user's op. Float64 math; it checks the rewrite, not fp16 rounding."""

from __future__ import annotations

import numpy as np
from orion import ops
from orion.graph import Graph


def evaluate(graph: Graph, dialect_only: bool = True, dtype: type = np.float32,
             **inputs: np.ndarray) -> dict[str, np.ndarray]:
    """Outputs of ``graph`` by output name, as ``dtype`` (``dialect_only``: every op must be a dialect op)."""
    env: dict[int, np.ndarray] = {}
    for n in graph.nodes:
        if n.op == "input":
            r = np.asarray(inputs[n.name], np.float64)
        elif n.op == "const":
            r = np.asarray(n.value, np.float64)
        else:
            definition = ops.get(n.op, n.name)
            assert definition.is_dialect or not dialect_only, n
            r = definition.reference([env[id(i)] for i in n.inputs], n.attrs)
        assert r.shape == n.shape, (n, r.shape)
        env[id(n)] = r
    return {name: env[id(node)].astype(dtype) for name, node in graph.outputs.items()}
