"""Shape and dtype inference: the registry's rule for the op, run when a node is built so mistakes fail
where written, plus the helpers those rules share.

Every rule returns ``(shape, dtype)`` or raises :class:`GraphError` (or a
:class:`~orion.errors.ConstraintError` for an ANE rule that cannot be legalized) naming the node and the fix.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from orion.constraints import violation
from orion.graph.ir import GraphError, Node
from orion.limits import FP16_MAX, MAX_ELEMENTS

Shape = tuple[int, ...]


def infer(op: str, name: str, inputs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    """The (shape, dtype) of ``op`` applied to ``inputs``; raises naming ``name`` when it is ill-formed."""
    from orion import ops

    definition = ops.get(op, name)
    definition.check_arity(name, inputs)
    result = definition.infer(name, op, inputs, attrs)
    definition.check_operands(name, inputs)
    check_size(name, op, result[0])
    return result


def check_size(name: str, op: str, shape: Shape) -> None:
    """Refuses a tensor of more elements than the core takes (2^31), before anything is allocated for it."""
    count = math.prod(int(d) for d in shape)
    if count > MAX_ELEMENTS:
        raise fail(name, op, f"the result {list(shape)} has {count} elements, over the {MAX_ELEMENTS} a tensor may "
                   "have", "use smaller sizes (a program's tensors are far smaller)")


def fail(name: str, op: str, detail: str, fix: str) -> GraphError:
    """The error of node ``name`` (``op``): what is wrong and how to fix it."""
    return GraphError(f"node '{name}' ({op}): {detail}. Fix: {fix}")


def same_dtype(name: str, op: str, xs: list[Node]) -> str:
    """The one dtype of ``xs``; raises when they differ."""
    dtypes = {x.dtype for x in xs}
    if len(dtypes) != 1:
        raise fail(name, op, f"operand dtypes differ: {[x.dtype for x in xs]}", "cast the operands to one dtype")
    return xs[0].dtype


def axis_of(name: str, op: str, axis: int, rank: int) -> int:
    """``axis`` made non-negative for a tensor of ``rank``; raises when out of range."""
    if not -rank <= axis < rank:
        raise fail(name, op, f"axis {axis} is out of range for rank {rank}", f"use an axis in [-{rank}, {rank})")
    return axis % rank


def broadcast(name: str, op: str, a: Shape, b: Shape) -> Shape:
    """Numpy broadcasting of two shapes (scalars are shape ``()``)."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(a, b))
    except ValueError:
        raise fail(name, op, f"shapes {list(a)} and {list(b)} do not broadcast",
                   "use equal shapes, [1, C, 1, 1], [1, 1, 1, S] or a scalar for one operand") from None


def check_pow2(name: str, extent: int) -> None:
    """ANE-08: softmax runs over a power-of-two extent only."""
    if extent & (extent - 1):
        raise violation("ANE-08", name, f"softmax over an extent of {extent}",
                        f"pad that axis to {1 << extent.bit_length()} with a -{FP16_MAX:.0f} mask, or split it")


def check_cs(name: str, op: str, x: Node) -> None:
    """``x`` is a ``[1, C, 1, S]`` tensor."""
    if len(x.shape) != 4 or x.shape[0] != 1 or x.shape[2] != 1:
        raise fail(name, op, f"input shape {list(x.shape)} is not [1, C, 1, S]", "reshape the input to [1, C, 1, S]")


def unary(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    """The rule of an elementwise op of one operand: its shape and dtype."""
    return xs[0].shape, xs[0].dtype


def elementwise(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    """The rule of a broadcasting binary op."""
    return broadcast(name, op, xs[0].shape, xs[1].shape), same_dtype(name, op, xs)


def reduce(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    """The rule of a reduction over ``attrs["axis"]`` that keeps the axis with size 1."""
    shape = list(xs[0].shape)
    shape[axis_of(name, op, attrs["axis"], len(shape))] = 1
    return tuple(shape), xs[0].dtype
