"""I/O padding (ANE-12, -14, -21), run once after the optimizations: it is the program's ABI, not an
optimization. Every I/O tensor the ANE sees has at least 49,152 bytes and 32
lanes (16 for fp32 I/O).

A ``[1, C, 1, S]`` tensor that is too small is exposed as ``[1, k, 1, C*S]``: its data packed at the
front (element ``(c, s)`` at ``c*S + s``, as the ANE reads and writes surfaces, docs/hardware.md §3)
followed by padding. Inside the program an input is cut back with ``slice_by_size`` and a
``reshape``; an output is flattened by a ``reshape`` and widened by adding a zero const of the
padded shape (broadcasting ``[1, 1, 1, N]`` with ``[1, k, 1, N]``). Callers, and chained programs,
read and write the first ``C*S`` elements either way, so a program's padded output can feed the
next program's padded input unchanged.

One surface size for all inputs and one for all outputs (ANE-13) is a property of the surface
allocations, not of the tensor shapes: ``orion.Program.allocate_surfaces`` pads them.
"""

from __future__ import annotations

import math

import numpy as np

from orion.graph.builder import Graph
from orion.graph.ir import GraphError, dtype_size
from orion.legalize.io import IOSpec
from orion.limits import MIN_LANES, MIN_SURFACE_BYTES
from orion.passes.base import PassContext

NAME = "I/O padding"


def padded_shape(shape: tuple[int, ...], dtype: str, what: str,
                 min_bytes: int = MIN_SURFACE_BYTES) -> tuple[int, ...]:
    """The shape a ``[1, C, 1, S]`` I/O tensor is exposed with: itself when large enough, else
    ``[1, k, 1, C*S]`` with the fewest channels k reaching ``min_bytes`` (the conservative 49,152
    unless a probe report proved less, see ``orion.probes``)."""
    _, c, _, s = shape
    elem, lanes = dtype_size(dtype), MIN_LANES[dtype]
    if s >= lanes and c * s * elem >= min_bytes:
        return tuple(shape)
    if c * s < lanes:
        raise GraphError(f"{what} {list(shape)}: {c * s} elements cannot make the {lanes} lanes the ANE needs "
                         f"for {dtype} I/O. Fix: give it at least {lanes} elements")
    return (1, math.ceil(min_bytes / (c * s * elem)), 1, c * s)


def _pad_inputs(graph: Graph, specs: list[IOSpec], min_bytes: int) -> list[str]:
    changes = []
    for spec in (s for s in specs if not s.surface):  # packed tensors live in a surface the packing sized
        spec.padded = padded_shape(spec.shape, spec.dtype, f"input '{spec.name}'", min_bytes)
        node = next(n for n in graph.inputs if n.name == spec.mil_name)
        if node.shape == spec.padded:
            continue
        users = [n for n in graph.nodes if node in n.inputs]
        anchor = users[0] if len(users) == 1 and users[0].op == "cast" else node
        node.shape = anchor.shape = spec.padded
        flat = spec.padded[3]
        cut = graph.add_node("slice_by_size", [anchor], {"begin": [0, 0, 0, 0], "size": [1, 1, 1, flat]},
                             name=f"{spec.mil_name}_unpad", origin="io padding")
        back = graph.add_node("reshape", [cut], {"shape": list(spec.shape)}, name=f"{spec.mil_name}_unflat",
                              origin="io padding")
        graph.move_after(cut, anchor)
        graph.move_after(back, cut)
        graph.replace_uses(anchor, back, skip=cut)
        changes.append(f"input {spec.mil_name}: {list(spec.shape)} -> {list(spec.padded)}")
    return changes


def _pad_outputs(graph: Graph, specs: list[IOSpec], min_bytes: int) -> list[str]:
    changes = []
    for spec in (s for s in specs if not s.surface):
        spec.padded = padded_shape(spec.shape, spec.dtype, f"output '{spec.name}'", min_bytes)
        out = graph.outputs[spec.mil_name]
        if out.shape == spec.padded:
            continue
        src = out.inputs[0] if out.op == "cast" and out.inputs[0].dtype == "fp16" else out
        name, flat = spec.mil_name, spec.padded[3]
        row = graph.add_node("reshape", [src], {"shape": [1, 1, 1, flat]}, name=f"{name}_flat", origin="io padding")
        zeros = graph.add_node("const", [], name=f"{name}_pad_zeros", value=np.zeros(spec.padded),
                               shape=spec.padded, dtype=src.dtype, origin="io padding")
        wide = graph.add_node("add", [zeros, row], name=f"{name}_pad", origin="io padding")
        if src is out:
            graph.outputs[name] = wide
        else:
            out.inputs = [wide]
            out.shape = spec.padded
            graph.nodes.remove(out)
            graph.nodes.append(out)
        changes.append(f"output {name}: {list(spec.shape)} -> {list(spec.padded)}")
    return changes


def run(graph: Graph, ctx: PassContext) -> list[str]:
    if not ctx.layout.inputs or not ctx.layout.outputs:
        raise GraphError(f"graph '{graph.name}': a program needs at least one input and one output. "
                         "Fix: add the missing g.input(...) or g.output(...)")
    return (_pad_inputs(graph, ctx.layout.inputs, ctx.min_surface_bytes)
            + _pad_outputs(graph, ctx.layout.outputs, ctx.min_surface_bytes))
