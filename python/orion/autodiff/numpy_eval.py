"""Run a graph on the CPU in numpy by the registry's references (``OpDef.reference``): the fp32 path of the
partitioner for graphs that do not go to the ANE."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from orion import ops
from orion.errors import EvaluateError
from orion.graph.builder import Graph
from orion.graph.ir import Node


def evaluate(graph: Graph, inputs: dict[str, np.ndarray], dtype: type = np.float32,
             observe: Callable[[Node, np.ndarray], None] | None = None) -> dict[str, np.ndarray]:
    """The outputs of ``graph`` by name, computed in ``dtype``; ``observe(node, value)`` sees every node's value."""
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
            if value.shape != n.shape:
                raise EvaluateError(f"node '{n.name}' ({n.op}): the registry reference gave shape {list(value.shape)}, "
                                    f"inference {list(n.shape)}. Fix: the op's reference in orion.ops")
        env[id(n)] = value
        if observe is not None:
            observe(n, value)
    return {name: env[id(node)] for name, node in graph.outputs.items()}
