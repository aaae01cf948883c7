"""Shared fixtures: a record of every MIL program the compiler tests emit (replayed through coremltools
at the end of the session by test_schema_replay.py) and helpers to skip until orion.mil/compile exist."""

from __future__ import annotations

import pytest

import orion
import orion.compiler

EMITTED: list[tuple[str, str, dict[str, bytes]]] = []  # (test id, MIL text, weights)


def have_mil() -> bool:
    try:
        from orion import blobfile, mil  # noqa: F401
    except ImportError:
        return False
    return True


def have_compile() -> bool:
    return have_mil() and hasattr(orion, "compile")


needs_mil = pytest.mark.skipif(not have_mil(), reason="orion.mil / orion.blobfile not built in this tree yet")
needs_compile = pytest.mark.skipif(not have_compile(), reason="orion.compile (emulator) not built in this tree yet")


@pytest.fixture(autouse=True)
def _record_emitted(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Record every program lowered during a test."""
    original = orion.compiler.lower_graph

    def recording(*args, **kwargs):
        lowered = original(*args, **kwargs)
        EMITTED.append((request.node.nodeid, lowered.mil, lowered.weights))
        return lowered

    monkeypatch.setattr(orion.compiler, "lower_graph", recording)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the schema replay last so it sees every program the other tests emitted."""
    items.sort(key=lambda item: "test_schema_replay" in item.nodeid)


@pytest.fixture(params=["ir", pytest.param("emulator", marks=needs_compile)])
def mode(request: pytest.FixtureRequest) -> str:
    """Check legalizations on the legalized IR in numpy, and end to end on the emulator once merged."""
    return request.param
