"""A stage: one compiled program with its surfaces, addressed by the graph's own I/O names."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from orion.compiler import CompiledGraph
from orion.legalize.io import IOSpec
from orion.limits import MIN_SURFACE_BYTES
from orion.runtime.dtypes import numpy_dtype
from orion.runtime.packing import packed_view
from orion.runtime.program import BoundProgram, Program
from orion.runtime.surface import Surface


class Stage:
    """A compiled graph bound once to its surfaces; ``run()`` evaluates it on them. The surfaces follow the
    graph's I/O layout and the program is bound to them at the first run: a stage of a program still compiling
    (``CompilingGraph``) is made and written at once, and its first run waits for the compile.

    ``input(name)`` and ``output(name)`` are views in the graph's (unpadded) shapes, made once: of the
    tensor's own surface, of the packed surface holding it (ANE-37, ``orion.passes.io_packing``), or of
    the shared surface given for it.
    Not thread-safe: a stage's surfaces belong to one caller at a time.
    """

    def __init__(self, compiled: CompiledGraph, shared: Mapping[str, Surface] | None = None,
                 output_surfaces: Mapping[str, Surface] | None = None) -> None:
        """``shared`` gives surfaces owned elsewhere (a KV cache, a residual-stream chain) by input
        name, or ``"out:<name>"`` for an output, each holding its tensor packed at the front; the stage
        allocates the others. A shared tensor with a surface of its own is bound as it is (zero-copy);
        one the program packed with others is copied into the packed surface before each run (an
        output: out of it after). ``output_surfaces`` gives output surfaces by MIL surface name (a packed
        one too), bound as they are: stages run in turn may share them when each one's outputs are read
        before the next runs."""
        self.compiled = compiled
        layout = compiled.layout
        self.mil_name = {s.name: s.mil_name for s in layout.inputs}
        shared = dict(shared or {})
        given_in = {n: s for n, s in shared.items() if not n.startswith("out:")}
        given_out = {n[4:]: s for n, s in shared.items() if n.startswith("out:")}
        self.inputs = _fill(layout.inputs, compiled.surfaces("inputs"), given_in)
        self.outputs = _fill(layout.outputs, compiled.surfaces("outputs"), given_out, output_surfaces or {})
        copy_in = {s.name: (packed_view(given_in[s.name].array, s.shape), _view(self.inputs, s))
                   for s in layout.inputs if s.surface and s.name in given_in}
        copy_out = {s.name: (_view(self.outputs, s), packed_view(given_out[s.name].array, s.shape))
                    for s in layout.outputs if s.surface and s.name in given_out}
        # the caller's views: of the surface holding the caller's data (a shared one where given)
        self._inputs = {s.name: _view(self.inputs, s) for s in layout.inputs}
        self._inputs.update({name: source for name, (source, _) in copy_in.items()})
        self._outputs = {s.name: _view(self.outputs, s) for s in layout.outputs}
        self._outputs.update({name: target for name, (_, target) in copy_out.items()})
        self._copies = (list(copy_in.values()), list(copy_out.values()))
        self._binding: tuple[BoundProgram, dict[str, str]] | None = None

    @property
    def program(self) -> Program:
        """The compiled program (a stage of a program still compiling, ``CompilingGraph``, waits for it here)."""
        return self.compiled.program

    @property
    def _bound(self) -> BoundProgram:
        return self._bind()[0]

    def _bind(self) -> tuple[BoundProgram, dict[str, str]]:
        """The program bound to the surfaces, and the hint name of each input: made on first use, so a stage is
        bound (and written) before its program has compiled."""
        if self._binding is None:
            layout, parts = self.compiled.layout, self.program.input_parts
            self._binding = (self.program.bind(self.inputs, self.outputs, *self._copies),
                             {s.name: _cut_name(s, parts) for s in layout.inputs})
        return self._binding

    def input(self, name: str) -> np.ndarray:
        """A writable view of input ``name`` in the graph's shape."""
        return self._inputs[name]

    def output(self, name: str) -> np.ndarray:
        """A view of output ``name`` in the graph's shape (padded surfaces hold it packed at the front)."""
        return self._outputs[name]

    def run(self, live_lanes: Mapping[str, int] | None = None) -> None:
        """Evaluates the program once; ``live_lanes`` by graph input name (see ``Program.evaluate``). A hint
        names the tensor of the graph's shape the program cuts from its surface (``Program.input_parts``:
        of a packed surface, ANE-37, or a padded one, ANE-12/-14), so it reaches the emulator either way.
        A shared surface given for a packed tensor is copied in whole."""
        self._bound(self._hints(live_lanes))

    def _hints(self, live_lanes: Mapping[str, int] | None) -> dict[str, int] | None:
        return {self._bind()[1][n]: v for n, v in live_lanes.items()} if live_lanes else None


def run_in_turn(runs: Iterable[tuple[Stage, Mapping[str, int] | None]]) -> None:
    """``stage.run(live_lanes)`` for each of ``runs`` in order, in one native call (``BoundProgram.in_turn``)."""
    BoundProgram.in_turn([(stage._bound, stage._hints(live)) for stage, live in runs])


def _cut_name(spec: IOSpec, parts: Mapping[str, tuple[str, int, tuple[int, ...]]]) -> str:
    """The MIL name a live-lanes hint on ``spec``'s tensor takes: the value of its shape cut from its place in
    its surface (the input itself when the program cuts nothing from it)."""
    source = spec.surface or spec.mil_name
    cuts = [name for name, (surface, offset, shape) in parts.items()
            if surface == source and offset == spec.offset and shape == tuple(spec.shape)]
    return spec.mil_name if spec.mil_name in cuts or not cuts else cuts[0]


def _view(surfaces: Mapping[str, Surface], spec: IOSpec) -> np.ndarray:
    return packed_view(surfaces[spec.surface_name].array, spec.shape, spec.offset)


def _fill(specs: list[IOSpec], surfaces: Mapping[str, tuple[tuple[int, ...], str]], given: Mapping[str, Surface],
          by_surface: Mapping[str, Surface] | None = None) -> dict[str, Surface]:
    """By MIL surface name (``surfaces``: the program's inputs or outputs, ``CompiledGraph.surfaces``): given
    surfaces where a tensor has its own, ``by_surface``'s by MIL surface name, new ones elsewhere, all of one
    size (ANE-13)."""
    own = {s.surface_name: given[s.name] for s in specs if not s.surface and s.name in given}
    own |= by_surface or {}
    size = max([MIN_SURFACE_BYTES] + [int(np.prod(shape)) * numpy_dtype(dtype).itemsize
                                      for shape, dtype in surfaces.values()] + [s.nbytes for s in own.values()])
    return {name: own.get(name) or Surface(shape, dtype, size) for name, (shape, dtype) in surfaces.items()}
