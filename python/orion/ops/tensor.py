"""Layout ops: reshape, transpose, cast, slice_by_size (dialect); slice, pad and concat (high-level:
slice_by_size, and placement by conv's zero padding, then adds of the disjoint parts, since MIL's concat
is rejected, ANE-01)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from orion.graph.infer import axis_of, fail, same_dtype
from orion.ops.base import BANNED, Attr, MilOp, OpDef, Operand, define

if TYPE_CHECKING:
    from orion.autodiff.context import GradContext
    from orion.emit import Emitter
    from orion.graph.ir import Node
    from orion.legalize.rewrite import Legalizer

X = Operand("x")
Shape = tuple[int, ...]
Grads = list["Node | None"]


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values]


def _infer_reshape(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    new = tuple(attrs["shape"])
    if any(d <= 0 for d in new) or np.prod(new) != np.prod(xs[0].shape):
        raise fail(name, op, f"cannot reshape {list(xs[0].shape)} to {list(new)}",
                   "give a shape of positive sizes with the same element count (no -1)")
    return new, xs[0].dtype


define(OpDef("reshape", (X,), _infer_reshape, lambda xs, a: xs[0].reshape(a["shape"]), attrs=(Attr("shape", _ints),),
             emit=lambda e, n, out, refs: [("shape", e.ints(out, "shape", n.attrs["shape"])), ("x", refs[0])],
             mil=MilOp("reshape", ("shape", "x")), grad=lambda ctx, n, dy: [ctx.g.reshape(dy, n.inputs[0].shape)],
             doc="same data, new shape"))


def _infer_transpose(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    perm, shape = list(attrs["perm"]), xs[0].shape
    if sorted(perm) != list(range(len(shape))):
        raise fail(name, op, f"perm {perm} is not a permutation of {len(shape)} axes", "list every axis once")
    return tuple(shape[p] for p in perm), xs[0].dtype


define(OpDef("transpose", (X,), _infer_transpose, lambda xs, a: np.transpose(xs[0], a["perm"]),
             attrs=(Attr("perm", _ints),),
             emit=lambda e, n, out, refs: [("perm", e.ints(out, "perm", n.attrs["perm"])), ("x", refs[0])],
             mil=MilOp("transpose", ("perm", "x")),
             grad=lambda ctx, n, dy: [ctx.g.transpose(dy, [int(i) for i in np.argsort(n.attrs["perm"])])],
             doc="permute the axes"))


def _infer_cast(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    if attrs["dtype"] not in ("fp16", "fp32"):
        raise fail(name, op, f"cast to {attrs['dtype']}", "cast to 'fp16' or 'fp32'")
    return xs[0].shape, attrs["dtype"]


define(OpDef("cast", (X,), _infer_cast, lambda xs, a: xs[0], attrs=(Attr("dtype", str),),
             emit=lambda e, n, out, refs: [("dtype", e.string(out, "dtype", n.attrs["dtype"])), ("x", refs[0])],
             mil=MilOp("cast", ("dtype", "x")), grad=lambda ctx, n, dy: [ctx.g.cast(dy, n.inputs[0].dtype)],
             doc="convert to fp16 or fp32 (the reference keeps float64)"))


def _infer_slice_by_size(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    for b, s, d in zip(attrs["begin"], attrs["size"], xs[0].shape):
        if not (0 <= b and 0 < s and b + s <= d):
            raise fail(name, op, f"begin {attrs['begin']} size {attrs['size']} outside {list(xs[0].shape)}",
                       "keep begin + size within the shape")
    return tuple(attrs["size"]), xs[0].dtype


def _emit_slice_by_size(e: Emitter, n: Node, out: str, refs: list[str]) -> list[tuple[str, Any]]:
    return [("begin", e.ints(out, "begin", n.attrs["begin"])), ("size", e.ints(out, "size", n.attrs["size"])),
            ("x", refs[0])]


def _grad_slice_by_size(ctx: GradContext, n: Node, dy: Node) -> Grads:
    """dy placed back into zeros of the input's shape: one zero pad per cut axis (channels or sequence)."""
    full = n.inputs[0].shape
    for axis, (b, size, extent) in enumerate(zip(n.attrs["begin"], n.attrs["size"], full, strict=True)):
        if size != extent:
            if len(full) != 4 or axis not in (1, 3):
                raise ctx.fail(f"a slice along axis {axis} of {list(full)}: only the channel (1) and sequence (3) "
                               "axes of [1, C, 1, S] can be padded back",
                               "slice [1, C, 1, S] tensors along axis 1 or 3")
            dy = ctx.g.pad(dy, axis, b, extent - b - size)
    return [dy]


define(OpDef("slice_by_size", (X,), _infer_slice_by_size,
             lambda xs, a: xs[0][tuple(slice(b, b + s) for b, s in zip(a["begin"], a["size"]))],
             attrs=(Attr("begin", _ints), Attr("size", _ints)), emit=_emit_slice_by_size, grad=_grad_slice_by_size,
             mil=MilOp("slice_by_size", ("begin", "size", "x")), doc="the block of size at begin"))


# -- high-level ---------------------------------------------------------------------------------------
def _infer_slice(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    shape = list(xs[0].shape)
    axis = axis_of(name, op, attrs["axis"], len(shape))
    start, stop = attrs["start"], attrs["stop"]
    if not 0 <= start < stop <= shape[axis]:
        raise fail(name, op, f"slice [{start}:{stop}] of an axis of size {shape[axis]}",
                   "use 0 <= start < stop <= size (no negative indices)")
    shape[axis] = stop - start
    return tuple(shape), xs[0].dtype


def _legalize_slice(L: Legalizer, n: Node) -> Node:
    x = L.get(n.inputs[0])
    axis = n.attrs["axis"] % len(x.shape)
    begin = [0] * len(x.shape)
    begin[axis] = n.attrs["start"]
    return L.op("slice_by_size", [x], {"begin": begin, "size": list(n.shape)})


def _grad_slice(ctx: GradContext, n: Node, dy: Node) -> Grads:
    full, axis = n.inputs[0].shape, n.attrs["axis"] % len(n.inputs[0].shape)
    if len(full) != 4 or axis not in (1, 3):
        raise ctx.fail(f"a slice along axis {axis} of {list(full)}: only the channel (1) and sequence (3) axes of "
                       "[1, C, 1, S] can be padded back", "slice [1, C, 1, S] tensors along axis 1 or 3")
    return [ctx.g.pad(dy, axis, n.attrs["start"], full[axis] - n.attrs["stop"])]


def _slice_reference(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    return np.take(xs[0], range(attrs["start"], attrs["stop"]), axis=attrs["axis"])


define(OpDef("slice", (X,), _infer_slice, _slice_reference,
             attrs=(Attr("axis", int), Attr("start", int), Attr("stop", int)), legalize=_legalize_slice,
             grad=_grad_slice,
             mil=MilOp("slice_by_index", ("begin", "end", "x"), ("begin_mask", "end_mask", "squeeze_mask", "stride"),
                       status=BANNED, constraint="ANE-29"),
             doc="x[..., start:stop, ...] along axis"))


def _place(L: Legalizer, x: Node, axis: int, before: int, after: int, part: str | None) -> Node:
    """``x`` [1, C, 1, S] with ``before`` and ``after`` zeros along axis 1 or 3: reshaped to [1, 1, C, S] and
    padded by a 1x1 conv of weight 1 with conv's own zero padding (on H for the channels, on W for the
    sequence), then reshaped back. Each output is its own input times 1 or a padding zero, so NaN and inf
    stay where they are (a 0/1 placement matrix would spread them: NaN * 0 = NaN)."""
    _, c, _, s = x.shape
    pad = [before, after, 0, 0] if axis == 1 else [0, 0, before, after]
    rows = L.op("reshape", [x], {"shape": [1, 1, c, s]}, part=f"{part or 'out'}_rows")
    one = L.const(f"{part or 'out'}_weight", np.ones((1, 1, 1, 1)))
    padded = L.op("conv", [rows, one], {"pad": pad}, part=f"{part or 'out'}_pad")
    return L.op("reshape", [padded], {"shape": [1, c + before + after if axis == 1 else c, 1,
                                                s + before + after if axis == 3 else s]}, part=part)


def _infer_pad(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    shape = list(xs[0].shape)
    axis = axis_of(name, op, attrs["axis"], len(shape))
    if len(shape) != 4 or axis not in (1, 3):
        raise fail(name, op, f"padding axis {attrs['axis']} of {list(xs[0].shape)}",
                   "pad a [1, C, 1, S] tensor along the channel axis 1 or the sequence axis 3")
    if attrs["before"] < 0 or attrs["after"] < 0:
        raise fail(name, op, "negative padding", "use g.slice to drop elements")
    shape[axis] += attrs["before"] + attrs["after"]
    return tuple(shape), xs[0].dtype


def _legalize_pad(L: Legalizer, n: Node) -> Node:
    return _place(L, L.get(n.inputs[0]), n.attrs["axis"] % 4, n.attrs["before"], n.attrs["after"], None)


def _pad_reference(xs: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    widths = [(0, 0)] * xs[0].ndim
    widths[attrs["axis"]] = (attrs["before"], attrs["after"])
    return np.pad(xs[0], widths)


define(OpDef("pad", (X,), _infer_pad, _pad_reference,
             attrs=(Attr("axis", int), Attr("before", int), Attr("after", int)), legalize=_legalize_pad,
             grad=lambda ctx, n, dy: [ctx.g.slice(dy, n.attrs["axis"], n.attrs["before"],
                                                  n.attrs["before"] + n.inputs[0].shape[n.attrs["axis"]])],
             doc="zero padding along the channel (1) or sequence (3) axis"))


def _infer_concat(name: str, op: str, xs: list[Node], attrs: dict[str, Any]) -> tuple[Shape, str]:
    ref = list(xs[0].shape)
    axis = axis_of(name, op, attrs["axis"], len(ref))
    for x in xs[1:]:
        other = list(x.shape)
        if len(other) != len(ref) or other[:axis] + other[axis + 1:] != ref[:axis] + ref[axis + 1:]:
            raise fail(name, op, f"shapes {[list(x.shape) for x in xs]} differ off the concat axis {axis}",
                       "make all shapes equal except along the concat axis")
    if len(ref) != 4 or axis not in (1, 3):
        raise fail(name, op, f"concat along axis {attrs['axis']} of rank-{len(ref)} tensors",
                   "concatenate [1, C, 1, S] tensors along the channel axis 1 or the sequence axis 3")
    ref[axis] = sum(x.shape[axis] for x in xs)
    return tuple(ref), same_dtype(name, op, xs)


def _legalize_concat(L: Legalizer, n: Node) -> Node:
    axis, offset = n.attrs["axis"] % 4, 0
    acc = None
    for i, src in enumerate(n.inputs):
        last = i == len(n.inputs) - 1
        size = src.shape[axis]
        placed = _place(L, L.get(src), axis, offset, n.shape[axis] - offset - size, f"part{i}")
        offset += size
        acc = placed if acc is None else L.op("add", [acc, placed], part=None if last else f"sum{i}")
    return acc if len(n.inputs) > 1 else L.op("identity", [acc])


def _grad_concat(ctx: GradContext, n: Node, dy: Node) -> Grads:
    bounds = np.cumsum([0, *(x.shape[n.attrs["axis"]] for x in n.inputs)])
    return [ctx.g.slice(dy, n.attrs["axis"], int(a), int(b)) if ctx.needs(i) else None
            for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))]


define(OpDef("concat", (Operand("values", variadic=True),), _infer_concat,
             lambda xs, a: np.concatenate(xs, axis=a["axis"]), attrs=(Attr("axis", int),), legalize=_legalize_concat,
             grad=_grad_concat,
             mil=MilOp("concat", ("axis", "values"), ("interleave",), status=BANNED, constraint="ANE-01"),
             doc="concatenation along the channel (1) or sequence (3) axis"))
