"""A numpy evaluator of legalized graphs (dialect ops only), so legalizations are checked numerically
without the emulator. fp32 math; it checks the rewrite, not fp16 rounding."""

from __future__ import annotations

import numpy as np

from orion.graph import DIALECT_OPS, Graph


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def evaluate(graph: Graph, **inputs: np.ndarray) -> dict[str, np.ndarray]:
    """Outputs of a legalized graph by output name."""
    env: dict[int, np.ndarray] = {}
    for n in graph.nodes:
        assert n.op in DIALECT_OPS, n
        a = n.attrs
        xs = [env[id(i)] for i in n.inputs]
        if n.op == "input":
            r = np.asarray(inputs[n.name], np.float32)
        elif n.op == "const":
            r = np.asarray(n.value, np.float32)
        elif n.op == "conv":
            r = np.einsum("oc,bcis->bois", xs[1][:, :, 0, 0], xs[0])
        elif n.op == "matmul":
            x = np.swapaxes(xs[0], -1, -2) if a["transpose_x"] else xs[0]
            y = np.swapaxes(xs[1], -1, -2) if a["transpose_y"] else xs[1]
            r = x @ y
        elif n.op in ("add", "sub", "mul", "pow"):
            r = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "pow": np.power}[n.op](xs[0], xs[1])
        elif n.op in ("tanh", "exp"):
            r = getattr(np, n.op)(xs[0])
        elif n.op == "sigmoid":
            r = 1 / (1 + np.exp(-xs[0]))
        elif n.op == "relu":
            r = np.maximum(xs[0], 0)
        elif n.op in ("identity", "cast"):
            r = xs[0]
        elif n.op == "softmax":
            r = _softmax(xs[0], a["axis"])
        elif n.op == "reduce_sum":
            r = xs[0].sum(axis=a["axis"], keepdims=True)
        elif n.op == "reduce_max":
            r = xs[0].max(axis=a["axis"], keepdims=True)
        elif n.op == "reshape":
            r = xs[0].reshape(a["shape"])
        elif n.op == "transpose":
            r = np.transpose(xs[0], a["perm"])
        else:  # slice_by_size
            r = xs[0][tuple(slice(b, b + s) for b, s in zip(a["begin"], a["size"]))]
        assert r.shape == n.shape, (n, r.shape)
        env[id(n)] = np.asarray(r, np.float32)
    return {name: env[id(node)] for name, node in graph.outputs.items()}
