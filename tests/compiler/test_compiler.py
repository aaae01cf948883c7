"""compile_graph end to end: unpadded arrays in and out by the graph's names, caching by content hash."""

from __future__ import annotations

import numpy as np
import pytest

import orion
from orion.compiler import CompiledGraph, compile_graph, compile_lowered, lower_graph
from orion.errors import EvaluateError
from orion.graph import Graph
from support.compiler import reference as ref


def block(w_scale: float = 0.1) -> tuple[Graph, dict[str, np.ndarray]]:
    """A pre-norm attention block (the README example)."""
    rng = np.random.default_rng(7)
    d, s, heads = 64, 32, 4
    p = {n: (rng.standard_normal((d, d)) * w_scale).astype(np.float32) for n in ("wq", "wk", "wv", "wo")}
    p["gamma"], p["beta"] = np.ones(d, np.float32), np.zeros(d, np.float32)
    g = Graph("attn_block")
    x = g.input("x", [1, d, 1, s])
    h = g.layer_norm(x, p["gamma"], p["beta"])
    att = g.attention(g.linear(h, p["wq"]), g.linear(h, p["wk"]), g.linear(h, p["wv"]), heads=heads)
    g.output(g.add(x, g.linear(att, p["wo"])), "y")
    return g, p


def block_reference(x: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    h = ref.layer_norm(ref.cs(x), p["gamma"], p["beta"], 1e-5)
    att = ref.causal_attention(p["wq"] @ h, p["wk"] @ h, p["wv"] @ h, 4)
    return ref.tensor(ref.cs(x) + p["wo"] @ att)


@pytest.mark.parametrize("io_dtype", ["fp16", "fp32"])
def test_attention_block_matches_numpy(io_dtype: str) -> None:
    g, p = block()
    compiled = compile_graph(g, io_dtype=io_dtype)
    x = np.random.default_rng(1).standard_normal((1, 64, 1, 32)).astype(np.float32)
    y = compiled(x=x)["y"]
    assert y.shape == (1, 64, 1, 32)
    np.testing.assert_allclose(y.astype(np.float32), block_reference(x, p), atol=3e-2, rtol=3e-2)


def test_compile_cache_by_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    """ANE-11: identical content is compiled once per process, sparing the compile budget."""
    calls = []
    real = orion.compile
    monkeypatch.setattr(orion, "compile", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(orion.compiler, "_PROGRAMS", {})  # nothing compiled yet in this process
    g, _ = block(0.05)
    first, second = compile_graph(g), compile_graph(block(0.05)[0])
    assert first.content_hash == second.content_hash and first.program is second.program and len(calls) == 1


def test_threads_compiling_one_graph_compile_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """ANE-11 under threads: two threads that lower the same graph at once share one compile (a slow
    compile widens the window in which both would otherwise find the cache empty)."""
    import threading
    import time

    calls = []
    real = orion.compile
    monkeypatch.setattr(orion, "compile", lambda *a, **k: calls.append(1) or time.sleep(0.2) or real(*a, **k))
    monkeypatch.setattr(orion.compiler, "_PROGRAMS", {})
    lowered = lower_graph(block(0.07)[0])
    barrier, results = threading.Barrier(2), []

    def job() -> None:
        barrier.wait()
        results.append(compile_lowered(lowered))

    threads = [threading.Thread(target=job) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and results[0].program is results[1].program


def test_hash_changes_with_weights() -> None:
    """ANE-24: the content hash covers every weight byte."""
    assert lower_graph(block(0.1)[0]).content_hash != lower_graph(block(0.2)[0]).content_hash


def test_padding_layout_is_packed() -> None:
    """ANE-21: small I/O is packed at the front of its padded surface."""
    g = Graph("decode")
    g.output(g.relu(g.input("x", [1, 64, 1, 1])), "y")
    compiled = CompiledGraph(lower_graph(g), program=None)
    spec = compiled.layout.inputs[0]
    assert spec.shape == (1, 64, 1, 1) and spec.padded == (1, 384, 1, 64)
    x = np.arange(64, dtype=np.float32).reshape(1, 64, 1, 1)
    packed = compiled.pack_inputs({"x": x})["in_00_x"]
    assert packed.flags.c_contiguous and packed.dtype == np.float16 and packed.shape == spec.padded
    flat = packed.reshape(-1)
    assert np.all(flat[:64] == np.arange(64)) and np.count_nonzero(flat) == 63  # (c, 0) packed at the front
    out = compiled.unpack_outputs({"out_00_y": packed})
    np.testing.assert_array_equal(out["y"], x)
    with pytest.raises(EvaluateError, match="expected"):
        compiled.pack_inputs({"x": np.zeros((1, 64, 1, 2))})
    with pytest.raises(EvaluateError, match="missing"):
        compiled.pack_inputs({})


def test_verbose_prints_report(capsys: pytest.CaptureFixture[str]) -> None:
    g = Graph("v")
    g.output(g.identity(g.relu(g.input("x", [1, 64, 1, 32]))), "y")
    compile_graph(g, verbose=True)
    out = capsys.readouterr().out
    assert "identity elimination" in out and "fixed point: True" in out and "SRAM" in out


def test_docs_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    from orion.graph import Graph

    text = (Path(__file__).resolve().parents[2] / "docs" / "compiler.md").read_text()
    snippet = text.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.setattr(orion, "Graph", getattr(orion, "Graph", Graph), raising=False)  # until exported
    monkeypatch.setattr(orion, "compile_graph", getattr(orion, "compile_graph", compile_graph), raising=False)
    exec(compile(snippet, "docs/compiler.md", "exec"), {})  # noqa: S102
