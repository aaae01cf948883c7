"""The optimization passes, run to a fixed point: see :func:`run_pipeline`."""

from __future__ import annotations

from orion.graph.builder import Graph
from orion.passes import cast_fusion, dce, identity, io_padding, sram
from orion.passes.base import PassContext, PassFn, PassReport, PipelineReport

# Order matters only for speed: the pipeline repeats until no pass changes anything.
DEFAULT_PASSES: tuple[tuple[str, PassFn], ...] = (
    (identity.NAME, identity.run),
    (cast_fusion.NAME, cast_fusion.run),
    (dce.NAME, dce.run),
    (io_padding.NAME, io_padding.run),
    (sram.NAME, sram.run),
)
MAX_ITERATIONS = 10


def run_pipeline(graph: Graph, ctx: PassContext,
                 passes: tuple[tuple[str, PassFn], ...] = DEFAULT_PASSES) -> PipelineReport:
    """Run ``passes`` in order, repeatedly, until an iteration changes nothing."""
    report = PipelineReport()
    for iteration in range(1, MAX_ITERATIONS + 1):
        changed = False
        for name, fn in passes:
            changes = fn(graph, ctx)
            report.runs.append(PassReport(name, iteration, changes))
            changed = changed or bool(changes)
        report.iterations = iteration
        if not changed:
            report.fixed_point = True
            break
    report.analyses = dict(ctx.analyses)
    return report


__all__ = ["DEFAULT_PASSES", "PassContext", "PassReport", "PipelineReport", "run_pipeline"]
