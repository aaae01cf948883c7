"""What an op definition is, and the one table that holds them: see :func:`define` and :func:`get`.

An :class:`OpDef` is everything Orion's Python side knows about one graph op: its operands, its
attributes with their defaults, shape/dtype inference, its MIL argument emission (dialect ops), its
legalization (high-level ops), the hardware status of the MIL op of that name, an independent numpy
reference and its gradient rule (``grad``, used by :func:`orion.autodiff.backward`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from orion.errors import CompileError
from orion.graph.ir import GraphError

if TYPE_CHECKING:
    from orion.autodiff.context import GradContext
    from orion.emit import Emitter
    from orion.graph.ir import Node
    from orion.legalize.rewrite import Legalizer

Shape = tuple[int, ...]
Arg = tuple[str, Any]  # one MIL argument: (name, name of the const or variable it references)

FLOATS = frozenset({"fp16", "fp32"})
RUNTIME, CONST, ANY = "runtime", "const", "any"
ALLOWED, BANNED, DISPUTED = "allowed", "banned", "disputed"
REQUIRED = object()  # the default of an attribute that has none

InferFn = Callable[[str, str, list["Node"], dict[str, Any]], tuple[Shape, str]]
EmitFn = Callable[["Emitter", "Node", str, list[str]], list[Arg]]
LegalizeFn = Callable[["Legalizer", "Node"], "Node"]
ReferenceFn = Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]
# grad(ctx, node, dy) -> one cotangent per operand (None where none is needed), built with ctx.g's ops
GradFn = Callable[["GradContext", "Node", "Node"], Sequence["Node | None"]]


@dataclass(frozen=True)
class Operand:
    """One input of an op: ``kind`` is runtime, const (must be a ``const`` node) or any; ``dtypes`` the
    graph dtypes it accepts. ``optional`` operands may be left off the end; a ``variadic`` one takes any
    number (>= 1) of values."""

    name: str
    kind: str = ANY
    dtypes: frozenset[str] = FLOATS
    optional: bool = False
    variadic: bool = False


@dataclass(frozen=True)
class Attr:
    """One attribute: ``convert`` normalizes the value the builder gets (``int``, ``bool``, ...)."""

    name: str
    convert: Callable[[Any], Any]
    default: Any = REQUIRED


@dataclass(frozen=True)
class MilOp:
    """A MIL op as the hardware sees it: its required and optional arguments and whether the ANE
    compiler takes it (``allowed``), rejects it (``banned``, with the catalog id) or is known to take it
    on some chips only (``disputed``: rejected unless a probe report relaxes ``constraint``).
    This is the row the C++ op table (``orion._core.op_table()``) must agree with."""

    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    status: str = ALLOWED
    constraint: str = ""

    def __post_init__(self) -> None:
        if (self.status == ALLOWED) != (self.constraint == ""):
            raise ValueError(f"MIL op {self.name}: status {self.status} with constraint {self.constraint!r}")

    def row(self) -> dict[str, Any]:
        """This op in the format of ``orion._core.op_table()``."""
        return {"name": self.name, "required": sorted(self.required), "optional": sorted(self.optional),
                "status": self.status, "constraint": self.constraint}


@dataclass(frozen=True)
class OpDef:
    """One graph op. Dialect ops have ``emit`` (and ``mil``, their allowed MIL op); high-level ops have
    ``legalize`` and, when MIL has an op of the same meaning, ``mil`` says what the hardware does with
    it (for example ``div`` -> ``real_div``, banned by ANE-30)."""

    name: str
    operands: tuple[Operand, ...]
    infer: InferFn
    reference: ReferenceFn
    attrs: tuple[Attr, ...] = ()
    emit: EmitFn | None = None
    legalize: LegalizeFn | None = None
    mil: MilOp | None = None
    workaround: str = ""  # the catalog id a legalization works around when MIL has no counterpart op
    grad: GradFn | None = None  # the gradient rule, see orion.autodiff.context
    doc: str = ""

    def __post_init__(self) -> None:
        if (self.emit is None) == (self.legalize is None):
            raise ValueError(f"op {self.name}: give exactly one of emit (dialect op) or legalize (high-level op)")
        if self.emit is not None and (self.mil is None or self.mil.name != self.name or self.mil.status != ALLOWED):
            raise ValueError(f"op {self.name}: a dialect op emits the allowed MIL op of its own name")

    @property
    def rule(self) -> str:
        """The catalog id that makes this op legalized ("" for dialect ops and plain sugar)."""
        return self.mil.constraint if self.mil is not None and not self.is_dialect else self.workaround

    @property
    def is_dialect(self) -> bool:
        """True when the op is emitted to MIL as itself."""
        return self.emit is not None

    def make_attrs(self, where: str, given: dict[str, Any]) -> dict[str, Any]:
        """``given`` converted, with defaults filled in; unknown or missing attributes raise."""
        known = {a.name for a in self.attrs}
        if set(given) - known:
            raise GraphError(f"node '{where}' ({self.name}): unknown attributes {sorted(set(given) - known)}. "
                             f"Fix: use {sorted(known)}")
        attrs = {}
        for a in self.attrs:
            value = given.get(a.name, a.default)
            if value is REQUIRED:
                raise GraphError(f"node '{where}' ({self.name}): attribute '{a.name}' is missing. Fix: give it")
            attrs[a.name] = a.convert(value)
        return attrs

    def check_arity(self, where: str, inputs: Sequence[Node]) -> None:
        """The number of ``inputs`` against the operands (checked before inference)."""
        fixed = [o for o in self.operands if not o.variadic]
        least = sum(not o.optional for o in self.operands)
        most = None if any(o.variadic for o in self.operands) else len(fixed)
        if len(inputs) < least or (most is not None and len(inputs) > most):
            raise GraphError(f"node '{where}' ({self.name}): {len(inputs)} operands, expected "
                             f"{[o.name for o in self.operands]}. Fix: pass those operands")

    def check_operands(self, where: str, inputs: Sequence[Node]) -> None:
        """Const-ness and dtype domain of ``inputs`` (after the op's own, more specific inference rule)."""
        for i, node in enumerate(inputs):
            spec = self.operands[min(i, len(self.operands) - 1)]
            if spec.kind == CONST and not node.is_const:
                raise GraphError(f"node '{where}' ({self.name}): operand '{spec.name}' ('{node.name}') is computed "
                                 "at runtime. Fix: pass a numpy array or a g.const(...)")
            if spec.kind == RUNTIME and node.is_const:
                raise GraphError(f"node '{where}' ({self.name}): operand '{spec.name}' ('{node.name}') is a const. "
                                 "Fix: pass a runtime value (a graph input or a computed node)")
            if node.dtype not in spec.dtypes:
                raise GraphError(f"node '{where}' ({self.name}): operand '{spec.name}' has dtype {node.dtype}. "
                                 f"Fix: cast it to one of {sorted(spec.dtypes)}")


@dataclass
class Registry:
    """Every :class:`OpDef` by name, plus the MIL ops the graph never builds but the hardware table lists."""

    ops: dict[str, OpDef] = field(default_factory=dict)
    mil_only: dict[str, MilOp] = field(default_factory=dict)

    def define(self, op: OpDef) -> OpDef:
        if op.name in self.ops or op.name in ("input", "const"):
            raise ValueError(f"op {op.name} is defined twice (or shadows a graph source node)")
        self.ops[op.name] = op
        return op

    def mil_ops(self) -> dict[str, MilOp]:
        """Every MIL op Orion knows of, by MIL name: dialect ops, high-level ops' counterparts, MIL-only ops."""
        known = {op.mil.name: op.mil for op in self.ops.values() if op.mil is not None}
        return {**known, **self.mil_only}


REGISTRY = Registry()


def define(op: OpDef) -> OpDef:
    """Add ``op`` to the registry (each op module calls this once per op)."""
    return REGISTRY.define(op)


def define_mil_only(op: MilOp) -> MilOp:
    """Record a MIL op the graph never builds (so the hardware tables still agree on it)."""
    REGISTRY.mil_only[op.name] = op
    return op


def get(name: str, where: str = "") -> OpDef:
    """The definition of op ``name``; an op missing from the registry is an error, never a default."""
    if name not in REGISTRY.ops:
        at = f"node '{where}': " if where else ""
        raise CompileError(f"{at}op '{name}' is not in the op registry (orion.ops). "
                           "Fix: define it with orion.ops.define(OpDef(...)) or use a registered op")
    return REGISTRY.ops[name]
