"""Run a graph the way a test asks (``mode`` fixture): legalized IR in numpy, or compiled on the emulator."""

from __future__ import annotations

import re

import numpy as np

from orion.compiler import compile_graph
from orion.graph import DIALECT_OPS, Graph
from orion.legalize import legalize
from support.compiler.dialect_eval import evaluate

MIL_OPS = DIALECT_OPS - {"input"}


def emitted_ops(mil: str) -> set[str]:
    """Op names of every statement of a MIL text."""
    return set(re.findall(r"^\s*[^=\n]*=\s*([a-z_]+)\(", mil, re.MULTILINE))


def run(g: Graph, mode: str, io_dtype: str = "fp16", **inputs: np.ndarray) -> dict[str, np.ndarray]:
    """Outputs of ``g`` by name; in "ir" mode also asserts the legalized graph is dialect-only."""
    if mode == "ir":
        legal = legalize(g)
        assert {n.op for n in legal.nodes} <= DIALECT_OPS
        return evaluate(legal, **inputs)
    compiled = compile_graph(g, io_dtype=io_dtype)
    assert emitted_ops(compiled.mil) <= MIL_OPS, emitted_ops(compiled.mil) - MIL_OPS
    return {k: v.astype(np.float32) for k, v in compiled(**inputs).items()}


def tolerance(mode: str, scale: float = 1.0) -> dict[str, float]:
    """fp32 numpy checks the rewrite tightly; the emulator computes in fp16."""
    return {"atol": 1e-4 * scale, "rtol": 1e-4} if mode == "ir" else {"atol": 2e-2 * scale, "rtol": 2e-2}
