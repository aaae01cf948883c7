"""The graph IR: nodes with inferred shapes and dtypes, in topological order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from orion.errors import OrionError


class GraphError(OrionError, ValueError):
    """A graph is built wrong (shape, dtype, name); the message names the node and the fix."""


@dataclass(eq=False)
class Node:
    """One value of the graph: the op that computes it, its operands and its inferred type.

    ``origin`` is the user-visible node a legalized node came from (itself for user nodes).
    ``value`` holds the data of a ``const`` node (float64 copy of the user's array).
    """

    op: str
    name: str
    inputs: list[Node]
    attrs: dict[str, Any]
    shape: tuple[int, ...]
    dtype: str
    value: np.ndarray | None = None
    origin: str = ""

    @property
    def is_const(self) -> bool:
        return self.op == "const"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * dtype_size(self.dtype)

    def __repr__(self) -> str:
        return f"Node({self.name}: {self.op} {list(self.shape)} {self.dtype})"


def dtype_size(dtype: str) -> int:
    """Bytes per element of a graph dtype."""
    return {"fp16": 2, "fp32": 4, "int32": 4, "bool": 1}[dtype]
