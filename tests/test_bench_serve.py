"""benchmarks/bench_serve.py's summary of the serve section: medians over repeated levels, each count over the
server's own one-client figure and over llama-server's at as many clients (the figures are given, no server runs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_serve.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_serve_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_scaling_takes_medians_of_repeated_levels_and_divides_by_one_client_and_by_the_peer(bench):
    rows = [("orion-batched", 1, 80.0), ("llama-server", 1, 90.0), ("orion-batched", 8, 240.0), ("llama-server", 8, 150.0),
            ("orion-batched", 1, 100.0), ("llama-server", 1, 96.0), ("orion-batched", 8, 300.0), ("llama-server", 8, 210.0),
            ("orion-batched", 1, 70.0), ("orion-batched", 8, 330.0), ("orion-turns", 8, 85.0)]
    levels = [{"server": s, "clients": n, "tok_s": r} for s, n, r in rows]
    got = bench.scaling(levels)
    assert got["median_tok_s"]["orion-batched"] == {1: 80.0, 8: 300.0}
    assert got["median_tok_s"]["llama-server"] == {1: 93.0, 8: 180.0}
    assert got["over_one_client"] == {"orion-batched": {8: 3.75}, "llama-server": {8: 1.94}}  # no 1-client turns level
    assert got["over_llama_server"] == {"orion-batched": {1: 0.86, 8: 1.67}, "orion-turns": {8: 0.47}}
    rendered = bench.render({"backend": "emulator", "model": "m", "serve": {
        "slots": 8, "prompt_tokens": 16, "new_tokens": 32, "requests_per_client": 2, "threads": 2,
        "levels": [dict(level, requests=2, tokens=64, ttft_p50_ms=1.0, ttft_p99_ms=2.0, token_gap_p50_ms=1.0,
                        token_gap_p99_ms=2.0, load_average=0.5) for level in levels],
        "scaling": got, "notes": []}})
    assert "orion-batched 8: 3.75x" in rendered and "orion-turns 8: 0.47x" in rendered
