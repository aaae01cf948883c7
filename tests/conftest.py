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


# ---- ane harness: every evaluate on the ane backend is checked bit for bit against the emulator ----
# ORION_HARNESS_COMPARE=1 (set by .ci/run for the harness run) rebuilds each program on the emulator
# (without counting a compile) and compares every output byte of every evaluate. Evaluates with a
# live_lanes hint are not compared (lanes past the hint are undefined).
HARNESS_COMPARED = [0]

if os.environ.get("ORION_HARNESS_COMPARE") == "1":
    import numpy as _np

    import orion
    import orion.program as _program

    _compile, _evaluate, _with_weights = _program.compile, _program.Program.evaluate, _program.Program.with_weights

    def _recording_compile(mil, weights=None, **kwargs):
        p = _compile(mil, weights, **kwargs)
        text = mil.encode("utf-8") if isinstance(mil, str) else bytes(mil)
        p._harness_source = (text, dict(weights or {}), kwargs.get("profile", "hardware"))
        return p

    def _recording_with_weights(self, weights):
        p = _with_weights(self, weights)
        source = getattr(self, "_harness_source", None)
        if source is not None:
            p._harness_source = (source[0], dict(weights), source[2])
        return p

    def _checked_evaluate(self, inputs, outputs, *, live_lanes=None):
        _evaluate(self, inputs, outputs, live_lanes=live_lanes)
        source = getattr(self, "_harness_source", None)
        if source is None or live_lanes or self.backend != "ane":
            return
        twin = self.__dict__.get("_harness_twin")
        if twin is None:
            twin = orion._core._emulator_build(*source, min_surface_bytes=self._native.min_surface_bytes)
            self._harness_twin = twin
        copies = {}
        for name, s in [*inputs.items(), *outputs.items()]:
            c = orion.Surface(s.shape, s.dtype, nbytes=s.nbytes)
            if name in inputs:
                c.array[...] = s.array
            copies[name] = c
        twin.evaluate([(n, copies[n].native) for n in sorted(inputs)], [(n, copies[n].native) for n in sorted(outputs)])
        for name, s in outputs.items():
            got, want = s.array.view(_np.uint8), copies[name].array.view(_np.uint8)
            assert _np.array_equal(got, want), (
                f"ane backend output '{name}' differs from the emulator's in "
                f"{int((got != want).sum())} of {got.size} bytes")
        HARNESS_COMPARED[0] += 1

    orion.compile = _program.compile = _recording_compile
    _program.Program.evaluate = _checked_evaluate
    _program.Program.with_weights = _recording_with_weights


def pytest_terminal_summary(terminalreporter) -> None:
    if os.environ.get("ORION_HARNESS_COMPARE") == "1":
        terminalreporter.write_line(
            f"ane harness: {HARNESS_COMPARED[0]} evaluates on the ane backend matched the emulator bit for bit")
