"""What every pass shares: the context it runs in and the reports it produces."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orion.graph.builder import Graph
from orion.legalize.io import IOLayout
from orion.limits import MAX_INPUT_SURFACES, MAX_OUTPUT_SURFACES, MIN_SURFACE_BYTES, SRAM_BYTES

ONCE = 0  # the iteration number of a stage that runs once, after the fixed point (padding, analysis)

@dataclass
class PassContext:
    """Compile-wide facts passes read: the I/O layout (updated by packing and padding), the SRAM budget, the
    surface minimum and the surface counts a program may bind."""

    layout: IOLayout
    sram_budget: int = SRAM_BYTES
    min_surface_bytes: int = MIN_SURFACE_BYTES  # lower only where a probe report proved it (orion.probes)
    surface_counts: tuple[int, int] = (MAX_INPUT_SURFACES, MAX_OUTPUT_SURFACES)  # (inputs, outputs), ANE-37
    analyses: dict[str, Any] = field(default_factory=dict)


# A pass rewrites the graph in place and returns one line per change it made (empty: nothing changed).
PassFn = Callable[[Graph, PassContext], list[str]]


@dataclass
class PassReport:
    """What one pass changed in one iteration of the pipeline (``ONCE`` for padding and analysis)."""

    name: str
    iteration: int
    changes: list[str]


@dataclass
class PipelineReport:
    """Every pass run, the number of iterations and whether the pipeline reached a fixed point."""

    runs: list[PassReport] = field(default_factory=list)
    iterations: int = 0
    fixed_point: bool = False
    analyses: dict[str, Any] = field(default_factory=dict)

    def changes(self, name: str) -> list[str]:
        """All changes made by pass ``name`` over every iteration."""
        return [c for r in self.runs if r.name == name for c in r.changes]

    def __str__(self) -> str:
        lines = [f"passes: {self.iterations} iteration(s), fixed point: {self.fixed_point}"]
        for r in self.runs:
            if r.changes:
                when = "once" if r.iteration == ONCE else r.iteration
                lines.append(f"  [{when}] {r.name}: {len(r.changes)} change(s)")
                lines.extend(f"      {c}" for c in r.changes)
        lines.extend(f"  {name}: {value}" for name, value in self.analyses.items())
        return "\n".join(lines)
