"""I/O preparation: surface dtype casts and names whose alphabetical order is the natural order (ANE-20)."""

from __future__ import annotations

from dataclasses import dataclass, field

from orion.graph.builder import Graph
from orion.graph.ir import GraphError

IO_DTYPES = ("fp16", "fp32")


@dataclass
class IOSpec:
    """One program input or output: the graph's name, the MIL name, the shape the caller sees and the
    (possibly padded) shape of the surface, which holds the data packed at its front, or, when the I/O
    packing put several tensors in one surface (ANE-37), packed from element ``offset`` of the surface
    named ``surface``."""

    name: str
    mil_name: str
    shape: tuple[int, ...]
    padded: tuple[int, ...]
    dtype: str
    surface: str = ""  # the MIL name of the packed surface holding it; "" = its own surface, ``mil_name``
    offset: int = 0  # elements before its data in that surface

    @property
    def surface_name(self) -> str:
        """The MIL name of the surface this tensor is bound through."""
        return self.surface or self.mil_name


@dataclass
class IOLayout:
    """Every I/O of a program, in natural (= alphabetical MIL name) order."""

    dtype: str
    inputs: list[IOSpec] = field(default_factory=list)
    outputs: list[IOSpec] = field(default_factory=list)

    @staticmethod
    def surfaces(specs: list[IOSpec]) -> dict[str, tuple[tuple[int, ...], str]]:
        """The surfaces ``specs`` (``inputs`` or ``outputs``) are bound through: MIL name -> (shape, dtype)."""
        return {s.surface_name: (s.padded, s.dtype) for s in specs}


def io_names(prefix: str, names: list[str]) -> list[str]:
    """``in_00_x``, ``in_01_mask``, ...: zero-padded indices so sorting keeps the declaration order."""
    width = max(2, len(str(len(names) - 1)))
    return [f"{prefix}_{i:0{width}d}_{n}" for i, n in enumerate(names)]


def prepare_io(graph: Graph, io_dtype: str) -> IOLayout:
    """Rename inputs/outputs of a legalized graph in place and add the casts ``io_dtype`` needs."""
    if io_dtype not in IO_DTYPES:
        raise GraphError(f"graph '{graph.name}': io_dtype {io_dtype!r}. Fix: use 'fp16' or 'fp32'")
    layout = IOLayout(io_dtype)
    for node, mil_name in zip(list(graph.inputs), io_names("in", [n.name for n in graph.inputs])):
        layout.inputs.append(IOSpec(node.name, mil_name, node.shape, node.shape, io_dtype))
        graph.rename(node, mil_name)
        if node.dtype != io_dtype:
            node.dtype = io_dtype
            cast = graph.add_node("cast", [node], {"dtype": "fp16"}, name=f"{mil_name}_fp16")
            graph.move_after(cast, node)
            graph.replace_uses(node, cast, skip=cast)
    outputs = list(graph.outputs.items())
    graph.outputs = {}
    for (name, node), mil_name in zip(outputs, io_names("out", [n for n, _ in outputs])):
        graph.reserve(mil_name)  # the returned variable gets this name when the MIL is built
        if node.dtype != io_dtype:
            node = graph.add_node("cast", [node], {"dtype": io_dtype}, name=f"{mil_name}_{io_dtype}")
        layout.outputs.append(IOSpec(name, mil_name, node.shape, node.shape, io_dtype))
        graph.outputs[mil_name] = node
    return layout
