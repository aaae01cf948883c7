"""Decode benchmark of any registered model: compile times (cold and cached), prefill time, decode
tok/s and ms/token percentiles, ANE dispatches and bytes moved per token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import orion
from orion import models
from orion.errors import OrionError
from orion.cli import positive_int, report_errors
from orion.generation.loop import CausalLM
from orion.runtime import profile

DEFAULT_SHAPE = "gpt2"


class BenchError(OrionError):
    """The benchmark's settings do not fit the model."""


def load_model(model_dir: str | None, shape: str = DEFAULT_SHAPE, **options: Any) -> CausalLM:
    """The model in a Hugging Face directory, or registered random ``shape`` with deterministic weights."""
    if model_dir:
        return models.load(model_dir, **options)
    return models.random(shape, seed=0, **options)


def measure_decode(model: CausalLM, prompt: list[int], new_tokens: int) -> dict[str, Any]:
    """Greedy-generates ``new_tokens`` after ``prompt``, timing the prefill and every decode step."""
    model.prefill(prompt)  # compiles the prefill bucket outside the timings
    start = time.perf_counter()
    logits = model.prefill(prompt)
    prefill_s = time.perf_counter() - start
    tokens, steps = [int(np.argmax(logits))], []
    for _ in range(new_tokens - 1):
        start = time.perf_counter()
        logits = model.decode_step(tokens[-1])
        steps.append(time.perf_counter() - start)
        tokens.append(int(np.argmax(logits)))
    ms = np.array(steps) * 1e3
    return {
        "prefill_ms": prefill_s * 1e3,
        "decode_tok_s": len(steps) / (ms.sum() / 1e3) if len(steps) else float("nan"),
        "ms_per_token_p50": float(np.percentile(ms, 50)) if len(steps) else float("nan"),
        "ms_per_token_p90": float(np.percentile(ms, 90)) if len(steps) else float("nan"),
        "tokens": tokens,
    }


def _cached_start(model_dir: str | None, shape: str, cache: str) -> float:
    """Seconds to build the model in a fresh process whose program cache is already filled."""
    code = ("import sys, time; from orion.bench.decode import load_model; t = time.perf_counter(); "
            "load_model(sys.argv[1] or None, sys.argv[2], progress=False); print(time.perf_counter() - t)")
    env = {**os.environ, "ORION_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, "-c", code, model_dir or "", shape], env=env, capture_output=True,
                         text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def run(model_dir: str | None = None, prompt_tokens: int = 16, new_tokens: int = 128,
        fusion_depth: int | None = None, lm_head: str = "ane", shape: str = DEFAULT_SHAPE) -> dict[str, Any]:
    """The whole benchmark; returns every figure (see ``report``). ``shape``: the registered random
    shape used without ``model_dir``."""
    options = dict(fusion_depth=fusion_depth, lm_head=lm_head)
    with tempfile.TemporaryDirectory(prefix="orion-bench-cache-") as cache:
        previous = os.environ.get("ORION_CACHE_DIR")
        os.environ["ORION_CACHE_DIR"] = cache  # a cold start: nothing lowered yet
        try:
            start = time.perf_counter()
            model = load_model(model_dir, shape, **options)
            cold_s = time.perf_counter() - start
        finally:
            if previous is None:
                os.environ.pop("ORION_CACHE_DIR")
            else:
                os.environ["ORION_CACHE_DIR"] = previous
        cached_s = _cached_start(model_dir, shape, cache) if fusion_depth is None and lm_head == "ane" else float("nan")
    config = model.config
    if prompt_tokens + new_tokens > model.dims.context:
        raise BenchError(f"--prompt-tokens {prompt_tokens} + --new-tokens {new_tokens} exceed the model's context "
                         f"length {model.dims.context}; ask for fewer tokens")
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, model.dims.vocab_size, prompt_tokens)]
    result = measure_decode(model, prompt, new_tokens)
    plan = model.decode_plan
    return {
        "backend": orion.backend(),
        "model": str(model_dir or f"random {shape} ({model.display_name})"),
        "parameters": model.dims.parameters,
        "config": config.to_hf_json(),
        "compile_cold_s": cold_s,
        "compile_cached_s": cached_s,
        "compiles": orion.compile_count(),
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        **result,
        "dispatches_per_token": plan.dispatches_per_token,
        "fusion_depth": plan.fusion_depth,
        "lm_head": plan.options.lm_head,
        "bytes_per_token": sum(p.bytes_per_token for p in plan.programs),
        "programs": [{"name": p.name, "flops_per_token": p.flops_per_token, "bytes_per_token": p.bytes_per_token}
                     for p in plan.programs],
    }


def report(r: dict[str, Any]) -> str:
    lines = [
        f"backend            {r['backend']}",
        f"model              {r['model']} ({r['parameters'] / 1e6:.1f}M parameters)",
        f"compile            cold {r['compile_cold_s']:.2f} s, cached {r['compile_cached_s']:.2f} s "
        f"(a new process reading the program cache); {r['compiles']} compiles in this process",
        f"prefill            {r['prefill_ms']:.1f} ms for {r['prompt_tokens']} tokens",
        f"decode             {r['decode_tok_s']:.1f} tok/s; ms/token p50 {r['ms_per_token_p50']:.2f}, "
        f"p90 {r['ms_per_token_p90']:.2f} ({r['new_tokens']} new tokens, greedy)",
        f"dispatches/token   {r['dispatches_per_token']} (fusion depth {r['fusion_depth']}, LM head on {r['lm_head']})",
        f"bytes/token        {r['bytes_per_token'] / 1e6:.1f} MB (fp16 weights + surfaces, full-context KV cache)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m orion.bench decode", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a Hugging Face model directory (default: random weights of --random)")
    parser.add_argument("--random", default=DEFAULT_SHAPE, choices=models.shape_names(),
                        help=f"the registered random shape to run without --model (default {DEFAULT_SHAPE})")
    parser.add_argument("--prompt-tokens", type=positive_int, default=16)
    parser.add_argument("--new-tokens", type=positive_int, default=128)
    parser.add_argument("--fusion-depth", type=positive_int, default=None,
                        help="layers per decode program (default: SRAM-sized)")
    parser.add_argument("--lm-head", choices=("ane", "cpu"), default="ane")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--profile", action="store_true",
                        help="print the emulator's per-program, per-op profile at exit (as ORION_PROFILE=1)")
    args = parser.parse_args(argv)
    if args.profile:
        profile.enable_with_report()
    if args.model and not Path(args.model).is_dir():
        parser.error(f"--model {args.model}: not a directory")
    return report_errors(lambda: _print(run(args.model, args.prompt_tokens, args.new_tokens, args.fusion_depth,
                                            args.lm_head, args.random), args.json))


def _print(result: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print(json.dumps({k: v for k, v in result.items() if k != "tokens"}))
    else:
        print(report(result))
    return 0
