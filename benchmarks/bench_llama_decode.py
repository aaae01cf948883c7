"""Llama decode speed (Stories110M shape): Orion against transformers ``LlamaForCausalLM`` (PyTorch fp32, CPU).

One Hugging Face directory is saved from deterministic random weights of the shape and loaded by both
(``orion.models.load`` and ``LlamaForCausalLM.from_pretrained``), so both run the same weights on the
same random prompt, greedy. Both sides use 2 threads (``ORION_NUM_THREADS``, ``torch.set_num_threads``)
and are warmed up, then timed in interleaved passes (Orion, transformers, Orion, ...) so that a change
of machine load hits both; each pass's decode tok/s counts the tokens after the first. The report gives
the median tok/s of each side, their ratio, Orion's dispatches and bytes moved per token (from its
decode plan) and the load average before and after: on a shared machine compare runs at low load.

    python benchmarks/bench_llama_decode.py [--shape stories110m|tiny] [--prompt-tokens 16]
                                            [--new-tokens 64] [--passes 3] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

THREADS_DEFAULT = 2
if __name__ == "__main__":  # the emulator reads its thread count once, at first use
    os.environ.setdefault("ORION_NUM_THREADS", str(THREADS_DEFAULT))

import numpy as np  # noqa: E402
from bench_decode import _Timestamps, agreeing_prefix, rate, timed_tokens  # noqa: E402

from orion import backend, models  # noqa: E402
from orion.models import LlamaConfig  # noqa: E402
from orion.models.llama.weights import random_weights, save_hf  # noqa: E402

SHAPES = {
    "stories110m": LlamaConfig.stories110m(),
    "tiny": LlamaConfig(dim=128, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=256,
                        max_position_embeddings=128, rope_convention="interleaved", tie_embeddings=True),  # smoke runs
}


def orion_pass(model: Any, prompt: list[int], new_tokens: int) -> dict[str, Any]:
    tokens, prefill, decode = timed_tokens(model.generate(prompt, max_new_tokens=new_tokens, ignore_eos=True))
    return {"tokens": tokens, "prefill_ms": 1e3 * prefill, "decode_tok_per_s": rate(tokens, decode)}


def hf_pass(torch: Any, model: Any, prompt: list[int], new_tokens: int) -> dict[str, Any]:
    stamps = _Timestamps()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             use_cache=True, pad_token_id=0, streamer=stamps)
    tokens = out[0, len(prompt):].tolist()
    first, end = stamps.times[1], stamps.times[-1]  # times[0]: the prompt itself
    return {"tokens": tokens, "prefill_ms": 1e3 * (first - stamps.times[0]),
            "decode_tok_per_s": rate(tokens, end - first)}


def run(shape: str = "stories110m", prompt_tokens: int = 16, new_tokens: int = 64, passes: int = 3,
        threads: int = THREADS_DEFAULT, seed: int = 0) -> dict[str, Any]:
    """The whole benchmark as one JSON-ready dict."""
    import torch
    import transformers

    config = SHAPES[shape]
    if prompt_tokens < 1 or new_tokens < 2 or prompt_tokens + new_tokens > config.max_position_embeddings:
        raise ValueError(f"need prompt tokens >= 1, new tokens >= 2 and their sum <= the context "
                         f"({config.max_position_embeddings}); got {prompt_tokens} + {new_tokens}")
    torch.set_num_threads(threads)
    transformers.utils.logging.disable_progress_bar()
    load_before = os.getloadavg()
    prompt = np.random.default_rng(seed).integers(0, config.vocab_size, prompt_tokens).tolist()
    with tempfile.TemporaryDirectory(prefix="orion-bench-llama-") as directory:
        save_hf(directory, config, random_weights(config, seed))
        orion_model = models.load(directory, progress=False)
        hf_model = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    orion_pass(orion_model, prompt, 4)  # warm-ups: Orion compiles its prefill bucket, PyTorch its kernels
    hf_pass(torch, hf_model, prompt, 4)
    orion_runs, hf_runs = [], []
    for _ in range(passes):
        orion_runs.append(orion_pass(orion_model, prompt, new_tokens))
        hf_runs.append(hf_pass(torch, hf_model, prompt, new_tokens))
    plan = orion_model.decode_plan
    orion_tok_s = float(np.median([r["decode_tok_per_s"] for r in orion_runs]))
    hf_tok_s = float(np.median([r["decode_tok_per_s"] for r in hf_runs]))
    return {
        "shape": shape, "params": config.param_count(), "backend": backend(), "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens, "passes": passes, "threads": threads,
        "orion_num_threads": os.environ.get("ORION_NUM_THREADS"),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "orion_decode_tok_per_s": [r["decode_tok_per_s"] for r in orion_runs],
        "hf_decode_tok_per_s": [r["decode_tok_per_s"] for r in hf_runs],
        "orion_median_tok_per_s": orion_tok_s, "hf_median_tok_per_s": hf_tok_s, "orion_over_hf": orion_tok_s / hf_tok_s,
        "orion_prefill_ms": orion_runs[-1]["prefill_ms"], "hf_prefill_ms": hf_runs[-1]["prefill_ms"],
        "tokens_agreeing": agreeing_prefix(orion_runs[-1]["tokens"], hf_runs[-1]["tokens"]),
        "dispatches_per_token": plan.dispatches_per_token, "fusion_depth": plan.fusion_depth,
        "lm_head_chunks": len(plan.head_programs),
        "bytes_per_token": sum(p.bytes_per_token for p in plan.programs),
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
    }


def report(r: dict[str, Any]) -> str:
    """Human-readable summary of ``run``'s result."""
    each = ", ".join(f"{o:.1f}/{h:.1f}" for o, h in zip(r["orion_decode_tok_per_s"], r["hf_decode_tok_per_s"],
                                                            strict=True))
    return "\n".join([
        f"Llama {r['shape']} ({r['params'] / 1e6:.1f}M params), greedy decode, {r['prompt_tokens']}-token prompt, "
        f"{r['new_tokens']} new tokens, {r['passes']} interleaved passes, {r['threads']} threads each",
        f"  Orion ({r['backend']})                     {r['orion_median_tok_per_s']:8.1f} tok/s decode (median)   "
        f"prefill {r['orion_prefill_ms']:7.1f} ms",
        f"  transformers LlamaForCausalLM fp32  {r['hf_median_tok_per_s']:8.1f} tok/s decode (median)   "
        f"prefill {r['hf_prefill_ms']:7.1f} ms",
        f"  per pass (Orion/transformers tok/s): {each}",
        f"  Orion / transformers: {r['orion_over_hf']:.2f}x; first {r['tokens_agreeing']}/{r['new_tokens']} "
        f"generated tokens agree",
        f"  Orion dispatches/token {r['dispatches_per_token']} (fusion depth {r['fusion_depth']}, LM head in "
        f"{r['lm_head_chunks']} vocabulary chunks); bytes/token {r['bytes_per_token'] / 1e6:.1f} MB "
        f"(fp16 weights + surfaces, full-context KV cache)",
        f"  load average (1/5/15 min) before {' '.join(f'{x:.2f}' for x in r['load_average_before'])}, after "
        f"{' '.join(f'{x:.2f}' for x in r['load_average_after'])} on {os.cpu_count()} cores "
        f"(timings are only comparable at low load)",
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="stories110m")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--threads", type=int, default=THREADS_DEFAULT,
                        help=f"PyTorch threads (Orion's: ORION_NUM_THREADS, default {THREADS_DEFAULT})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        result = run(args.shape, args.prompt_tokens, args.new_tokens, args.passes, args.threads, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(result) if args.json else report(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
