"""The ane backend (csrc/ane_client.mm) against the stand-in AppleNeuralEngine framework.

Runs only in a harness build (-DORION_ANE_HARNESS=ON) with ORION_BACKEND=ane and ORION_ANE_FRAMEWORK
pointing at the stand-in (.ci/run does this). Each fault test makes the client break one requirement
of the real framework on purpose (ORION_ANE_FAULT, compiled into harness builds only) and checks that
the stand-in refuses it with a clear message: if the client ever breaks it for real, the suites fail
the same way.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import time

import numpy as np
import pytest

import orion
from support.handmil import SEVERAL_SURFACES, op, program, ttype
from support.weighted import ACT, weights
from support.weighted import TEXT as WEIGHTED

T = ttype("fp16", ACT)
SUB = program({"a": T, "b": T}, [op("d", T, "sub", x="a", y="b")], ["d"])  # two inputs: compiled with SEVERAL_SURFACES

pytestmark = pytest.mark.skipif(
    not (orion._core.ane_client_built() and os.environ.get("ORION_BACKEND") == "ane"
         and os.environ.get("ORION_ANE_FRAMEWORK", "").endswith("_harness/AppleNeuralEngine.so")),
    reason="needs the ane harness build: ORION_BACKEND=ane ORION_ANE_FRAMEWORK=<orion>/_harness/AppleNeuralEngine.so",
)


@pytest.fixture
def standin():
    lib = ctypes.CDLL(os.environ["ORION_ANE_FRAMEWORK"])
    lib.orion_ane_standin_stats.restype = ctypes.c_char_p

    class Standin:
        def stats(self) -> dict:
            gc.collect()
            return json.loads(lib.orion_ane_standin_stats())

        def fail_next_loads(self, n: int) -> None:
            lib.orion_ane_standin_fail_next_loads(n)

        def throw_next(self, selector: str) -> None:
            """The next call of `selector` raises an NSException (as the real framework may)."""
            lib.orion_ane_standin_throw_next(selector.encode())

    yield Standin()
    lib.orion_ane_standin_fail_next_loads(0)
    lib.orion_ane_standin_throw_next(b"")


def delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in after if isinstance(after[k], int) and not isinstance(after[k], bool)}


def inputs():
    rng = np.random.default_rng(0)
    return rng.standard_normal(ACT).astype(np.float16), rng.standard_normal(ACT).astype(np.float16)


def test_the_documented_sequence_runs_once_per_step(standin) -> None:
    before = standin.stats()
    p = orion.compile(SUB, **SEVERAL_SURFACES)
    assert p.backend == "ane" and orion.backend_info()["name"] == "ane"
    a, b = inputs()
    ins, outs = p.allocate_surfaces()
    assert {s.kind for s in [*ins.values(), *outs.values()]} == {"iosurface"}
    for _ in range(3):
        ins["a"].write(a)
        ins["b"].write(b)
        p.evaluate(ins, outs)
    assert np.array_equal(outs["d"].read(), (a - b).astype(np.float16))
    p.unload()
    del p
    d = delta(standin.stats(), before)
    assert d == {**d, "descriptors": 1, "compiles": 1, "loads": 1, "evaluates": 3, "unloads": 1, "leaks": 0,
                 "violations": 0, "live_models": 0}
    assert standin.stats()["qos_always_21"]


def test_ane16_a_new_request_per_evaluate(standin, monkeypatch) -> None:
    p = orion.compile(SUB, **SEVERAL_SURFACES)
    a, b = inputs()
    before = standin.stats()
    for _ in range(4):
        p(a=a, b=b)
    d = delta(standin.stats(), before)
    assert d["requests"] == d["evaluates"] == 4 and d["request_reuses"] == 0
    monkeypatch.setenv("ORION_ANE_FAULT", "reuse_request")
    q = orion.compile(SUB, **SEVERAL_SURFACES)
    for _ in range(3):
        q(a=a, b=b)
    assert delta(standin.stats(), before)["request_reuses"] == 2


def test_ane17_mil_must_be_nsdata(monkeypatch, capfd) -> None:
    monkeypatch.setenv("ORION_ANE_FAULT", "mil_as_string")
    with pytest.raises(orion.CompileError, match="returned nil.*ANE-17"):
        orion.compile(SUB, **SEVERAL_SURFACES)
    assert "ANE-17: modelWithMILText: needs the MIL as NSData" in capfd.readouterr().err


def test_ane18_weight_dictionary_never_nil(monkeypatch, capfd) -> None:
    monkeypatch.setenv("ORION_ANE_FAULT", "nil_weights")
    with pytest.raises(orion.CompileError, match="returned nil"):
        orion.compile(SUB, **SEVERAL_SURFACES)
    assert "ANE-18: weights: must be a dictionary, @{} when the program has no weights" in capfd.readouterr().err


def test_ane19_temp_dir_must_exist_before_compile(monkeypatch) -> None:
    monkeypatch.setenv("ORION_ANE_FAULT", "no_temp_dir")
    with pytest.raises(orion.CompileError, match=r"compileWithQoS: failed: .*ANE-19: the model directory .* does not exist"):
        orion.compile(SUB, **SEVERAL_SURFACES)


def test_ane19_every_weight_file_must_be_written(monkeypatch) -> None:
    monkeypatch.setenv("ORION_ANE_FAULT", "no_weight_files")
    with pytest.raises(orion.CompileError, match=r"ANE-19: weight file .*weights/weights.bin .* is missing"):
        orion.compile(WEIGHTED, weights(1)[0])


def test_compile_before_load(monkeypatch) -> None:
    monkeypatch.setenv("ORION_ANE_FAULT", "skip_compile")
    with pytest.raises(orion.CompileError, match="loadWithQoS: failed: .*load before compile: .* has no net.plist"):
        orion.compile(SUB, **SEVERAL_SURFACES)


def test_load_before_evaluate(monkeypatch) -> None:
    monkeypatch.setenv("ORION_ANE_FAULT", "skip_load")
    p = orion.compile(SUB, **SEVERAL_SURFACES)
    with pytest.raises(orion.EvaluateError, match="evaluateWithQoS: failed: .*evaluate before load"):
        p(a=np.zeros(ACT), b=np.zeros(ACT))


def test_ane13_surfaces_of_one_size(monkeypatch) -> None:
    p = orion.compile(SUB, **SEVERAL_SURFACES)
    ins = {"a": orion.Surface(ACT, nbytes=65536), "b": orion.Surface(ACT, nbytes=49152)}
    outs = {"d": orion.Surface(ACT)}
    with pytest.raises(orion.ConstraintError, match="ANE-13"):  # the client's own check first
        p.evaluate(ins, outs)
    monkeypatch.setenv("ORION_ANE_FAULT", "skip_binding_checks")
    with pytest.raises(orion.EvaluateError, match=r"ANE-13: status=0x1d .* input surfaces of 65536 and 49152 bytes"):
        p.evaluate(ins, outs)


def test_no_lock_held_across_evaluate(monkeypatch) -> None:
    p = orion.compile(SUB, **SEVERAL_SURFACES)
    ins, outs = p.allocate_surfaces()
    ins["a"].native.lock(False)
    with pytest.raises(orion.EvaluateError, match="'a' is locked: unlock surfaces before evaluate"):
        p.evaluate(ins, outs)
    ins["a"].native.unlock()
    monkeypatch.setenv("ORION_ANE_FAULT", "hold_lock")
    with pytest.raises(orion.EvaluateError, match="input surface is locked during evaluate"):
        p.evaluate(ins, outs)
    monkeypatch.delenv("ORION_ANE_FAULT")
    assert not ins["a"].native.locked  # the client released its lock on the error path
    p.evaluate(ins, outs)


def test_ane20_wrong_binding_order_is_silent_wrong_data(monkeypatch) -> None:
    """The framework cannot see a wrong order: only the bit-for-bit comparison with the emulator can."""
    a, b = inputs()
    p = orion.compile(SUB, **SEVERAL_SURFACES)
    assert np.array_equal(p(a=a, b=b)["d"], (a - b).astype(np.float16))
    monkeypatch.setenv("ORION_ANE_FAULT", "reverse_inputs")
    ins, outs = p.allocate_surfaces()
    ins["a"].write(a)
    ins["b"].write(b)
    p._native.evaluate([("a", ins["a"].native), ("b", ins["b"].native)], [("d", outs["d"].native)])
    assert np.array_equal(outs["d"].read(), (b - a).astype(np.float16))  # a and b swapped, no error anywhere


def test_ane33_programs_are_unloaded_on_every_path(standin, monkeypatch, capfd) -> None:
    before = standin.stats()
    p = orion.compile(SUB, **SEVERAL_SURFACES)
    del p  # dropped without unload(): the destructor unloads
    q = orion.compile(SUB, **SEVERAL_SURFACES)
    with pytest.raises(orion.EvaluateError):  # an evaluate error, then the program is dropped
        q.evaluate({"a": orion.Surface(ACT), "b": orion.Surface(ACT)}, {"d": orion.Surface((1, 64, 1, 16))})
    del q
    standin.fail_next_loads(2)
    with pytest.raises(orion.CompileError):  # compiled but never loaded: nothing to unload, dir removed
        orion.compile(SUB, **SEVERAL_SURFACES)
    d = delta(standin.stats(), before)
    assert d["loads"] == d["unloads"] and d["leaks"] == 0
    monkeypatch.setenv("ORION_ANE_FAULT", "no_unload")
    r = orion.compile(SUB, **SEVERAL_SURFACES)
    del r
    assert delta(standin.stats(), before)["leaks"] == 1
    assert "ANE-33: a model was released while loaded" in capfd.readouterr().err


def test_ane36_load_is_retried_once_after_100ms(standin, monkeypatch) -> None:
    standin.fail_next_loads(1)
    start = time.perf_counter()
    p = orion.compile(SUB, **SEVERAL_SURFACES)
    assert time.perf_counter() - start >= 0.1
    a, b = inputs()
    assert np.array_equal(p(a=a, b=b)["d"], (a - b).astype(np.float16))
    standin.fail_next_loads(2)
    with pytest.raises(orion.CompileError, match=r"loadWithQoS: failed: .*transient.*tried 2 times, 100 ms apart; ANE-36"):
        orion.compile(SUB, **SEVERAL_SURFACES)
    monkeypatch.setenv("ORION_ANE_FAULT", "no_retry")
    standin.fail_next_loads(1)
    with pytest.raises(orion.CompileError, match="tried 1 times"):
        orion.compile(SUB, **SEVERAL_SURFACES)


def test_compiles_count_toward_the_budget_and_errors_carry_the_nserror(standin) -> None:
    before_count, before = orion.compile_count(), standin.stats()
    orion.compile(SUB, **SEVERAL_SURFACES)
    assert orion.compile_count() == before_count + 1
    with pytest.raises(orion.ConstraintError) as e:  # Orion's front end rejects before the framework sees it
        orion.compile(program({"x": T}, [op("g", T, "gelu", x="x")], ["g"]))
    assert e.value.constraint == "ANE-02"
    assert delta(standin.stats(), before)["descriptors"] == 1


def test_with_weights_uses_the_patch_path_without_compiling(standin) -> None:
    (w1, _, _), (w2, _, _) = weights(1), weights(2)
    x = np.random.default_rng(3).standard_normal(ACT).astype(np.float16)
    p = orion.compile(WEIGHTED, w1)
    before, count = standin.stats(), orion.compile_count()
    q = p.with_weights(w2)
    d = delta(standin.stats(), before)
    assert orion.compile_count() == count and d["compiles"] == 0 and d["loads"] == 1
    assert not np.array_equal(p(x=x)["y"], q(x=x)["y"])
    twin = orion.runtime.program.Program(orion._core._emulator_build(WEIGHTED.encode(), w2), {"x": "fp16", "y": "fp16"})
    assert np.array_equal(q(x=x)["y"], twin(x=x)["y"])
    p.unload()
    with pytest.raises(orion.CompileError, match="unloaded"):
        p.with_weights(w1)


def unique_program(tag: str) -> str:
    """SUB with an op name of its own: a model the framework cannot already hold compiled (two inputs: compiled
    with SEVERAL_SURFACES)."""
    return program({"a": T, "b": T}, [op(f"d_{tag}", T, "sub", x="a", y="b")], [f"d_{tag}"])


def test_no_program_reaches_the_framework_without_build_info(standin) -> None:
    """The stand-in refuses MIL without a buildInfo block, so every harness suite shows none arrives without
    one; orion.compile adds the default block to hand-written text, and only build_info=False (the probe)
    sends it as written."""
    text = unique_program("bi")
    assert "buildInfo" not in text
    before = standin.stats()
    a, b = inputs()
    with orion.compile(text, **SEVERAL_SURFACES) as p:
        assert np.array_equal(p(a=a, b=b)["d_bi"], (a - b).astype(np.float16))
    assert delta(standin.stats(), before)["violations"] == 0
    with pytest.raises(orion.CompileError, match="no buildInfo block"):
        orion.compile(text, build_info=False, **SEVERAL_SURFACES)
    assert delta(standin.stats(), before)["violations"] == 1
    from orion import doctor
    assert doctor.report()["end_to_end"]["ok"]  # the doctor's program, as a Mac user's first run sends it
    assert delta(standin.stats(), before)["violations"] == 1


@pytest.mark.parametrize(("selector", "error", "step"), [
    ("modelWithMILText:weights:optionsPlist:", orion.CompileError, "modelWithMILText"),
    ("compiledModelExists", orion.CompileError, "compiledModelExists"),
    ("compileWithQoS:options:error:", orion.CompileError, "compileWithQoS:"),
    ("loadWithQoS:options:error:", orion.CompileError, "loadWithQoS:"),
    ("requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:",
     orion.EvaluateError, "requestWithInputs"),
    ("evaluateWithQoS:options:request:error:", orion.EvaluateError, "evaluateWithQoS:"),
    ("unloadWithQoS:error:", orion.EvaluateError, "unloadWithQoS:"),
])
def test_objective_c_exceptions_become_orion_errors(standin, selector, error, step) -> None:
    """Each framework call is wrapped in @try (as libane does): an NSException is the step's CompileError or
    EvaluateError with the framework's reason, and the client stays usable."""
    a, b = inputs()
    text = unique_program("exc")
    reason = f"ANEStandInException: stand-in exception in {selector}"
    before = standin.stats()
    if error is orion.CompileError and selector != "loadWithQoS:options:error:":
        standin.throw_next(selector)
        with pytest.raises(error, match=f"{step}.*{reason}"):
            orion.compile(text, **SEVERAL_SURFACES)
    elif selector == "loadWithQoS:options:error:":  # an exception is a failed attempt: retried once, then loads
        standin.throw_next(selector)
        with orion.compile(text, **SEVERAL_SURFACES) as p:
            assert np.array_equal(p(a=a, b=b)["d_exc"], (a - b).astype(np.float16))
    else:
        p = orion.compile(text, **SEVERAL_SURFACES)
        standin.throw_next(selector)
        with pytest.raises(error, match=f"{step}.*{reason}"):
            p.unload() if selector.startswith("unload") else p(a=a, b=b)
        if not selector.startswith("unload"):
            assert np.array_equal(p(a=a, b=b)["d_exc"], (a - b).astype(np.float16))
            p.unload()
    assert delta(standin.stats(), before)["exceptions"] == 1


def test_a_model_the_framework_holds_compiled_is_loaded_without_a_compile(standin) -> None:
    """libane checks compiledModelExists before compiling: such a load is not counted against the budget."""
    text = unique_program("held")
    a, b = inputs()
    p = orion.compile(text, **SEVERAL_SURFACES)
    before, count = standin.stats(), orion.compile_count()
    q = orion.compile(text, **SEVERAL_SURFACES)  # same MIL and weights: the same model directory, compiled already
    d = delta(standin.stats(), before)
    assert orion.compile_count() == count and d["compiles"] == 0 and d["compile_skips"] == 1 and d["loads"] == 1
    assert np.array_equal(q(a=a, b=b)["d_held"], (a - b).astype(np.float16))
    p.unload()
    q.unload()
    r = orion.compile(text, **SEVERAL_SURFACES)  # nothing holds it now: compiled (and counted) again
    assert orion.compile_count() == count + 1
    r.unload()
