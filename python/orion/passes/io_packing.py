"""I/O packing (ANE-37), run once after the optimizations and before the I/O padding: like padding, the
program's ABI, not an optimization.

maderix/ANE reports that requests with several input surfaces fail (``0x1d``) and packs every input
into one; mechramc/Orion ran at most 6 outputs. Until a probe report proves more on the machine
(``PassContext.surface_counts``), a program binds at most that many surfaces:

- **Inputs**, when there are more than allowed, are all laid out in one surface ``in_packed`` of shape
  ``[1, R, 1, W]``: each tensor packed (``c*S + s``, ANE-21) from the start of its own run of rows, so in
  memory each is one contiguous range. Inside the program a ``slice_by_size`` of its rows and a
  ``reshape`` cut it back (a tail that does not fill its last row is cut by a second slice). ``W`` is
  the tensors' common lane count when they share one, else a divisor of every size up to
  :data:`orion.limits.MAX_IO_LANES`.
- **Outputs**, when there are more than allowed, are grouped by element count; each group of two or
  more becomes one surface ``out_packed_<k>`` of ``[1, K*r, 1, W]`` (``r*W`` the group's count), output
  ``i`` in rows ``i*r ..``: ``sum_i mul(reshape(o_i, [1, 1, r, W]), e_i)`` with ``e_i`` the one-hot
  ``[1, K, 1, 1]`` const of row ``i``, then a ``reshape``. ``concat`` is banned (ANE-01) and a
  placement conv costs ``K*r`` times the data; this costs ``K`` multiply-adds per element, and
  broadcasting a ``[.., 1, ..]`` operand is the form the I/O padding already widens outputs with.
  Exact in fp16 (``x*1 + 0 = x``), except that ``-0`` reads back ``+0`` and a non-finite value in one
  output makes its group's other rows NaN (a step with a non-finite gradient is skipped anyway).
  Groups left over the count raise ANE-37: the partitioner then splits the program.

Every tensor's place is in its :class:`~orion.legalize.io.IOSpec` (``surface``, ``offset``): callers
see views of the packed surfaces (``orion.runtime.packing.packed_view``), nothing is copied.
"""

from __future__ import annotations

import math

import numpy as np

from orion.constraints import violation
from orion.graph.builder import Graph
from orion.graph.ir import GraphError, Node, dtype_size
from orion.legalize.io import IOSpec
from orion.limits import MAX_IO_LANES, MIN_LANES
from orion.passes.base import PassContext

NAME = "I/O packing"
PACKED_INPUT = "in_packed"
PACKED_OUTPUT = "out_packed"


def row_width(sizes: list[int], lasts: list[int], lanes: int) -> int:
    """The lane count ``W`` of a packed surface holding tensors of ``sizes`` elements (last dimensions
    ``lasts``): their common last dimension when they share one of at least ``lanes`` (each tensor is
    then whole rows, cut by a slice alone), else the largest divisor of every size between ``lanes``
    and :data:`MAX_IO_LANES`, else the widest last dimension rounded up to ``lanes`` (tails padded)."""
    if len(set(lasts)) == 1 and lanes <= lasts[0] <= MAX_IO_LANES:
        return lasts[0]
    common = math.gcd(*sizes)
    best = max((d for d in range(lanes, min(common, MAX_IO_LANES) + 1) if common % d == 0), default=0)
    return best or min(MAX_IO_LANES, -(-max(lasts) // lanes) * lanes)


def _front(graph: Graph, node: Node, after: Node | None) -> Node:
    """Move ``node`` to the front of the graph (after ``after`` when given)."""
    graph.nodes.remove(node)
    graph.nodes.insert(0 if after is None else graph.nodes.index(after) + 1, node)
    return node


def _pack_inputs(graph: Graph, specs: list[IOSpec], min_bytes: int) -> list[str]:
    dtype = specs[0].dtype
    sizes = [int(np.prod(s.shape)) for s in specs]
    width = row_width(sizes, [s.shape[3] for s in specs], MIN_LANES[dtype])
    starts = np.cumsum([0] + [-(-n // width) for n in sizes])
    rows = max(int(starts[-1]), -(-min_bytes // (width * dtype_size(dtype))))
    shape = (1, rows, 1, width)
    packed = graph.add_node("input", [], name=PACKED_INPUT, shape=shape, dtype=dtype, origin="io packing")
    graph.rename(packed, PACKED_INPUT)
    last = [_front(graph, packed, None)]  # the node the next cut goes after: tensors are cut in order

    def step(op: str, src: Node, attrs: dict, part: str) -> Node:
        node = graph.add_node(op, [src], attrs, name=f"{spec.mil_name}_{part}", origin="io packing")
        last.append(_front(graph, node, last[-1]))
        return node

    changes = []
    for spec, n, row in zip(specs, sizes, starts[:-1], strict=False):
        old = next(i for i in graph.inputs if i.name == spec.mil_name)
        count = -(-n // width)
        value = step("slice_by_size", packed, {"begin": [0, int(row), 0, 0], "size": [1, count, 1, width]}, "rows")
        if count * width != n:
            value = step("reshape", value, {"shape": [1, 1, 1, count * width]}, "flat")
            value = step("slice_by_size", value, {"begin": [0, 0, 0, 0], "size": [1, 1, 1, n]}, "cut")
        if value.shape != spec.shape:
            value = step("reshape", value, {"shape": list(spec.shape)}, "unpack")
        graph.replace_uses(old, value)
        graph.remove(old)
        graph.rename(value, graph.unique_name(spec.mil_name))
        spec.surface, spec.offset, spec.padded = PACKED_INPUT, int(row) * width, shape
        changes.append(f"input {spec.mil_name} {list(spec.shape)}: rows {int(row)}..{int(row) + count} of {list(shape)}")
    return changes


def _pack_outputs(graph: Graph, specs: list[IOSpec], min_bytes: int, allowed: int) -> list[str]:
    groups: dict[int, list[IOSpec]] = {}
    for spec in specs:
        groups.setdefault(int(np.prod(spec.shape)), []).append(spec)
    if len(groups) > allowed:
        raise violation("ANE-37", graph.name, f"{len(specs)} outputs of {len(groups)} different sizes cannot be "
                        f"packed into the {allowed} output surfaces allowed (outputs of one size share a surface)",
                        "split the program's outputs over several programs (the partitioner does), or pass the "
                        "surface_counts a probe report proved")
    changes = []
    for k, (n, members) in enumerate(g for g in groups.items() if len(g[1]) > 1):
        dtype = members[0].dtype
        width = row_width([n], [n], MIN_LANES[dtype])
        if n % width or width < MIN_LANES[dtype]:
            raise GraphError(f"graph '{graph.name}': outputs {[s.name for s in members]} of {n} elements cannot be "
                             f"laid out in rows of at least {MIN_LANES[dtype]} lanes. Fix: give them a size that is a "
                             "multiple of 32")
        r = n // width
        rows = max(len(members), -(-min_bytes // (n * dtype_size(dtype))))
        name = f"{PACKED_OUTPUT}_{k}"
        graph.reserve(name)
        total = None
        for i, spec in enumerate(members):
            out = graph.outputs.pop(spec.mil_name)
            src = out.inputs[0] if out.op == "cast" and out.inputs[0].dtype == "fp16" else out
            if src is not out and not any(out in node.inputs for node in graph.nodes) and out not in graph.outputs.values():
                graph.remove(out)  # the I/O cast: the packed surface is cast once instead
            block = graph.add_node("reshape", [src], {"shape": [1, 1, r, width]}, name=f"{name}_{i}_block",
                                   origin="io packing")
            onehot = np.zeros((1, rows, 1, 1))
            onehot[0, i] = 1.0
            row = graph.add_node("const", [], name=f"{name}_{i}_row", value=onehot, shape=onehot.shape,
                                 dtype=src.dtype, origin="io packing")
            placed = graph.add_node("mul", [block, row], name=f"{name}_{i}_placed", origin="io packing")
            total = placed if total is None else graph.add_node("add", [total, placed], name=f"{name}_{i}_sum",
                                                                origin="io packing")
            spec.surface, spec.offset, spec.padded = name, i * n, (1, rows * r, 1, width)
        result = graph.add_node("reshape", [total], {"shape": [1, rows * r, 1, width]}, name=f"{name}_rows",
                                origin="io packing")
        if result.dtype != dtype:
            result = graph.add_node("cast", [result], {"dtype": dtype}, name=f"{name}_{dtype}", origin="io packing")
        graph.outputs[name] = result

        changes.append(f"outputs {[s.mil_name for s in members]} ({n} elements each) -> {name} "
                       f"{[1, rows * r, 1, width]}")
    return changes


def run(graph: Graph, ctx: PassContext) -> list[str]:
    max_inputs, max_outputs = ctx.surface_counts
    changes = []
    if len(ctx.layout.inputs) > max_inputs:
        changes += _pack_inputs(graph, ctx.layout.inputs, ctx.min_surface_bytes)
    if len(ctx.layout.outputs) > max_outputs:
        changes += _pack_outputs(graph, ctx.layout.outputs, ctx.min_surface_bytes, max_outputs)
    return changes
