"""The op registry: every graph op is defined once, here, with its operands, attributes, inference,
MIL emission or legalization, hardware status, numpy reference and gradient slot.

Define an op with :func:`define` (see :class:`OpDef`); look one up with :func:`get`, which raises for
an op that is not registered. One module per family: ``elementwise``, ``linear``, ``reduction``,
``tensor``; ``quantization`` lists MIL ops the graph never builds.
"""

from __future__ import annotations

from orion.ops import elementwise, linear, quantization, reduction, tensor  # noqa: F401 - they define the ops
from orion.ops.base import (
    ALLOWED,
    ANY,
    BANNED,
    CONST,
    DISPUTED,
    FLOATS,
    REGISTRY,
    REQUIRED,
    RUNTIME,
    Attr,
    MilOp,
    OpDef,
    Operand,
    define,
    define_mil_only,
    get,
)
from orion.ops.reduction import (
    MASK_VALUE,
    PACKED_MASK_INPUT,
    PACKED_WINDOW_MASK_INPUT,
    causal_mask,
    graph_causal_mask,
    packed_causal_mask,
    stable_norm,
)

SOURCES = frozenset({"input", "const"})  # graph nodes that are not ops: the interface and the data
DIALECT_OPS = SOURCES | {name for name, op in REGISTRY.ops.items() if op.is_dialect}
HIGH_LEVEL_OPS = frozenset(name for name, op in REGISTRY.ops.items() if not op.is_dialect)

__all__ = [
    "ALLOWED", "ANY", "BANNED", "CONST", "DIALECT_OPS", "DISPUTED", "FLOATS", "HIGH_LEVEL_OPS", "MASK_VALUE",
    "PACKED_MASK_INPUT", "PACKED_WINDOW_MASK_INPUT",
    "REGISTRY", "REQUIRED", "RUNTIME", "SOURCES", "Attr", "MilOp", "OpDef", "Operand", "causal_mask", "define",
    "define_mil_only", "get", "graph_causal_mask", "packed_causal_mask", "stable_norm",
]
