"""LoRA adapters on Orion: adapter-switch latency, and decode tok/s with and without an adapter.

One GPT-2 model (random GPT-2 init, ``GPT2.random(config, seed)``) loads ``--adapters`` random adapters of
rank ``--rank`` on ``--targets`` (PEFT names; default ``c_attn``, i.e. q, k and v). Switch latency is the
mean of ``--switches`` ``set_adapter`` calls cycling through them (with the ``orion.compile_count()`` delta
over them, which should be 0). Decode runs greedy from the same prompt, base and adapter rounds interleaved (``--rounds`` of each),
so a load change on the shared machine hits both; tok/s counts the tokens after the first one.

    python benchmarks/bench_lora.py [--config 124m|tiny] [--rank 16] [--targets c_attn] [--adapters 3]
                                    [--switches 100] [--new-tokens 32] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

import orion
from orion.lora import LoraAdapter
from orion.lora.hot_swap import targeted_modules
from orion.models import GPT2, GPT2Config

CONFIGS = {
    "124m": GPT2Config(),
    "tiny": GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=256),  # smoke runs
}


def random_adapter(model: GPT2, rank: int, targets: list[str], seed: int) -> LoraAdapter:
    """Random A and B (GPT-2-init scale) on every module ``targets`` selects."""
    rng = np.random.default_rng(seed)
    placements = model.lora_placements()
    modules = {p: (rng.normal(0, 0.02, (rank, placements[p].in_features)).astype(np.float32),
                   rng.normal(0, 0.02, (placements[p].out_features, rank)).astype(np.float32))
               for p in sorted(targeted_modules(targets, placements, "--targets"))}
    return LoraAdapter(rank, 2.0 * rank, modules)


def decode_tok_s(model: GPT2, prompt: list[int], new_tokens: int) -> float:
    """Greedy decode tok/s after the first new token (prefill not timed)."""
    tokens = model.generate(prompt, new_tokens)
    next(tokens)
    start = time.perf_counter()
    produced = sum(1 for _ in tokens)
    return produced / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="124m")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--targets", default="c_attn", help="comma-separated PEFT target_modules")
    parser.add_argument("--adapters", type=int, default=3)
    parser.add_argument("--switches", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    config = CONFIGS[args.config]
    start = time.perf_counter()
    model = GPT2.random(config, progress=False)
    base_compile_s = time.perf_counter() - start
    targets = args.targets.split(",")
    start = time.perf_counter()
    names = [model.add_adapter(random_adapter(model, args.rank, targets, seed=k), f"a{k}") for k in range(args.adapters)]
    load_s = time.perf_counter() - start
    prompt = [int(i) for i in np.random.default_rng(0).integers(0, config.vocab_size, 16)]
    for name in [*names, None]:  # warm-up: each variant's prefill bucket compiled once
        model.set_adapter(name)
        model.prefill(prompt)

    compiles = orion.compile_count()
    start = time.perf_counter()
    for k in range(args.switches):
        model.set_adapter(names[k % len(names)])
    switch_us = (time.perf_counter() - start) / args.switches * 1e6
    switch_compiles = orion.compile_count() - compiles

    rates: dict[str, list[float]] = {"base": [], "adapter": []}
    for _ in range(args.rounds):
        for label, name in (("base", None), ("adapter", names[0])):
            model.set_adapter(name)
            rates[label].append(decode_tok_s(model, prompt, args.new_tokens))
    result = {
        "backend": orion.backend(), "config": args.config, "rank": args.rank, "targets": targets,
        "adapters": args.adapters, "base_compile_s": round(base_compile_s, 2), "adapter_load_s": round(load_s, 2),
        "switch_us": round(switch_us, 1), "switches": args.switches, "compiles_during_switches": switch_compiles,
        "decode_tok_s_base": round(statistics.median(rates["base"]), 1),
        "decode_tok_s_adapter": round(statistics.median(rates["adapter"]), 1),
        "load_average": round(os.getloadavg()[0], 2),
    }
    result["adapter_over_base"] = round(result["decode_tok_s_adapter"] / result["decode_tok_s_base"], 3)
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:>26}: {value}")


if __name__ == "__main__":
    main()
