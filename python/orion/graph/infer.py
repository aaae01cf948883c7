"""Shape and dtype inference: one rule per op, run when a node is built so mistakes fail where written.

Every rule returns ``(shape, dtype)`` or raises :class:`GraphError` (or a
:class:`~orion.errors.ConstraintError` for an ANE rule that cannot be legalized) naming the node and the fix.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from orion.constraints import violation
from orion.graph.ir import GraphError, Node

Shape = tuple[int, ...]
from orion.limits import FP16_MAX, MAX_CONV_INPUT_CHANNELS


def _fail(name: str, op: str, detail: str, fix: str) -> GraphError:
    return GraphError(f"node '{name}' ({op}): {detail}. Fix: {fix}")


def _same_dtype(name: str, op: str, xs: list[Node]) -> str:
    dtypes = {x.dtype for x in xs}
    if len(dtypes) != 1:
        raise _fail(name, op, f"operand dtypes differ: {[x.dtype for x in xs]}", "cast the operands to one dtype")
    return xs[0].dtype


def _axis(name: str, op: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise _fail(name, op, f"axis {axis} is out of range for rank {rank}", f"use an axis in [-{rank}, {rank})")
    return axis % rank


def broadcast(name: str, op: str, a: Shape, b: Shape) -> Shape:
    """Numpy broadcasting of two shapes (scalars are shape ``()``)."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(a, b))
    except ValueError:
        raise _fail(name, op, f"shapes {list(a)} and {list(b)} do not broadcast",
                    "use equal shapes, [1, C, 1, 1], [1, 1, 1, S] or a scalar for one operand") from None


def _elementwise(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    return broadcast(name, op, xs[0].shape, xs[1].shape), _same_dtype(name, op, xs)


def _unary(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    return xs[0].shape, xs[0].dtype


def _pow(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    if not (xs[1].is_const and xs[1].shape == ()):
        raise _fail(name, op, "the exponent is not a scalar const", "pass the exponent as a Python float")
    return xs[0].shape, xs[0].dtype


def _linear(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    x, w = xs[0], xs[1]
    if not w.is_const:
        raise violation("ANE-32", name, f"the weight '{w.name}' is computed at runtime, conv needs a const weight",
                        "pass the weight as a numpy array or g.const(...), or use g.matmul for dynamic weights")
    if len(x.shape) != 4 or x.shape[0] != 1 or x.shape[2] != 1:
        raise _fail(name, op, f"input shape {list(x.shape)} is not [1, C, 1, S]", "reshape the input to [1, C, 1, S]")
    if len(w.shape) != 2:
        raise _fail(name, op, f"weight shape {list(w.shape)} is not [Cout, Cin]",
                    "give the weight as W[out][in] (transpose HF GPT-2 Conv1D weights)")
    cout, cin = w.shape
    if cin != x.shape[1]:
        raise _fail(name, op, f"weight has {cin} input channels, the input has {x.shape[1]}",
                    "transpose the weight to W[out][in] or fix its shape")
    if cin >= MAX_CONV_INPUT_CHANNELS:
        raise violation("ANE-10", name, f"{cin} input channels (limit < {MAX_CONV_INPUT_CHANNELS})",
                        "split the input channels into chunks below 32,000, one linear per chunk, and add the results")
    if len(xs) == 3 and xs[2].shape not in ((cout,), (1, cout, 1, 1)):
        raise _fail(name, op, f"bias shape {list(xs[2].shape)} is not [{cout}]", f"give a bias of shape [{cout}]")
    return (1, cout, 1, x.shape[3]), _same_dtype(name, op, xs)


def _conv(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    x, w = xs
    return (1, w.shape[0], 1, x.shape[3]), _same_dtype(name, op, xs)


def _matmul(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    a, b = xs[0].shape, xs[1].shape
    if len(a) < 2 or len(b) < 2:
        raise _fail(name, op, f"operands of rank {len(a)} and {len(b)}", "matmul needs rank >= 2 operands")
    m, k = (a[-1], a[-2]) if attrs["transpose_x"] else (a[-2], a[-1])
    k2, n = (b[-1], b[-2]) if attrs["transpose_y"] else (b[-2], b[-1])
    if k != k2:
        raise _fail(name, op, f"inner dimensions differ: {list(a)} x {list(b)} (transpose_x={attrs['transpose_x']}, "
                    f"transpose_y={attrs['transpose_y']})", "transpose an operand or fix its shape")
    batch = broadcast(name, op, a[:-2], b[:-2])
    return batch + (m, n), _same_dtype(name, op, xs)


def _softmax(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    shape = xs[0].shape
    extent = shape[_axis(name, op, attrs["axis"], len(shape))]
    _check_pow2(name, extent)
    return shape, xs[0].dtype


def _check_pow2(name: str, extent: int) -> None:
    if extent & (extent - 1):
        raise violation("ANE-08", name, f"softmax over an extent of {extent}",
                        f"pad that axis to {1 << extent.bit_length()} with a -{FP16_MAX:.0f} mask, or split it")


def _reduce(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    shape = list(xs[0].shape)
    shape[_axis(name, op, attrs["axis"], len(shape))] = 1
    return tuple(shape), xs[0].dtype


def _reshape(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    new = tuple(attrs["shape"])
    if any(d <= 0 for d in new) or np.prod(new) != np.prod(xs[0].shape):
        raise _fail(name, op, f"cannot reshape {list(xs[0].shape)} to {list(new)}",
                    "give a shape of positive sizes with the same element count (no -1)")
    return new, xs[0].dtype


def _transpose(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    perm, shape = list(attrs["perm"]), xs[0].shape
    if sorted(perm) != list(range(len(shape))):
        raise _fail(name, op, f"perm {perm} is not a permutation of {len(shape)} axes", "list every axis once")
    return tuple(shape[p] for p in perm), xs[0].dtype


def _cast(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    if attrs["dtype"] not in ("fp16", "fp32"):
        raise _fail(name, op, f"cast to {attrs['dtype']}", "cast to 'fp16' or 'fp32'")
    return xs[0].shape, attrs["dtype"]


def _slice(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    shape = list(xs[0].shape)
    axis = _axis(name, op, attrs["axis"], len(shape))
    start, stop = attrs["start"], attrs["stop"]
    if not 0 <= start < stop <= shape[axis]:
        raise _fail(name, op, f"slice [{start}:{stop}] of an axis of size {shape[axis]}",
                    "use 0 <= start < stop <= size (no negative indices)")
    shape[axis] = stop - start
    return tuple(shape), xs[0].dtype


def _slice_by_size(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    for b, s, d in zip(attrs["begin"], attrs["size"], xs[0].shape):
        if not (0 <= b and 0 < s and b + s <= d):
            raise _fail(name, op, f"begin {attrs['begin']} size {attrs['size']} outside {list(xs[0].shape)}",
                        "keep begin + size within the shape")
    return tuple(attrs["size"]), xs[0].dtype


def _pad(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    shape = list(xs[0].shape)
    axis = _axis(name, op, attrs["axis"], len(shape))
    if len(shape) != 4 or axis not in (1, 3):
        raise _fail(name, op, f"padding axis {attrs['axis']} of {list(xs[0].shape)}",
                    "pad a [1, C, 1, S] tensor along the channel axis 1 or the sequence axis 3")
    if attrs["before"] < 0 or attrs["after"] < 0:
        raise _fail(name, op, "negative padding", "use g.slice to drop elements")
    shape[axis] += attrs["before"] + attrs["after"]
    return tuple(shape), xs[0].dtype


def _concat(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    ref = list(xs[0].shape)
    axis = _axis(name, op, attrs["axis"], len(ref))
    for x in xs[1:]:
        other = list(x.shape)
        if len(other) != len(ref) or other[:axis] + other[axis + 1:] != ref[:axis] + ref[axis + 1:]:
            raise _fail(name, op, f"shapes {[list(x.shape) for x in xs]} differ off the concat axis {axis}",
                        "make all shapes equal except along the concat axis")
    if len(ref) != 4 or axis not in (1, 3):
        raise _fail(name, op, f"concat along axis {attrs['axis']} of rank-{len(ref)} tensors",
                    "concatenate [1, C, 1, S] tensors along the channel axis 1 or the sequence axis 3")
    ref[axis] = sum(x.shape[axis] for x in xs)
    return tuple(ref), _same_dtype(name, op, xs)


def _norm(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    x = xs[0]
    if len(x.shape) != 4 or x.shape[0] != 1 or x.shape[2] != 1:
        raise _fail(name, op, f"input shape {list(x.shape)} is not [1, C, 1, S]", "reshape the input to [1, C, 1, S]")
    for p in xs[1:]:
        if not p.is_const or p.shape != (x.shape[1],):
            raise _fail(name, op, f"parameter '{p.name}' of shape {list(p.shape)} is not a const [{x.shape[1]}]",
                        f"pass a numpy array of shape [{x.shape[1]}]")
    return x.shape, x.dtype


def _attention(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    q = xs[0]
    heads = attrs["heads"]
    for x in xs:
        if x.shape != q.shape or len(x.shape) != 4 or x.shape[0] != 1 or x.shape[2] != 1:
            raise _fail(name, op, f"q, k, v shapes {[list(x.shape) for x in xs]} are not one [1, D, 1, S]",
                        "give q, k and v as [1, heads * head_dim, 1, S]")
    if heads <= 0 or q.shape[1] % heads:
        raise _fail(name, op, f"{q.shape[1]} channels do not split into {heads} heads", "pick heads dividing D")
    _check_pow2(name, q.shape[3])
    return q.shape, _same_dtype(name, op, xs)


RULES: dict[str, Callable[[str, str, list[Node], dict[str, Any]], tuple[Shape, str]]] = {
    **{op: _elementwise for op in ("add", "sub", "mul", "div")},
    **{op: _unary for op in ("neg", "exp", "tanh", "sigmoid", "relu", "identity", "gelu", "silu", "rsqrt", "sqrt")},
    **{op: _reduce for op in ("reduce_sum", "reduce_max", "reduce_mean")},
    "pow": _pow, "linear": _linear, "conv": _conv, "matmul": _matmul, "softmax": _softmax, "reshape": _reshape,
    "transpose": _transpose, "cast": _cast, "slice": _slice, "slice_by_size": _slice_by_size, "pad": _pad,
    "concat": _concat, "layer_norm": _norm, "rms_norm": _norm, "attention": _attention,
}


def infer(op: str, name: str, inputs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    """The (shape, dtype) of ``op`` applied to ``inputs``; raises naming ``name`` when it is ill-formed."""
    return RULES[op](name, op, inputs, attrs)
