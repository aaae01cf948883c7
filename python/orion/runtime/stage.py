"""A stage: one compiled program with its surfaces, addressed by the graph's own I/O names."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from orion.compiler import CompiledGraph
from orion.limits import MIN_SURFACE_BYTES
from orion.runtime.dtypes import mil_dtype
from orion.runtime.packing import packed_view
from orion.runtime.program import TensorSpec
from orion.runtime.surface import Surface


class Stage:
    """A compiled graph bound once to its surfaces; ``run()`` evaluates it on them.

    ``input(name)`` and ``output(name)`` are views in the graph's (unpadded) shapes, made once.
    Not thread-safe: a stage's surfaces belong to one caller at a time.
    """

    def __init__(self, compiled: CompiledGraph, shared: Mapping[str, Surface] | None = None) -> None:
        """``shared`` gives surfaces owned elsewhere (a KV cache, a residual-stream chain) by input
        name, or ``"out:<name>"`` for an output; the stage allocates the others."""
        self.compiled = compiled
        self.program = compiled.program
        self.mil_name = {s.name: s.mil_name for s in compiled.layout.inputs}
        mil_out = {s.name: s.mil_name for s in compiled.layout.outputs}
        shared = dict(shared or {})
        self.inputs = _fill(self.mil_name, self.program.inputs,
                            {n: s for n, s in shared.items() if not n.startswith("out:")})
        self.outputs = _fill(mil_out, self.program.outputs,
                             {n[4:]: s for n, s in shared.items() if n.startswith("out:")})
        self._inputs = {s.name: packed_view(self.inputs[s.name].array, s.shape) for s in compiled.layout.inputs}
        self._outputs = {s.name: packed_view(self.outputs[s.name].array, s.shape) for s in compiled.layout.outputs}
        self._bound = self.program.bind({self.mil_name[n]: s for n, s in self.inputs.items()},
                                        {mil_out[n]: s for n, s in self.outputs.items()})

    def input(self, name: str) -> np.ndarray:
        """A writable view of input ``name`` in the graph's shape."""
        return self._inputs[name]

    def output(self, name: str) -> np.ndarray:
        """A view of output ``name`` in the graph's shape (padded surfaces hold it packed at the front)."""
        return self._outputs[name]

    def run(self, live_lanes: Mapping[str, int] | None = None) -> None:
        """Evaluates the program once; ``live_lanes`` by graph input name (see ``Program.evaluate``)."""
        self._bound({self.mil_name[n]: v for n, v in live_lanes.items()} if live_lanes else None)


def _fill(mil_names: Mapping[str, str], specs: Mapping[str, TensorSpec],
          given: Mapping[str, Surface]) -> dict[str, Surface]:
    """Given surfaces where there are, new ones elsewhere, all of one size (ANE-13)."""
    size = max([MIN_SURFACE_BYTES] + [int(np.prod(s.shape)) * s.dtype.itemsize for s in specs.values()]
               + [s.nbytes for s in given.values()])
    return {name: given.get(name) or Surface(specs[m].shape, mil_dtype(specs[m].dtype), size)
            for name, m in mil_names.items()}
