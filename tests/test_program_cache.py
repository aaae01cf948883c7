"""The program caches: lowered programs on disk (verified, rebuilt when damaged) and compiled
programs in this process (never handing out an unloaded one).

Reference: numpy float32 of the small linear + relu graph (tolerance 2e-2 relative to its scale, fp16)."""

from __future__ import annotations

import numpy as np
import pytest

import orion
from orion.compiler import compile_lowered
from orion.program_cache import lower_cached

RNG = np.random.default_rng(0)
W = RNG.standard_normal((64, 64)).astype(np.float32) * 0.1
X = RNG.standard_normal((1, 64, 1, 32)).astype(np.float32)


def graph() -> orion.Graph:
    g = orion.Graph("cached_block")
    g.output(g.relu(g.linear(g.input("x", [1, 64, 1, 32]), W)), "y")
    return g


def reference() -> np.ndarray:
    return np.maximum(W @ X[0, :, 0, :], 0)[None, :, None, :]


def check_runs(compiled) -> None:
    want = reference()
    np.testing.assert_allclose(compiled(x=X)["y"], want, rtol=0, atol=2e-2 * float(np.abs(want).max()))


def test_a_damaged_entry_is_rebuilt_with_one_warning(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    description = {"test": "damaged entry"}
    first, cached = lower_cached(description, graph)
    assert not cached
    weight_file = max(tmp_path.glob("*/weights/*"), key=lambda f: f.stat().st_size)
    weight_file.write_bytes(weight_file.read_bytes()[:-100])  # truncated, as by a full disk
    capsys.readouterr()
    again, cached = lower_cached(description, graph)
    warning = capsys.readouterr().err.strip().splitlines()
    assert not cached and len(warning) == 1
    assert "program cache entry" in warning[0] and "damaged" in warning[0] and "rebuilding" in warning[0]
    assert again.weights == first.weights
    check_runs(compile_lowered(again))
    third, cached = lower_cached(description, graph)  # the rebuilt entry is good
    assert cached and third.weights == first.weights and capsys.readouterr().err == ""


@pytest.mark.parametrize("where", ["a file", "below a file"])
def test_cache_dir_that_is_not_a_directory(tmp_path, monkeypatch, where) -> None:
    file = tmp_path / "plain"
    file.write_text("not a directory")
    setting = file if where == "a file" else file / "cache"
    monkeypatch.setenv("ORION_CACHE_DIR", str(setting))
    with pytest.raises(orion.OrionError, match=r"ORION_CACHE_DIR.*(not a directory|cannot create).*ORION_CACHE_DIR=off"):
        lower_cached({"test": "cache dir"}, graph)


def test_unloading_a_compiled_graph_does_not_poison_the_process_cache() -> None:
    first = orion.compile_graph(graph())
    check_runs(first)
    first.program.unload()
    again = orion.compile_graph(graph())
    assert again.program.loaded
    check_runs(again)
