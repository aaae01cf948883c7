"""Unfused twins of a MIL program, for the tests of the emulator's fused kernels: the same ops, kept apart.

A fused group never takes a value something outside it reads, nor one followed by an ``identity`` (which
ends a group and copies exactly); so a twin computes the group's ops one by one, which the fused kernel must
equal bit for bit."""

from __future__ import annotations

import re

import orion
from orion.compiler import CompiledGraph, lower_graph
from orion.graph import Graph
from orion.runtime import profile
from orion.runtime.stage import Stage

# The suffix of a fused group's profile row for the calls that ran the group's own ops (its kernel did not apply).
RAN_ITS_OPS = " (ran its ops)"


def identity_after(mil: str, op_line: re.Pattern[str]) -> str:
    """``mil`` with the result of every op line ``op_line`` matches (groups: indent, type, name, op, rest)
    renamed and passed through an identity under its old name."""
    lines = []
    for line in mil.splitlines():
        m = op_line.match(line)
        if not m:
            lines.append(line)
            continue
        indent, t, name, op, rest = m.groups()
        renamed = rest.replace(f'string("{name}")', f'string("{name}_raw")')
        lines.append(f"{indent}{t} {name}_raw = {op}({renamed}")
        lines.append(f'{indent}{t} {name} = identity(x = {name}_raw)[name = string("{name}")];')
    return "\n".join(lines)


def also_returning(mil: str, op: str, suffix: str = "") -> str:
    """``mil`` with the result of its first ``op`` (whose name ends with ``suffix``) also returned."""
    name = re.search(rf"> (\w+{suffix}) = {op}\(", mil).group(1)
    returned = re.search(r"\} -> \((.*)\);", mil).group(1)
    return mil.replace(f"}} -> ({returned});", f"}} -> ({returned}, {name});")


def stage_twins(graph: Graph, op: str, suffix: str = "") -> tuple[Stage, Stage]:
    """``graph`` compiled, and its twin with the result of its first ``op`` (whose name ends with ``suffix``) also
    returned, so the fused group holding it runs as its own ops; both as stages."""
    lowered = lower_graph(graph)
    unfused = also_returning(lowered.mil, op, suffix)
    return (Stage(CompiledGraph(lowered, orion.compile(lowered.mil, lowered.weights))),
            Stage(CompiledGraph(lowered, orion.compile(unfused, lowered.weights, profile="permissive"))))


def kernel_calls(stage: Stage, hints: dict[str, int] | None = None) -> dict[str, int]:
    """Calls per op kind (the emulator's profile rows) of one run of ``stage`` with live-lanes ``hints``."""
    profile.enable(True)
    profile.reset()
    try:
        stage.run(hints)
        return {row.op: row.calls for row in profile.snapshot()}
    finally:
        profile.enable(False)
