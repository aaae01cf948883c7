"""Program.with_weights: new weights without a compile, on whichever backend runs the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import orion
from support.handmil import blobfile
from support.weighted import ACT, B_OFFSET, TEXT, W_PATH, reference, weights

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_outputs_follow_the_new_weights_and_no_compile_is_counted() -> None:
    w1, wa, ba = weights(1)
    w2, wb, bb = weights(2)
    x = np.random.default_rng(0).standard_normal(ACT).astype(np.float16)
    first = orion.compile(TEXT, w1)
    before = orion.compile_count()
    second = first.with_weights(w2)
    assert orion.compile_count() == before
    assert second.backend == first.backend == orion.backend()
    y1, y2 = first(x=x)["y"], second(x=x)["y"]
    np.testing.assert_allclose(y1, reference(x, wa, ba), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(y2, reference(x, wb, bb), rtol=2e-2, atol=2e-2)
    assert not np.array_equal(y1, y2)
    # the donor is untouched and a fresh compile of the new weights agrees bit for bit
    assert np.array_equal(first(x=x)["y"], y1)
    assert np.array_equal(orion.compile(TEXT, w2)(x=x)["y"], y2)
    # chained updates keep working, still without compiling
    third = second.with_weights(w1)
    assert np.array_equal(third(x=x)["y"], y1)
    # one compile (the fresh one), or none on the ane backend when the framework still holds that model
    # compiled (compiledModelExists: the patched `second` has the same MIL and weights)
    assert orion.compile_count() - before in ((0, 1) if orion.backend() == "ane" else (1,))
    for p in (first, second, third):
        p.unload()


def test_every_weight_path_is_required_and_a_donor_must_be_loaded() -> None:
    w1, _, _ = weights(1)
    p = orion.compile(TEXT, w1)
    with pytest.raises(orion.CompileError, match="no weight file has that path"):
        p.with_weights({})
    with pytest.raises(orion.ConstraintError) as e:
        p.with_weights({**w1, "/abs/w.bin": b""})
    assert e.value.constraint == "ANE-34"
    p.unload()
    with pytest.raises(orion.CompileError, match="unloaded"):
        p.with_weights(w1)


def test_weight_updates_work_after_the_compile_budget_is_exhausted() -> None:
    """In a fresh process with ORION_COMPILE_BUDGET=2: the third compile is refused, yet weight
    updates of a compiled program keep working and change the outputs."""
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {TESTS!r})
        import numpy as np, orion
        from support.weighted import TEXT, ACT, reference, weights
        x = np.random.default_rng(0).standard_normal(ACT).astype(np.float16)
        p = orion.compile(TEXT, weights(1)[0])
        orion.compile(TEXT, weights(2)[0]).unload()
        try:
            orion.compile(TEXT, weights(3)[0])
            raise SystemExit("a third compile passed a budget of 2")
        except orion.CompileBudgetExhausted as e:
            assert "ANE-11" in str(e), e
        for seed in range(3, 8):
            w, a, b = weights(seed)
            q = p.with_weights(w)
            np.testing.assert_allclose(q(x=x)["y"], reference(x, a, b), rtol=2e-2, atol=2e-2)
            q.unload()
        print("compiles", orion.compile_count(), "of", orion.compile_budget())
    """)
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "ORION_COMPILE_BUDGET": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "compiles 2 of 2"


def test_a_patch_of_several_weight_files_is_refused_on_the_ane_unless_proven() -> None:
    """docs/hardware.md §6: the patch is verified on hardware for one weight file; with two, the ane backend
    refuses with_weights unless unverified_patch=True (the weight_patch_multi_file probe); the emulator runs it."""
    b_path = "@model_path/weights/b.bin"
    text = TEXT.replace(f'weights.bin"), offset=uint64({B_OFFSET})', 'b.bin"), offset=uint64(64)')
    assert b_path in text

    def two_files(seed: int) -> tuple[dict[str, bytes], np.ndarray, np.ndarray]:
        _, w, b = weights(seed)
        return {W_PATH: blobfile(w.tobytes()), b_path: blobfile(b.tobytes())}, w, b

    (w1, _, _), (w2, wb, bb) = two_files(1), two_files(2)
    x = np.random.default_rng(4).standard_normal(ACT).astype(np.float16)
    with orion.compile(text, w1) as p:
        if orion.backend() == "ane":
            with pytest.raises(orion.CompileError, match="2 weight files.*unverified_patch=True"):
                p.with_weights(w2)
        with p.with_weights(w2, unverified_patch=True) as q:
            np.testing.assert_allclose(q(x=x)["y"].astype(np.float32), reference(x, wb, bb), rtol=2e-2, atol=2e-2)
