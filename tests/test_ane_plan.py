"""The ane backend's decisions, in portable C++ (csrc/runtime/ane_plan, runtime/backend), tested on any host."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

import orion
from orion._core import ane_plan

MIL = b"program(1.3)\n{}\n"


def test_model_directory_layout_and_weight_dictionary() -> None:
    weights = {"@model_path/weights/b.bin": b"BB", "@model_path/weights/a.bin": b"A", "@model_path/extra/c.bin": b"C"}
    dirs, files, entries = ane_plan.plan_model(MIL, weights)
    assert dirs == ["", "weights", "extra"]
    assert files == [("model.mil", MIL), ("extra/c.bin", b"C"), ("weights/a.bin", b"A"), ("weights/b.bin", b"BB")]
    assert entries == [(k, 0, weights[k]) for k in sorted(weights)]  # dictionary offset 0, whole files
    assert ane_plan.plan_model(MIL, {}) == (["", "weights"], [("model.mil", MIL)], [])  # @{} (ANE-18)


@pytest.mark.parametrize("key", ["weights/w.bin", "@model_path/../w.bin", "@model_path//w.bin", "@model_path/model.mil",
                                 "@model_path/net.plist", "@model_path/data"])
def test_bad_weight_keys_are_refused(key) -> None:
    with pytest.raises(orion.ConstraintError) as e:
        ane_plan.plan_model(MIL, {key: b"x"})
    assert e.value.constraint == "ANE-34"


def test_file_and_directory_clash_is_refused() -> None:
    with pytest.raises(orion.ConstraintError, match="both a file and a directory"):
        ane_plan.plan_model(MIL, {"@model_path/w": b"1", "@model_path/w/x.bin": b"2"})


def test_write_model_dir_and_patch_files(tmp_path) -> None:
    weights = {"@model_path/weights/a.bin": b"AAA", "@model_path/weights/b.bin": b"B"}
    donor, target = str(tmp_path / "donor"), str(tmp_path / "new")
    ane_plan.write_model_dir(donor, MIL, weights)
    assert (tmp_path / "donor/model.mil").read_bytes() == MIL
    assert (tmp_path / "donor/weights/a.bin").read_bytes() == b"AAA"
    ane_plan.write_model_dir(target, MIL, weights)
    with pytest.raises(orion.CompileError, match="no compiled .*net.plist"):
        ane_plan.write_patch_files(donor, target, weights)
    (tmp_path / "donor/net.plist").write_bytes(b"compiled")
    new = {"@model_path/weights/a.bin": b"xyz", "@model_path/weights/b.bin": b"Q"}
    ane_plan.write_patch_files(donor, target, new)
    assert (tmp_path / "new/net.plist").read_bytes() == b"compiled"
    assert (tmp_path / "new/data").read_bytes() == b"xyzQ" == ane_plan.patch_data(new)  # key order
    ane_plan.write_patch_files(donor, donor, new)  # same identifier: net.plist stays, data replaced
    assert (tmp_path / "donor/net.plist").read_bytes() == b"compiled"


def test_model_dir_path_refuses_non_names() -> None:
    assert ane_plan.model_dir_path("/tmp/x", "ABC123") == "/tmp/x/ABC123"
    for bad in ["", ".", "..", "a/b"]:
        with pytest.raises(orion.CompileError):
            ane_plan.model_dir_path("/tmp/x", bad)


def test_shared_model_dir_is_removed_with_the_last_lease(tmp_path) -> None:
    d = str(tmp_path / "m")
    ane_plan.write_model_dir(d, MIL, {})
    first, fresh1 = ane_plan.lease_model_dir(d)
    second, fresh2 = ane_plan.lease_model_dir(d)
    assert fresh1 and not fresh2
    del first
    assert os.path.isdir(d)
    del second
    assert not os.path.exists(d)


def test_load_retry_policy() -> None:
    calls = []

    def flaky(results):
        def attempt():
            calls.append(time.perf_counter())
            return results[len(calls) - 1]
        return attempt

    assert ane_plan.load_with_retry(flaky([(True, "")])) == (True, 1, "")
    calls.clear()
    assert ane_plan.load_with_retry(flaky([(False, "busy"), (True, "")])) == (True, 2, "")
    assert calls[1] - calls[0] >= 0.1 and ane_plan.LOAD_RETRY_DELAY_MS == 100
    calls.clear()
    assert ane_plan.load_with_retry(flaky([(False, "first"), (False, "second")]), 1) == (False, 2, "second")
    assert ane_plan.QOS == 21


def test_surface_properties_are_a_flat_byte_buffer() -> None:
    assert ane_plan.surface_properties(49152) == {"Width": 49152, "Height": 1, "BytesPerElement": 1,
                                                  "BytesPerRow": 49152, "AllocSize": 49152, "PixelFormat": 0}
    with pytest.raises(orion.EvaluateError):
        ane_plan.surface_properties(0)


ANE_OK = ("ane", True, "AppleNeuralEngine framework loaded from /S/L/PF/ANE")
ANE_MISSING = ("ane", False, "dlopen(\"/S/L/PF/ANE\") failed: no such file")
EMU = ("emulator", True, "software ANE emulator")


@pytest.mark.parametrize("requested,statuses,name,warns", [
    ("", [EMU, ANE_OK], "ane", False),
    ("", [EMU, ANE_MISSING], "emulator", True),  # an Intel Mac: fall back with a one-line warning
    ("", [EMU], "emulator", False),  # Linux: no client built, no warning
    ("emulator", [EMU, ANE_OK], "emulator", False),
    ("ane", [EMU, ANE_OK], "ane", False),
])
def test_backend_selection(requested, statuses, name, warns) -> None:
    s = ane_plan.select_backend(requested, statuses, "Linux x86_64")
    assert s["name"] == name and bool(s["warning"]) == warns and s["reason"]


def test_backend_selection_errors() -> None:
    with pytest.raises(orion.CompileError, match="no such file. Unset ORION_BACKEND"):
        ane_plan.select_backend("ane", [EMU, ANE_MISSING], "macOS x86_64")
    with pytest.raises(orion.CompileError, match="this build has no ANE client .Linux x86_64"):
        ane_plan.select_backend("ane", [EMU], "Linux x86_64")
    with pytest.raises(orion.CompileError, match="not a backend"):
        ane_plan.select_backend("gpu", [EMU], "Linux x86_64")


def test_backend_info_explains_the_choice() -> None:
    info = orion.backend_info()
    assert info["name"] == orion.backend() and info["reason"]
    assert ("emulator", True, "software ANE emulator (always available)") in info["backends"]


def test_surfaces_lock_and_unlock() -> None:
    s = orion.Surface((1, 8, 1, 32))
    with s.cpu_access() as a:
        assert s.native.locked
        a[...] = 1
    assert not s.native.locked and s.read().sum() == 256
    s.native.lock(True)
    with pytest.raises(orion.EvaluateError, match="already locked"):
        s.native.lock(False)
    s.native.unlock()
    with pytest.raises(orion.EvaluateError, match="not locked"):
        s.native.unlock()


CSRC = Path(__file__).resolve().parents[1] / "csrc"


@pytest.mark.parametrize("source", ["ane_client.mm", *sorted(f"frontend/{p.name}" for p in (CSRC / "frontend").iterdir())])
def test_the_ane_backend_and_the_front_end_use_nothing_of_the_emulator(source: str) -> None:
    """AneProgram compiles through the shared front end (type step included) alone: neither it nor the
    front end includes or calls anything of csrc/emulator/."""
    text = (CSRC / source).read_text()
    assert re.findall(r'#\s*(?:include|import)\s+"emulator/[^"]*"', text) == []
    assert "emu::" not in text


def test_a_patch_of_several_weight_files_is_refused_until_a_probe_proves_it() -> None:
    """docs/hardware.md §6: [O] verified the patch with one weight file only; several are refused on the ane
    backend unless the caller passes unverified_patch (after weight_patch_multi_file worked)."""
    ane_plan.check_patch({"@model_path/weights/all.bin": b"x"})  # one file: the verified case
    ane_plan.check_patch({})
    two = {"@model_path/weights/a.bin": b"A", "@model_path/weights/b.bin": b"B"}
    with pytest.raises(orion.CompileError, match="2 weight files.*weight_patch_multi_file.*unverified_patch=True"):
        ane_plan.check_patch(two)
    ane_plan.check_patch(two, unverified=True)


def test_compile_step_reuses_what_the_framework_holds() -> None:
    """libane checks compiledModelExists before compiling: such a load spends no compile."""
    assert ane_plan.compile_step(False, False) == "compile"
    assert ane_plan.compile_step(False, True) == "reuse"
    assert ane_plan.compile_step(True, False) == ane_plan.compile_step(True, True) == "patch"


def test_objective_c_exception_text_keeps_the_frameworks_reason() -> None:
    assert ane_plan.objc_exception_text("NSInvalidArgumentException", "bad MIL") == \
        "raised NSInvalidArgumentException: bad MIL"
    assert ane_plan.objc_exception_text(None, None) == "raised an Objective-C exception that is not an NSException"
    assert ane_plan.objc_exception_text("X", None) == "raised X: (no reason given)"


def test_budget_keeps_a_margin_and_warns_only_by_default() -> None:
    """Default budget 119: refuse from 115 on and warn at 100 (libane's numbers); an ORION_COMPILE_BUDGET
    override is the limit itself (tests, measured machines)."""
    assert orion._core.budget_policy(119, False) == (115, 100)
    assert orion._core.budget_policy(119, True) == (119, 0)
    assert orion._core.budget_policy(3, False) == (0, 3)
    assert orion._core.budget_policy(2, True) == (2, 0)


def test_default_budget_refuses_at_the_margin_and_warns_once() -> None:
    """In a fresh process with the default budget: compile 100 warns (RuntimeWarning, once), 115 are allowed
    and the 116th is refused with the margin named."""
    import subprocess
    import sys
    script = """
import warnings, orion
text = 'program(1.3)\\n{\\n    func main<ios18>(tensor<fp16, [1, 64, 1, 384]> x) {\\n        tensor<fp16, [1, 64, 1, 384]> y = tanh(x=x)[name=string("y")];\\n    } -> (y);\\n}\\n'
assert orion._core.compile_limit() == 115 and orion.compile_budget() == 119
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for i in range(115):
        orion.compile(text).unload()
warned = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) and "ANE-11" in str(w.message)]
assert len(warned) == 1 and "refuses from 115" in warned[0], warned
try:
    orion.compile(text)
    raise SystemExit("compile 116 passed")
except orion.CompileBudgetExhausted as e:
    assert "margin of 4" in str(e), e
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "ORION_COMPILE_BUDGET"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr
