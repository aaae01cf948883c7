"""Test-wide settings and the schema replay of every MIL program the suite lowers from a graph.

Each program is replayed through coremltools' MIL builder as it is lowered (``SCHEMA_REPLAY``);
tests/compiler/test_schema_replay.py runs last and reports the mismatches.
"""

from __future__ import annotations

import os

os.environ.setdefault("ORION_COMPILE_BUDGET", "1000000")  # the suite compiles far more than 119 programs
os.environ.setdefault("ORION_CACHE_DIR", "off")  # tests that use the program cache give it a temp dir

import pytest  # noqa: E402

import orion.compiler  # noqa: E402
from orion.runtime import profile  # noqa: E402
from support.compiler.mil_schema_check import Replayer  # noqa: E402
from support.smollm2 import smollm2_dir, smollm2_f32_dir, smollm2_gguf_path  # noqa: E402, F401 -- session fixtures

SCHEMA_REPLAY = Replayer()


@pytest.fixture(autouse=True)
def _record_emitted(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    original = orion.compiler.lower_graph

    def recording(*args, **kwargs):
        lowered = original(*args, **kwargs)
        SCHEMA_REPLAY(request.node.nodeid, lowered.mil, lowered.weights)
        return lowered

    monkeypatch.setattr(orion.compiler, "lower_graph", recording)


@pytest.fixture
def profiling():
    """The emulator's profiler on and empty for the test, then as it was."""
    was = profile.enabled()
    profile.reset()
    profile.enable()
    yield
    profile.enable(was)
    profile.reset()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the schema replay's report last so it sees every program the other tests emitted."""
    items.sort(key=lambda item: "test_schema_replay" in item.nodeid)


# ---- ane harness: every evaluate on the ane backend is checked bit for bit against the emulator ----
# ORION_HARNESS_COMPARE=1 (set by .ci/run for the harness run) rebuilds each program on the emulator
# (without counting a compile) and compares every output byte of every evaluate. The twin runs without
# the live_lanes hint, as the ane backend does (it ignores hints): output lanes past the hinted ones are
# undefined (a chunk's or an LM head's padding lanes), so only the full computations are compared; that
# a hint changes no live lane is tests/test_live_lanes.py's and the models' reference tests' business.
HARNESS_COMPARED = [0]

if os.environ.get("ORION_HARNESS_COMPARE") == "1":
    import numpy as _np

    import orion
    import orion.runtime.program as _program

    _compile, _call, _with_weights = _program.compile, _program.BoundProgram.__call__, _program.Program.with_weights

    def _recording_compile(mil, weights=None, **kwargs):
        p = _compile(mil, weights, **kwargs)
        text = mil.encode("utf-8") if isinstance(mil, str) else bytes(mil)
        # copies: the program baked its weights, so later changes to the caller's buffers must not reach the twin
        p._harness_source = (text, {k: bytes(v) for k, v in (weights or {}).items()}, kwargs.get("profile", "hardware"),
                             tuple(kwargs.get("relaxed_ops", ())), tuple(kwargs.get("surface_counts") or (0, 0)))
        return p

    def _recording_with_weights(self, weights, **kwargs):
        p = _with_weights(self, weights, **kwargs)
        source = getattr(self, "_harness_source", None)
        if source is not None:
            p._harness_source = (source[0], {k: bytes(v) for k, v in weights.items()}, *source[2:])
        return p

    def _bytes(surface) -> _np.ndarray:
        return _np.frombuffer(surface, dtype=_np.uint8)

    def _checked_call(self, live_lanes=None):
        _call(self, live_lanes)
        program = self.program
        source = getattr(program, "_harness_source", None)
        if source is None or program.backend != "ane":
            return
        twin = program.__dict__.get("_harness_twin")
        if twin is None:
            twin = orion._core._emulator_build(*source[:4], min_surface_bytes=program._native.min_surface_bytes,
                                               surface_counts=source[4])
            program._harness_twin = twin
        copies = {}
        for name, s in [*self.inputs, *self.outputs]:
            copies[name] = orion._core.Surface(s.nbytes)
        for name, s in self.inputs:
            _bytes(copies[name])[:] = _bytes(s)
        twin.evaluate([(n, copies[n]) for n, _ in self.inputs], [(n, copies[n]) for n, _ in self.outputs], {})
        for name, s in self.outputs:
            spec = program.outputs[name]
            size = int(_np.prod(spec.shape)) * spec.dtype.itemsize
            assert _np.array_equal(_bytes(s)[:size], _bytes(copies[name])[:size]), (
                f"ane backend output '{name}' differs from the emulator's"
                + (f" (live_lanes {dict(live_lanes)})" if live_lanes else ""))
        HARNESS_COMPARED[0] += 1

    orion.compile = _program.compile = _recording_compile
    def _checked_in_turn(calls):
        for bound, live_lanes in calls:  # one at a time: the same evaluates, with Python between them
            _checked_call(bound, live_lanes)

    _program.BoundProgram.__call__ = _checked_call
    _program.BoundProgram.in_turn = staticmethod(_checked_in_turn)
    _program.Program.with_weights = _recording_with_weights


def pytest_terminal_summary(terminalreporter) -> None:
    if os.environ.get("ORION_HARNESS_COMPARE") == "1":
        terminalreporter.write_line(
            f"ane harness: {HARNESS_COMPARED[0]} evaluates on the ane backend matched the emulator bit for bit")
