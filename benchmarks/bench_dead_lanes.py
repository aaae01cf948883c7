"""What dead lanes cost: one sequence decoding on 8-lane programs (``CausalLM.with_lanes(8)``, one live
lane, the live-lanes hint declaring the rest dead) against the same sequence on 1-lane programs.

Random weights at a published shape (``--shape smollm2``: SmolLM2-135M, 30 layers, width 576, GQA 9/3
heads; ``stories110m``; ``tiny`` for smoke runs). Both models prefill the same prompt, then time
``--steps`` decode steps each, in interleaved passes (1 lane, 8 lanes, 1 lane, ...) so that a change of
machine load hits both; the report gives the median ms per step of each and their ratio (the target:
close to 1.0), the greedy tokens' agreement and the load average before and after.

    python benchmarks/bench_dead_lanes.py [--shape smollm2] [--lanes 8] [--prompt-tokens 48] [--steps 24]
                                          [--passes 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

if __name__ == "__main__":  # the emulator reads its thread count once, at first use
    os.environ.setdefault("ORION_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from orion import models  # noqa: E402
from orion.models import LlamaConfig  # noqa: E402
from orion.models.llama.weights import random_weights, save_hf  # noqa: E402

SHAPES = {
    "smollm2": LlamaConfig(dim=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, hidden_dim=1536,
                           vocab_size=49152, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=100000.0,
                           rope_convention="half", tie_embeddings=True),
    "stories110m": LlamaConfig.stories110m(),
    "tiny": LlamaConfig(dim=128, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=256,
                        max_position_embeddings=128, rope_convention="half", tie_embeddings=True),
}


def steps(model: Any, prompt: list[int], count: int) -> tuple[list[int], float]:
    """Greedy tokens after ``prompt`` and the median seconds of a decode step."""
    logits = model.prefill(prompt)
    tokens, times = [], []
    for _ in range(count):
        tokens.append(int(np.argmax(logits)))
        start = time.perf_counter()
        logits = model.decode_step(tokens[-1])
        times.append(time.perf_counter() - start)
    return tokens, float(np.median(times))


def run(shape: str = "smollm2", lanes: int = 8, prompt_tokens: int = 48, step_count: int = 24, passes: int = 5,
        seed: int = 0) -> dict[str, Any]:
    """The whole benchmark as one JSON-ready dict."""
    config = SHAPES[shape]
    load_before = os.getloadavg()
    prompt = np.random.default_rng(seed).integers(0, config.vocab_size, prompt_tokens).tolist()
    with tempfile.TemporaryDirectory(prefix="orion-bench-lanes-") as directory:
        save_hf(directory, config, random_weights(config, seed))
        one = models.load(directory, progress=False)
    many = one.with_lanes(lanes)
    steps(one, prompt, 2), steps(many, prompt, 2)  # warm-ups: prefill buckets, first decode
    one_ms, many_ms, agree = [], [], True
    for _ in range(passes):
        t1, s1 = steps(one, prompt, step_count)
        tn, sn = steps(many, prompt, step_count)
        one_ms.append(1e3 * s1), many_ms.append(1e3 * sn)
        agree = agree and t1 == tn
    m1, mn = float(np.median(one_ms)), float(np.median(many_ms))
    return {"shape": shape, "lanes": lanes, "prompt_tokens": prompt_tokens, "steps": step_count, "passes": passes,
            "threads": os.environ.get("ORION_NUM_THREADS"), "one_lane_ms": one_ms, "many_lanes_ms": many_ms,
            "one_lane_median_ms": m1, "many_lanes_median_ms": mn, "ratio": mn / m1, "tokens_agree": agree,
            "load_average_before": load_before, "load_average_after": os.getloadavg()}


def report(r: dict[str, Any]) -> str:
    """Human-readable summary of ``run``'s result."""
    pairs = ", ".join(f"{a:.1f}/{b:.1f}" for a, b in zip(r["one_lane_ms"], r["many_lanes_ms"], strict=True))
    return "\n".join([
        f"{r['shape']}: one sequence decoding, {r['prompt_tokens']}-token prompt, {r['steps']} steps x "
        f"{r['passes']} interleaved passes, ORION_NUM_THREADS={r['threads']}",
        f"  1-lane programs   {r['one_lane_median_ms']:7.2f} ms/step (median of passes)",
        f"  {r['lanes']}-lane programs   {r['many_lanes_median_ms']:7.2f} ms/step, one live lane: "
        f"{r['ratio']:.2f}x the 1-lane step",
        f"  per pass (1-lane/{r['lanes']}-lane ms): {pairs}; greedy tokens agree: {r['tokens_agree']}",
        f"  load average before {' '.join(f'{x:.2f}' for x in r['load_average_before'])}, after "
        f"{' '.join(f'{x:.2f}' for x in r['load_average_after'])}",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    a = parser.parse_args()
    r = run(a.shape, a.lanes, a.prompt_tokens, a.steps, a.passes)
    print(json.dumps(r, indent=2) if a.json else report(r))


if __name__ == "__main__":
    main()
