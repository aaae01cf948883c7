"""A numpy evaluator of graphs by the registry's references (``OpDef.reference``), so legalizations are
checked numerically without the emulator: a legalized graph evaluated here must match an independent
reference of the user's op. Float64 math; it checks the rewrite, not fp16 rounding."""

from __future__ import annotations

import numpy as np

from orion import ops
from orion.autodiff import numpy_eval
from orion.graph import Graph


def evaluate(graph: Graph, dialect_only: bool = True, dtype: type = np.float32,
             **inputs: np.ndarray) -> dict[str, np.ndarray]:
    """Outputs of ``graph`` by output name, computed in float64 and returned as ``dtype`` (``dialect_only``:
    every op must be a dialect op)."""
    if dialect_only:
        high_level = [n for n in graph.nodes if n.op not in ("input", "const") and not ops.get(n.op, n.name).is_dialect]
        assert not high_level, high_level
    return {name: out.astype(dtype) for name, out in numpy_eval.evaluate(graph, inputs, np.float64).items()}
