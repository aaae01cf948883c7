"""Test-wide settings and the record of every MIL program the suite lowers from a graph.

The record feeds tests/compiler/test_schema_replay.py, which runs last and replays each program
through coremltools' MIL builder.
"""

from __future__ import annotations

import os

os.environ.setdefault("ORION_COMPILE_BUDGET", "1000000")  # the suite compiles far more than 119 programs
os.environ.setdefault("ORION_CACHE_DIR", "off")  # tests that use the program cache give it a temp dir

import pytest  # noqa: E402

import orion.compiler  # noqa: E402

EMITTED: list[tuple[str, str, dict[str, bytes]]] = []  # (test id, MIL text, weights)


@pytest.fixture(autouse=True)
def _record_emitted(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    original = orion.compiler.lower_graph

    def recording(*args, **kwargs):
        lowered = original(*args, **kwargs)
        EMITTED.append((request.node.nodeid, lowered.mil, lowered.weights))
        return lowered

    monkeypatch.setattr(orion.compiler, "lower_graph", recording)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the schema replay last so it sees every program the other tests emitted."""
    items.sort(key=lambda item: "test_schema_replay" in item.nodeid)
