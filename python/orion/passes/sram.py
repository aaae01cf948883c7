"""SRAM budgeting (analysis only, run once on the final graph): weights plus peak live activations of the program against ~32 MB.

Over budget the program still compiles but runs ~30% slower (ANE-26): the report says so and a
:class:`SRAMBudgetWarning` suggests how many programs to split it into. It also reports matmuls with a
const operand (ANE-27: a 1x1 conv is ~3x faster) and the per-evaluate dispatch cost (ANE-28).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orion.graph.builder import Graph
from orion.limits import DISPATCH_MS
from orion.passes.base import PassContext
from orion.progress import warn_user

NAME = "SRAM budgeting"


class SRAMBudgetWarning(UserWarning):
    """A program's working set exceeds the ANE's on-chip SRAM."""


@dataclass(frozen=True)
class SRAMReport:
    weight_bytes: int
    peak_activation_bytes: int
    budget: int
    const_matmuls: tuple[str, ...]

    @property
    def total(self) -> int:
        return self.weight_bytes + self.peak_activation_bytes

    @property
    def over_budget(self) -> bool:
        return self.total > self.budget

    @property
    def split_hint(self) -> int:
        """How many programs of equal size would each fit the budget."""
        return max(1, math.ceil(self.total / self.budget))

    def __str__(self) -> str:
        mb = 1024 * 1024
        text = (f"weights {self.weight_bytes / mb:.2f} MB + peak activations {self.peak_activation_bytes / mb:.2f} MB"
                f" = {self.total / mb:.2f} MB of {self.budget / mb:.0f} MB SRAM; dispatch ~{DISPATCH_MS} ms/evaluate")
        if self.over_budget:
            text += f"; OVER BUDGET (ANE-26): split into >= {self.split_hint} programs, e.g. one per layer"
        if self.const_matmuls:
            text += f"; matmul with const operand (ANE-27, use linear): {', '.join(self.const_matmuls)}"
        return text


def analyze(graph: Graph, budget: int) -> SRAMReport:
    """Weight bytes (fp16) and the peak of live activation bytes over the node order."""
    weights = sum(n.nbytes for n in graph.nodes if n.is_const and n.shape)
    end = len(graph.nodes)
    last_use: dict[int, int] = {id(out): end for out in graph.outputs.values()}
    for i, node in enumerate(graph.nodes):
        for src in node.inputs:
            last_use[id(src)] = max(last_use.get(id(src), i), i)
    # The I/O packing's cuts of the packed input stand for the inputs it replaced: each is counted like an
    # input, live from the start to its last use, and the packed input itself is not counted (ANE-37).
    cuts = {id(n) for n in graph.nodes if n.op == "input" and n.origin == "io packing"}
    for node in graph.nodes:
        if node.origin == "io packing" and node.inputs and id(node.inputs[0]) in cuts:
            cuts.add(id(node))
    delta = [0] * (end + 2)
    for i, node in enumerate(graph.nodes):
        if not node.is_const:
            own = 0 if (node.op == "input" and id(node) in cuts) or (node.op == "reshape" and node.origin == "io packing") \
                else node.nbytes  # the packing's reshapes are views
            delta[0 if id(node) in cuts else i] += own
            delta[last_use.get(id(node), i) + 1] -= own
    peak = live = 0
    for d in delta:
        live += d
        peak = max(peak, live)
    # User matmuls keep their own name as origin; placement/padding matmuls the compiler adds do not.
    const_matmuls = tuple(n.name for n in graph.nodes
                          if n.op == "matmul" and n.origin == n.name and any(i.is_const for i in n.inputs))
    return SRAMReport(weights, peak, budget, const_matmuls)


def run(graph: Graph, ctx: PassContext) -> list[str]:
    report = analyze(graph, ctx.sram_budget)
    if report.over_budget and ctx.analyses.get(NAME) != report:
        warn_user(f"graph '{graph.name}': {report}", SRAMBudgetWarning)
    ctx.analyses[NAME] = report
    return []
