"""Uniform I/O padding (ANE-12, -13, -14, -21): every input surface gets one size, every output surface
one size, each >= 49,152 bytes and with enough lanes, by padding the last (sequence) axis.

Inputs are declared padded and sliced back (``slice_by_size``) right after their fp16 cast; outputs are
padded by a matmul with a const 0/1 placement matrix before their final cast. The padded shapes are
recorded in the I/O layout so callers pass and get unpadded arrays.
"""

from __future__ import annotations

import math

import numpy as np

from orion.constraints import violation
from orion.graph.builder import Graph
from orion.graph.ir import GraphError, dtype_size
from orion.lowering.io import IOSpec
from orion.passes.base import PassContext

NAME = "uniform I/O padding"
MIN_SURFACE_BYTES = 49_152
MIN_LANES = {"fp16": 32, "fp32": 16}
MAX_OVERSHOOT = 4  # give up when uniform sizes would need more than 4x the largest surface


def plan(shapes: list[tuple[int, ...]], dtype: str, what: str,
         min_bytes: int = MIN_SURFACE_BYTES) -> list[tuple[int, ...]]:
    """Padded ``[1, C, 1, S']`` shapes: one byte size for all, >= the minimum surface and lane count.
    ``min_bytes`` is the conservative 49,152 unless a probe report proved less (orion.probes)."""
    elem = dtype_size(dtype)
    lanes = [max(s[3], MIN_LANES[dtype], math.ceil(min_bytes / (s[1] * elem))) for s in shapes]
    largest = max(s[1] * n * elem for s, n in zip(shapes, lanes))
    step = math.lcm(*(s[1] * elem for s in shapes))
    size = math.ceil(largest / step) * step
    if size > MAX_OVERSHOOT * largest:
        raise violation("ANE-13", what, f"channel counts {[s[1] for s in shapes]} need {size} bytes per surface to be "
                        f"uniform ({largest} needed otherwise)",
                        "give the I/O tensors channel counts with a small common multiple, or split the program")
    return [(1, s[1], 1, size // (s[1] * elem)) for s in shapes]


def _pad_inputs(graph: Graph, specs: list[IOSpec], min_bytes: int = MIN_SURFACE_BYTES) -> list[str]:
    changes = []
    for spec, padded in zip(specs, plan([s.shape for s in specs], specs[0].dtype, "inputs", min_bytes)):
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


def _pad_outputs(graph: Graph, specs: list[IOSpec], min_bytes: int = MIN_SURFACE_BYTES) -> list[str]:
    changes = []
    for spec, padded in zip(specs, plan([s.shape for s in specs], specs[0].dtype, "outputs", min_bytes)):
        spec.padded = padded
        out = graph.outputs[spec.mil_name]
        if out.shape == padded:
            continue
        src = out.inputs[0] if out.op == "cast" and out.inputs[0].dtype == "fp16" else out
        s, sp = spec.shape[3], padded[3]
        place = np.zeros((1, 1, s, sp))
        place[0, 0, np.arange(s), np.arange(s)] = 1.0
        p = graph.add_node("const", [], name=f"{spec.mil_name}_pad_y", value=place, shape=place.shape,
                           dtype=src.dtype, origin="io padding")
        pad = graph.add_node("matmul", [src, p], {"transpose_x": False, "transpose_y": False},
                             name=f"{spec.mil_name}_pad", origin="io padding")
        if src is out:
            graph.outputs[spec.mil_name] = pad
        else:
            out.inputs = [pad]
            out.shape = padded
            graph.nodes.remove(out)
            graph.nodes.append(out)
        changes.append(f"output {spec.mil_name}: {list(spec.shape)} -> {list(padded)}")
    return changes


def run(graph: Graph, ctx: PassContext) -> list[str]:
    if not ctx.layout.inputs or not ctx.layout.outputs:
        raise GraphError(f"graph '{graph.name}': a program needs at least one input and one output. "
                         "Fix: add the missing g.input(...) or g.output(...)")
    return (_pad_inputs(graph, ctx.layout.inputs, ctx.min_surface_bytes)
            + _pad_outputs(graph, ctx.layout.outputs, ctx.min_surface_bytes))
