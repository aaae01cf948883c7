"""Decode benchmark of any registered model: compile times (cold or warm, and a new process reading
the program cache), prefill time, decode tok/s and ms/token percentiles, ANE dispatches and bytes
moved per token.

By default the programs go to a temporary cache that is removed afterwards, so every run is a cold
start and nothing is left in your program cache. ``--cache DIR`` keeps them in DIR: the first run
there is cold, later runs are warm starts and the report says so. A random shape is written as a
checkpoint (fp16 safetensors) first, which both processes load, as a user's would be."""

from __future__ import annotations

import argparse
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
from orion import models, program_cache, quant
from orion.cli import HelpFormatter, positive_int, report_errors
from orion.errors import OrionError
from orion.generation.loop import CausalLM
from orion.runtime import profile

DEFAULT_SHAPE = "gpt2"


class BenchError(OrionError):
    """The benchmark's settings do not fit the model."""


def measure_decode(model: CausalLM, prompt: list[int], new_tokens: int) -> dict[str, Any]:
    """Greedy-generates ``new_tokens`` after ``prompt``, timing the compiles ahead of the generation (the KV
    buckets it reaches, as ``generate`` does before its first decode step), the prefill and every decode step."""
    start = time.perf_counter()
    model.prepare(len(prompt) + new_tokens)
    prepare_s = time.perf_counter() - start
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
        "prepare_ms": prepare_s * 1e3,
        "prefill_ms": prefill_s * 1e3,
        "decode_tok_s": len(steps) / (ms.sum() / 1e3) if len(steps) else float("nan"),
        "generation_tok_s": new_tokens / (prepare_s + prefill_s + ms.sum() / 1e3),
        "ms_per_token_p50": float(np.percentile(ms, 50)) if len(steps) else float("nan"),
        "ms_per_token_p90": float(np.percentile(ms, 90)) if len(steps) else float("nan"),
        "tokens": tokens,
    }


def _cached_start(model_dir: str, cache: str, quant_options: dict[str, Any]) -> tuple[float, float, int]:
    """Seconds to load the checkpoint in a fresh process whose program cache is already filled, that process's
    peak RSS (MiB; NaN where /proc is absent) and the programs it built rather than read: what a user's second
    start costs (a BF16 or GGUF checkpoint maps its converted copy then)."""
    code = ("import json, sys, time; from orion import models; from orion.bench.decode import peak_rss_mib; "
            "t = time.perf_counter(); m = models.load(sys.argv[1], progress=False, **json.loads(sys.argv[2])); "
            "print(time.perf_counter() - t, peak_rss_mib(), m.builder.built)")
    env = {**os.environ, "ORION_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, "-c", code, model_dir, json.dumps(quant_options)], env=env,
                         capture_output=True, text=True, check=True)
    seconds, rss, built = out.stdout.strip().splitlines()[-1].split()
    return float(seconds), float(rss), int(built)


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM) in MiB, or NaN without /proc."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return float("nan")


def _check_context(context: int | None, prompt_tokens: int, new_tokens: int) -> None:
    if context is not None and prompt_tokens + new_tokens > context:
        raise BenchError(f"--prompt-tokens {prompt_tokens} + --new-tokens {new_tokens} exceed the model's "
                         f"context length {context}; ask for fewer tokens")


def run(model_dir: str | None = None, prompt_tokens: int = 16, new_tokens: int = 128,
        fusion_depth: int | None = None, lm_head: str = "ane", shape: str = DEFAULT_SHAPE,
        cache: str | None = None, progress: bool = True, quant_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole benchmark; returns every figure (see ``report``). ``shape``: the registered random
    shape used without ``model_dir``; ``cache``: the program cache to use (None: a temporary one);
    ``quant_options``: the model's ``quant``/``profile``/``probe_report`` (``orion.quant.model_options``)."""
    quant_options = quant_options or {}
    options = dict(fusion_depth=fusion_depth, lm_head=lm_head, progress=progress, **quant_options)
    _check_context(models.context_length(model_dir or shape), prompt_tokens, new_tokens)
    random_shape = not model_dir
    with tempfile.TemporaryDirectory(prefix="orion-bench-cache-") as temporary:
        where = cache or temporary
        if random_shape:  # a checkpoint of the shape's random weights: both processes load it as a user would
            model_dir = str(models.save_random(shape, Path(temporary) / "random-checkpoint"))
        previous = os.environ.get("ORION_CACHE_DIR")
        os.environ["ORION_CACHE_DIR"] = where
        try:
            start = time.perf_counter()
            model = models.load(model_dir, **options)
            start_s = time.perf_counter() - start
            _check_context(model.dims.context, prompt_tokens, new_tokens)
            prompt = [int(t) for t in np.random.default_rng(0).integers(0, model.dims.vocab_size, prompt_tokens)]
            result = measure_decode(model, prompt, new_tokens)  # compiles the prompt's bucket into the cache
        finally:
            program_cache.flush()  # the writer thread's files land in this cache, before it may be removed
            if previous is None:
                os.environ.pop("ORION_CACHE_DIR")
            else:
                os.environ["ORION_CACHE_DIR"] = previous
        loaded, total = model.builder.cached, model.builder.cached + model.builder.built
        cached_s, cached_rss, cached_built = (_cached_start(model_dir, where, quant_options) if fusion_depth is None
                                              and lm_head == "ane" else (float("nan"), float("nan"), -1))
    plan = model.decode_plan
    return {
        "backend": orion.backend(),
        "model": f"random {shape} ({model.display_name})" if random_shape else str(model_dir),
        "parameters": model.dims.parameters,
        "quant": model.quant,
        "config": model.builder.identity["config"],
        "start": "warm" if total and loaded == total else "partly warm" if loaded else "cold",
        "compile_s": start_s,
        "compile_cached_s": cached_s,
        "cached_start_peak_rss_mib": cached_rss,
        "cached_start_built": cached_built,
        "programs": total,
        "programs_from_cache": loaded,
        "cache": cache or "temporary (removed afterwards)",
        "compiles": orion.compile_count(),
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        **result,
        "dispatches_per_token": plan.dispatches_per_token,
        "fusion_depth": plan.fusion_depth,
        "lm_head": plan.options.lm_head,
        "bytes_per_token": sum(p.bytes_per_token for p in plan.programs),
        "decode_programs": [{"name": p.name, "flops_per_token": p.flops_per_token,
                             "bytes_per_token": p.bytes_per_token} for p in plan.programs],
    }


def report(r: dict[str, Any]) -> str:
    lines = [
        f"backend            {r['backend']}",
        f"model              {r['model']} ({r['parameters'] / 1e6:.1f}M parameters, {r['quant']} weights)",
        f"start              {r['start']}: {r['compile_s']:.2f} s to build the model, {r['programs_from_cache']} of "
        f"{r['programs']} programs loaded from the cache ({r['cache']})",
        f"compile            a new process reading that cache: {r['compile_cached_s']:.2f} s, peak RSS "
        f"{r['cached_start_peak_rss_mib']:.0f} MiB, {r['cached_start_built']} programs built; {r['compiles']} "
        f"compiles in this process",
        f"prefill            {r['prefill_ms']:.1f} ms for {r['prompt_tokens']} tokens",
        f"decode             {r['decode_tok_s']:.1f} tok/s over every step; ms/token p50 {r['ms_per_token_p50']:.2f}, "
        f"p90 {r['ms_per_token_p90']:.2f} ({r['new_tokens']} new tokens, greedy)",
        f"as a user sees it  {r['generation_tok_s']:.1f} tok/s from the call to the last token: {r['prepare_ms']:.0f} ms "
        f"compiling the KV buckets the generation reaches first, then prefill and decode",
        f"dispatches/token   {r['dispatches_per_token']} (fusion depth {r['fusion_depth']}, LM head on {r['lm_head']})",
        f"bytes/token        {r['bytes_per_token'] / 1e6:.1f} MB ({r['quant']} weight matrices + surfaces, "
        f"full-context KV cache)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.profile:
        profile.enable_with_report()
    if args.model in models.shape_names() and not Path(args.model).exists():
        args.model, args.random = None, args.model
    elif args.model and not Path(args.model).exists():
        parser.error(f"--model {args.model}: no such directory or file, and not a random shape "
                     f"({', '.join(models.shape_names())})")
    options = quant.model_options(args.quant, args.probe_report, _note, imatrix=args.imatrix)
    return report_errors(lambda: _print(run(args.model, args.prompt_tokens, args.new_tokens, args.fusion_depth,
                                            args.lm_head, args.random, args.cache, not args.quiet, options), args.json))


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m orion.bench decode``."""
    parser.add_argument("--model", default=None, help="a Hugging Face model directory, a llama2.c .bin file, or "
                                                      f"the name of a random shape ({', '.join(models.shape_names())}; "
                                                      "default: random weights of --random)")
    parser.add_argument("--random", default=DEFAULT_SHAPE, choices=models.shape_names(),
                        help="the registered random shape to run without --model")
    parser.add_argument("--prompt-tokens", type=positive_int, default=16, help="prompt length (random token ids)")
    parser.add_argument("--new-tokens", type=positive_int, default=128, help="tokens to decode (greedy)")
    parser.add_argument("--fusion-depth", type=positive_int, default=None,
                        help="layers per decode program (None: the most that fit the SRAM)")
    parser.add_argument("--lm-head", choices=("ane", "cpu"), default="ane", help="where the LM head runs")
    parser.add_argument("--cache", default=None, metavar="DIR",
                        help="program cache to use and keep (None: a temporary one, removed afterwards, so the "
                             "start is cold and your cache is untouched)")
    quant.add_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--profile", action="store_true",
                        help="print the emulator's per-program, per-op profile at exit (as ORION_PROFILE=1)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m orion.bench decode", description=__doc__,
                                     formatter_class=HelpFormatter)
    add_arguments(parser)
    return parser


def _print(result: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print(json.dumps({k: v for k, v in result.items() if k != "tokens"}))
    else:
        print(report(result))
    return 0
