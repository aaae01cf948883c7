"""I/O padding (ANE-12, -14, -21): every I/O tensor gets at least 49,152 bytes and 32 lanes (16 for
fp32 I/O), by padding its last (sequence) axis.

Inputs are declared padded and sliced back (``slice_by_size``) right after their fp16 cast. Outputs
are widened by repeating each lane k times: ``[1, C, 1, S] -> reshape [1, C, S, 1] -> + zeros
[1, 1, 1, k] -> reshape [1, C, 1, S*k]`` (a plain broadcast add when S = 1), which costs one
elementwise op instead of a placement matmul; the caller reads every k-th lane. The padded shapes
and the repeat factor are recorded in the I/O layout so callers pass and get unpadded arrays.

One surface size for all inputs and one for all outputs (ANE-13) is a property of the surface
allocations, not of the tensor shapes: ``orion.Program.allocate_surfaces`` pads them (FACTS section 3:
the ANE reads the declared shape packed from offset 0 of a larger surface).
"""

from __future__ import annotations

import math

import numpy as np

from orion.graph.builder import Graph
from orion.graph.ir import GraphError, dtype_size
from orion.lowering.io import IOSpec
from orion.passes.base import PassContext

NAME = "I/O padding"
MIN_SURFACE_BYTES = 49_152
MIN_LANES = {"fp16": 32, "fp32": 16}


def padded_lanes(shape: tuple[int, ...], dtype: str) -> int:
    """The lane count a ``[1, C, 1, S]`` I/O tensor needs: >= S, the minimum lanes and the minimum size."""
    return max(shape[3], MIN_LANES[dtype], math.ceil(MIN_SURFACE_BYTES / (shape[1] * dtype_size(dtype))))


def _pad_inputs(graph: Graph, specs: list[IOSpec]) -> list[str]:
    changes = []
    for spec in specs:
        padded = (1, spec.shape[1], 1, padded_lanes(spec.shape, spec.dtype))
        spec.padded = padded
        node = next(n for n in graph.inputs if n.name == spec.mil_name)
        if node.shape == padded:
            continue
        users = [n for n in graph.nodes if node in n.inputs]
        anchor = users[0] if len(users) == 1 and users[0].op == "cast" else node
        node.shape = anchor.shape = padded
        cut = graph.add_node("slice_by_size", [anchor], {"begin": [0, 0, 0, 0], "size": list(spec.shape)},
                             name=f"{spec.mil_name}_unpad", origin="io padding")
        graph.move_after(cut, anchor)
        graph.replace_uses(anchor, cut, skip=cut)
        changes.append(f"input {spec.mil_name}: {list(spec.shape)} -> {list(padded)}")
    return changes


def _pad_outputs(graph: Graph, specs: list[IOSpec]) -> list[str]:
    changes = []
    for spec in specs:
        out = graph.outputs[spec.mil_name]
        _, c, _, s = spec.shape
        repeat = math.ceil(padded_lanes(spec.shape, spec.dtype) / s)
        spec.padded, spec.repeat = (1, c, 1, s * repeat), repeat
        if out.shape == spec.padded:  # already padded (or large enough)
            continue
        src = out.inputs[0] if out.op == "cast" and out.inputs[0].dtype == "fp16" else out
        name = spec.mil_name
        zeros = graph.add_node("const", [], name=f"{name}_pad_zeros", value=np.zeros((1, 1, 1, repeat)),
                               shape=(1, 1, 1, repeat), dtype=src.dtype, origin="io padding")
        wide = src
        if s > 1:
            wide = graph.add_node("reshape", [src], {"shape": [1, c, s, 1]}, name=f"{name}_pad_rows", origin="io padding")
        wide = graph.add_node("add", [wide, zeros], name=f"{name}_pad_repeat", origin="io padding")
        if s > 1:
            wide = graph.add_node("reshape", [wide], {"shape": list(spec.padded)}, name=f"{name}_pad",
                                  origin="io padding")
        if src is out:
            graph.outputs[name] = wide
        else:
            out.inputs = [wide]
            out.shape = spec.padded
            graph.nodes.remove(out)
            graph.nodes.append(out)
        changes.append(f"output {name}: {list(spec.shape)} -> {list(spec.padded)} (each lane x{repeat})")
    return changes


def run(graph: Graph, ctx: PassContext) -> list[str]:
    if not ctx.layout.inputs or not ctx.layout.outputs:
        raise GraphError(f"graph '{graph.name}': a program needs at least one input and one output. "
                         "Fix: add the missing g.input(...) or g.output(...)")
    return _pad_inputs(graph, ctx.layout.inputs) + _pad_outputs(graph, ctx.layout.outputs)
