"""Replay every MIL program the compiler tests emitted (parsed back with orion.mil.parse) through
coremltools' MIL builder and compare declared output types with coremltools' type inference.
Runs last (see conftest.pytest_collection_modifyitems)."""

from __future__ import annotations

import os

import pytest

from conftest import EMITTED
from support.compiler.mil_schema_check import coremltools, replay

from .test_compiler import block
from .test_lowering import mlp


def test_every_emitted_program_matches_coremltools_types() -> None:
    if coremltools() is None:
        message = "coremltools 9.0 is not installed (pip install '.[test]' brings it)"
        if os.environ.get("CI"):
            pytest.fail(message + ": CI must run the schema replay")
        pytest.skip(message)
    from orion import mil
    from orion.compiler import lower_graph

    for graph in (mlp(), block()[0]):  # at least these, when this test runs alone
        for io_dtype in ("fp16", "fp32"):
            lower_graph(graph, io_dtype=io_dtype)
    programs = {text: (test_id, weights) for test_id, text, weights in EMITTED}
    failures = []
    for text, (test_id, weights) in programs.items():
        mismatches = replay(mil.parse(text), weights)
        failures.extend(f"{test_id}: {m}" for m in mismatches)
    assert not failures, "\n".join(failures)
    assert len(programs) >= 4
