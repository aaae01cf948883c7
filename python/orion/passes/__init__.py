"""After legalization and I/O: optimize to a fixed point, pack and pad the I/O once, analyze once.

The optimizations (identity elimination, cast fusion, dead-code elimination) repeat until an
iteration changes nothing. I/O packing and padding are not optimizations but the program's ABI
(ANE-37; ANE-12, -14, -21): they run once, on the optimized graph. SRAM budgeting only reports, once, on the final graph.
"""

from __future__ import annotations

from orion.graph.builder import Graph
from orion.passes import cast_fusion, dce, identity, io_packing, io_padding, sram
from orion.passes.base import ONCE, PassContext, PassFn, PassReport, PipelineReport

# Order matters only for speed: the optimizations repeat until none changes anything.
OPTIMIZATIONS: tuple[tuple[str, PassFn], ...] = (
    (identity.NAME, identity.run),
    (cast_fusion.NAME, cast_fusion.run),
    (dce.NAME, dce.run),
)
MAX_ITERATIONS = 10


def optimize(graph: Graph, ctx: PassContext, passes: tuple[tuple[str, PassFn], ...] = OPTIMIZATIONS,
             report: PipelineReport | None = None) -> PipelineReport:
    """Run ``passes`` in order, repeatedly, until an iteration changes nothing."""
    report = report if report is not None else PipelineReport()
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
    return report


def run_pipeline(graph: Graph, ctx: PassContext,
                 passes: tuple[tuple[str, PassFn], ...] = OPTIMIZATIONS) -> PipelineReport:
    """Optimize to a fixed point, then pack and pad the I/O once, then analyze the SRAM budget once."""
    report = optimize(graph, ctx, passes)
    report.runs.append(PassReport(io_packing.NAME, ONCE, io_packing.run(graph, ctx)))
    report.runs.append(PassReport(io_padding.NAME, ONCE, io_padding.run(graph, ctx)))
    report.runs.append(PassReport(sram.NAME, ONCE, sram.run(graph, ctx)))
    report.analyses = dict(ctx.analyses)
    return report


__all__ = ["MAX_ITERATIONS", "ONCE", "OPTIMIZATIONS", "PassContext", "PassReport", "PipelineReport", "optimize",
           "run_pipeline"]
