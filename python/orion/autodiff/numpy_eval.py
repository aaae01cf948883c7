"""Run a graph on the CPU in numpy by the registry's references (``OpDef.reference``): the fp32 path of the
partitioner for graphs that do not go to the ANE."""

from __future__ import annotations

import numpy as np

from orion import ops
from orion.errors import EvaluateError
from orion.graph.builder import Graph


def evaluate(graph: Graph, inputs: dict[str, np.ndarray], dtype: type = np.float32) -> dict[str, np.ndarray]:
    """The outputs of ``graph`` by name, computed in ``dtype``."""
    missing = sorted({n.name for n in graph.inputs} - set(inputs))
    if missing:
        raise EvaluateError(f"graph '{graph.name}': inputs {missing} are missing. Fix: pass every graph input")
    env: dict[int, np.ndarray] = {}
    for n in graph.nodes:
        if n.op == "input":
            value = np.asarray(inputs[n.name], dtype)
            if value.shape != n.shape:
                raise EvaluateError(f"graph '{graph.name}': input '{n.name}' has shape {list(value.shape)}, expected "
                                    f"{list(n.shape)}. Fix: pass the declared shape")
        elif n.op == "const":
            value = np.asarray(n.value, dtype)
        else:
            value = np.asarray(ops.get(n.op, n.name).reference([env[id(i)] for i in n.inputs], n.attrs), dtype)
        env[id(n)] = value
    return {name: env[id(node)] for name, node in graph.outputs.items()}
