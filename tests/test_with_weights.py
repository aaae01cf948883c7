"""Program.with_weights: new weights without a compile, on whichever backend runs the suite."""

from __future__ import annotations

import numpy as np
import pytest

import orion
from support.weighted import TEXT, W_PATH, ACT, reference, weights


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
    assert orion.compile_count() == before + 1
    for p in (first, second, third):
        p.unload()


def test_every_weight_path_is_required_and_a_donor_must_be_loaded() -> None:
    w1, _, _ = weights(1)
    p = orion.compile(TEXT, w1)
    with pytest.raises(orion.CompileError, match="no weight file has that path"):
        p.with_weights({W_PATH: w1[W_PATH]})
    with pytest.raises(orion.ConstraintError) as e:
        p.with_weights({**w1, "/abs/w.bin": b""})
    assert e.value.constraint == "ANE-34"
    p.unload()
    with pytest.raises(orion.CompileError, match="unloaded"):
        p.with_weights(w1)


def test_compile_budget_exhaustion_is_not_hit_by_weight_updates(monkeypatch) -> None:
    w1, _, _ = weights(1)
    p = orion.compile(TEXT, w1)
    start = orion.compile_count()
    programs = [p.with_weights(weights(seed)[0]) for seed in range(3, 8)]
    assert orion.compile_count() == start
    for q in programs + [p]:
        q.unload()
