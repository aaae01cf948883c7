"""The low-level Python API: Program, Surface, backend, and clear errors for bad input."""

from __future__ import annotations

import os
import resource

import numpy as np
import pytest

import orion
from support.handmil import SEVERAL_SURFACES, op, program, ttype

ACT = (1, 64, 1, 32)
T = ttype("fp16", ACT)
TEXT = program({"x": T, "y": T}, [op("s", T, "add", x="x", y="y"), op("p", T, "mul", x="x", y="y")], ["s", "p"])


def test_backend_and_specs() -> None:
    assert orion.backend() == (os.environ.get("ORION_BACKEND") or "emulator")
    p = orion.compile(TEXT, **SEVERAL_SURFACES)
    assert p.inputs == {"x": (ACT, np.dtype(np.float16)), "y": (ACT, np.dtype(np.float16))}
    assert list(p.outputs) == ["p", "s"] and p.outputs["s"].shape == ACT


def test_call_and_zero_copy_evaluate_agree() -> None:
    p = orion.compile(TEXT, **SEVERAL_SURFACES)
    x, y = np.full(ACT, 1.5, np.float16), np.full(ACT, 2.0, np.float16)
    out = p(x=x, y=y)
    assert out["s"].dtype == np.float16 and np.all(out["s"] == 3.5) and np.all(out["p"] == 3.0)
    ins, outs = p.allocate_surfaces()
    assert all(s.nbytes >= orion.MIN_SURFACE_BYTES for s in [*ins.values(), *outs.values()])
    ins["x"].array[...] = x  # write through the numpy view
    ins["y"].write(y)
    for _ in range(3):  # surfaces are reused
        p.evaluate(ins, outs)
    assert outs["s"].array.base is not None and np.all(outs["s"].array == 3.5)


def test_bound_programs_copy_views_and_run_in_turn() -> None:
    """``bind``'s copies (strided views, as a stage's packed tensors are) run around each evaluate, and
    ``BoundProgram.in_turn`` runs bound programs in order: the second reads what the first wrote; numpy is the reference."""
    p = orion.compile(TEXT, **SEVERAL_SURFACES)
    (ins1, outs1), (ins2, outs2) = p.allocate_surfaces(), p.allocate_surfaces()
    rng = np.random.default_rng(0)
    source = rng.integers(-4, 4, (64, 64)).astype(np.float16)  # x of the first: every other column of it
    saved = np.zeros((32, 64), np.float16)  # the first's p, transposed, copied out after it
    ins1["y"].array[...] = 2.0
    first = p.bind(ins1, outs1, copy_in=[(source[None, :, None, ::2], ins1["x"].array)],
                   copy_out=[(outs1["p"].array[0, :, 0].T, saved)])
    second = p.bind(ins2, outs2, copy_in=[(outs1["s"].array, ins2["x"].array), (outs1["p"].array, ins2["y"].array)])
    orion.runtime.program.BoundProgram.in_turn([(first, None), (second, None)])
    x = source[:, ::2].astype(np.float64)
    np.testing.assert_array_equal(saved, (2 * x).T)
    np.testing.assert_array_equal(outs2["s"].array[0, :, 0], (x + 2) + 2 * x)
    np.testing.assert_array_equal(outs2["p"].array[0, :, 0], (x + 2) * (2 * x))
    with pytest.raises(ValueError, match="one shape and dtype"):
        p.bind(ins1, outs1, copy_in=[(np.zeros(ACT, np.float32), ins1["x"].array)])
    with pytest.raises(ValueError, match="one shape and dtype"):
        p.bind(ins1, outs1, copy_in=[(np.zeros((1, 64, 1, 16), np.float16), ins1["x"].array)])


def test_float32_inputs_are_converted_and_results_do_not_alias() -> None:
    p = orion.compile(TEXT, **SEVERAL_SURFACES)
    a = p(x=np.ones(ACT, np.float32), y=np.ones(ACT))
    b = p(x=np.zeros(ACT, np.float32), y=np.zeros(ACT))
    assert np.all(a["s"] == 2) and np.all(b["s"] == 0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(x=np.ones(ACT, np.float16)), r"missing inputs \['y'\]"),
    (dict(x=np.ones(ACT), y=np.ones(ACT), z=np.ones(ACT)), r"unknown inputs \['z'\]"),
    (dict(x=np.ones((1, 64, 1, 16)), y=np.ones(ACT)), r"input 'x' has shape \[1, 64, 1, 16\].*\[1, 64, 1, 32\]"),
    (dict(x=np.ones(ACT, np.complex64), y=np.ones(ACT)), r"input 'x' is complex64"),
    (dict(x=np.full(ACT, np.nan), y=np.ones(ACT)), r"input 'x' contains NaN"),
])
def test_bad_call_arguments(kwargs, match) -> None:
    with pytest.raises(orion.EvaluateError, match=match):
        orion.compile(TEXT, **SEVERAL_SURFACES)(**kwargs)


def test_surface_of_the_wrong_type_or_size() -> None:
    p = orion.compile(TEXT, **SEVERAL_SURFACES)
    ins, outs = p.allocate_surfaces()
    ins["x"] = orion.Surface(ACT, "fp32", nbytes=ins["y"].nbytes)
    with pytest.raises(orion.EvaluateError, match=r"input 'x': the surface holds fp32"):
        p.evaluate(ins, outs)
    with pytest.raises(ValueError, match="needs 4096 bytes"):
        orion.Surface(ACT, nbytes=100)
    ins, outs = p.allocate_surfaces()
    with pytest.raises(orion.EvaluateError, match=r"needs 4096 bytes .* has 16"):
        p._native.evaluate([(n, orion._core.Surface(16)) for n in ("x", "y")], [(n, outs[n].native) for n in ("p", "s")])


def test_unload_and_context_manager() -> None:
    with orion.compile(TEXT, **SEVERAL_SURFACES) as p:
        assert p.loaded
        p(x=np.ones(ACT), y=np.ones(ACT))
    assert not p.loaded
    with pytest.raises(orion.EvaluateError, match="unloaded"):
        p(x=np.ones(ACT), y=np.ones(ACT))


def test_compile_count_moves_by_one_per_compile() -> None:
    before = orion.compile_count()
    orion.compile(TEXT, **SEVERAL_SURFACES)
    assert orion.compile_count() == before + 1


@pytest.mark.parametrize("text,line,column", [
    ("program(1.3)\n{\n    func main<ios18>(tensor<fp16, [1, 64, 1, 32]> x {\n", 3, 53),
    ("program(1.3)\n{\n    func main<ios18>(tensor<fp99, [1]> x) {\n", 3, 29),
])
def test_malformed_mil_gives_line_and_column(text, line, column) -> None:
    with pytest.raises(orion.ParseError) as e:
        orion.compile(text)
    assert (e.value.line, e.value.column) == (line, column)
    assert f"line {line}, column {column}" in str(e.value)


@pytest.mark.parametrize("body,match", [
    ([op("out", T, "tanh", x="nope")], r"uses 'nope', which is not defined"),
    ([op("out", T, "frobnicate", x="x")], r"unknown op 'frobnicate'"),
    ([op("out", ttype("fp16", [1, 64, 1, 64]), "tanh", x="x")], r"declares tensor<fp16, \[1, 64, 1, 64\]> but its inputs give"),
    ([op("out", T, "tanh", x="x", y="x")], r"unknown argument 'y'"),
    ([op("out", T, "add", x="x")], r"missing required argument 'y'"),
])
def test_type_and_reference_errors_name_the_op(body, match) -> None:
    with pytest.raises(orion.CompileError, match=match) as e:
        orion.compile(program({"x": T}, body, ["out"]))
    assert "line 4: op 'out'" in str(e.value)


def test_unknown_profile_and_backend_env(monkeypatch) -> None:
    with pytest.raises(orion.CompileError, match="unknown profile 'fast'"):
        orion.compile(TEXT, profile="fast")
    monkeypatch.setenv("ORION_BACKEND", "ane")
    if not orion._core.ane_client_built():
        with pytest.raises(orion.OrionError, match="needs macOS on Apple Silicon"):
            orion.backend()
    monkeypatch.setenv("ORION_BACKEND", "gpu")
    with pytest.raises(orion.OrionError, match="not a backend"):
        orion.backend()


def test_a_program_too_large_for_memory_is_refused_by_name() -> None:
    huge = ttype("fp16", [32768, 65536])  # MAX_ELEMENTS (2^31) each: 8.6 GB in fp32, 35 tensors
    chain = [op(f"y{i}", huge, "tanh", x=f"y{i - 1}" if i else "x") for i in range(34)]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    with pytest.raises(orion.CompileError, match=r"GB of emulator memory \(largest tensor 'x'"):
        orion.compile(program({"x": huge}, chain, ["y33"]), profile="permissive")
    # refused before anything is allocated (by memory, not wall time: CI's machine is shared)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 256 * 1024
