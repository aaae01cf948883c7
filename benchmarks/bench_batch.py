"""Aggregate decode throughput of batched lanes against turn-taking, on one model (emulator or ANE).

For each concurrency ``k``, ``k`` sequences (random prompts of ``--prompt-tokens``) generate
``--new-tokens`` greedy tokens each:

- ``batched``: through one :class:`orion.generation.batch.Batch` over the lanes of
  ``model.with_lanes(max(k))``: one decode step advances every sequence;
- ``turns``: as the server's former scheduler did, ``k`` forks of the single-lane model stepped in turn,
  one token each.

Aggregate tok/s = all new tokens / wall time from the first submit to the last token (prompts and their
prefill included). Runs alternate between the modes and repeat (``--repeats``); the load average is printed
with each row, since the machine may be shared.

    python benchmarks/bench_batch.py [--shape gpt2] [--sequences 1 8] [--new-tokens 64] [--repeats 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from orion import models
from orion.generation.batch import Batch
from orion.generation.loop import CausalLM


def batched(model: CausalLM, prompts: list[list[int]], new_tokens: int) -> float:
    batch = Batch(model)
    start = time.perf_counter()
    runs = [batch.submit(p, new_tokens, temperature=0, ignore_eos=True) for p in prompts]
    batch.run()
    assert all(len(r.token_ids) == new_tokens for r in runs)
    return new_tokens * len(prompts) / (time.perf_counter() - start)


def turns(model: CausalLM, prompts: list[list[int]], new_tokens: int) -> float:
    forks = [model] + [model.fork() for _ in prompts[1:]]
    start = time.perf_counter()
    gens = [f.generate(p, new_tokens, temperature=0, ignore_eos=True) for f, p in zip(forks, prompts)]
    made = 0
    while gens:
        for g in list(gens):
            try:
                next(g)
                made += 1
            except StopIteration:
                gens.remove(g)
    return made / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="gpt2", choices=models.shape_names())
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    model = models.random(args.shape, seed=0, progress=False)
    lanes = model.with_lanes(max(args.sequences))
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(0, model.dims.vocab_size, args.prompt_tokens)]
               for _ in range(max(args.sequences))]
    for m in (model, lanes):  # compile every bucket and prompt program outside the timings
        m.prepare(args.prompt_tokens + args.new_tokens)
    batched(lanes, prompts[:1], 2)
    turns(model, prompts[:1], 2)
    rows = []
    for repeat in range(args.repeats):
        for k in args.sequences:
            for mode, run in (("batched", batched), ("turns", turns)):
                rate = run(lanes if mode == "batched" else model, prompts[:k], args.new_tokens)
                row = {"repeat": repeat, "sequences": k, "mode": mode, "aggregate_tok_s": round(rate, 2),
                       "load_average": round(os.getloadavg()[0], 2)}
                rows.append(row)
                print(json.dumps(row) if args.json else
                      f"{mode:8s} {k:2d} sequences  {rate:7.1f} tok/s aggregate  (load {row['load_average']})",
                      flush=True)


if __name__ == "__main__":
    main()
