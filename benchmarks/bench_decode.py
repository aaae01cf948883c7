"""GPT-2 decode speed: Orion against Hugging Face transformers (PyTorch, CPU), plus an ANE cost model.

Both run greedy decoding from the same random weights (GPT-2 init, ``random_weights(config, seed)``)
and the same random prompt. Decode tok/s counts the tokens after the first one (prefill is timed
apart); each side does a short warm-up first. Hugging Face runs fp32 with 2 threads (--hf-threads)
and its KV cache. The load average is recorded: on a shared machine, busy cores slow PyTorch's
OpenMP threads badly, so compare runs made at low load.

The ANE estimate per token is ``dispatches x dispatch cost + sum over programs of
max(FLOPs / peak, bytes / bandwidth)``, for Orion's decode plan and for Orion's original design
(2 ANE programs per layer at fp32 I/O with 16 lanes, attention and logits on the CPU).

    python benchmarks/bench_decode.py [--config 124m|tiny] [--prompt-tokens 16] [--new-tokens 128]
                                      [--ane-bandwidth-gbs 120] [--no-hf] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from orion.limits import DISPATCH_MS
from orion.models import GPT2, GPT2Config
from orion.models.gpt2.weights import random_weights, save_hf

CONFIGS = {
    "124m": GPT2Config(),
    "tiny": GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=256),  # smoke runs
}
ANE_TFLOPS = 19.0  # M4 ANE: 38 TOPS as advertised (int8) = 19 TFLOPS fp16
ANE_BANDWIDTH_GBS = 120.0  # M4: LPDDR5X-7500 on a 128-bit bus, Apple's advertised 120 GB/s
CPU_GFLOPS = 100.0  # assumed sustained fp32 GEMV rate of the CPU side of the original design
ORIGINAL_LANES = 16  # the original design padded the sequence axis to 16 lanes


@dataclass
class Stage:
    """One step of a decoded token: an ANE program (or a CPU stage) with its per-token work."""

    name: str
    flops_per_token: float
    bytes_per_token: float
    on_ane: bool = True


def cost_ms(stage: Stage, bandwidth_gbs: float, cpu_gflops: float = CPU_GFLOPS) -> float:
    """Roofline time of one stage: the larger of compute time and memory time, in ms."""
    peak = ANE_TFLOPS * 1e12 if stage.on_ane else cpu_gflops * 1e9
    return 1e3 * max(stage.flops_per_token / peak, stage.bytes_per_token / (bandwidth_gbs * 1e9))


def estimate(stages: list[Stage], dispatches: int, bandwidth_gbs: float,
             cpu_gflops: float = CPU_GFLOPS) -> dict[str, Any]:
    """Estimated ms and tok/s per decoded token under the cost model."""
    ane_ms = sum(cost_ms(s, bandwidth_gbs) for s in stages if s.on_ane)
    cpu_ms = sum(cost_ms(s, bandwidth_gbs, cpu_gflops) for s in stages if not s.on_ane)
    total = dispatches * DISPATCH_MS + ane_ms + cpu_ms
    return {
        "dispatches_per_token": dispatches,
        "dispatch_ms": dispatches * DISPATCH_MS,
        "ane_compute_or_memory_ms": ane_ms,
        "cpu_ms": cpu_ms,
        "ms_per_token": total,
        "tok_per_s": 1e3 / total,
        "flops_per_token": sum(s.flops_per_token for s in stages),
        "bytes_per_token": sum(s.bytes_per_token for s in stages),
        "stages": [asdict(s) for s in stages],
    }


def original_design(config: GPT2Config, context: int) -> tuple[list[Stage], int]:
    """Stages and dispatches per token of Orion's original GPT-2 design at ``context`` cached tokens.

    Per layer: ANE program 1 = LayerNorm + QKV projection, ANE program 2 = output projection +
    residual + LayerNorm + MLP + residual; both read fp16 weights and move fp32 activations of
    16 lanes, computing all 16 lanes for one live token. Attention over the KV cache (fp32) and the
    tied LM head (fp32 wte) run on the CPU.
    """
    c, lanes, fp16, fp32 = config.n_embd, ORIGINAL_LANES, 2, 4
    qkv_params, rest_params = 3 * c * c, 9 * c * c  # c_attn; c_proj + c_fc + mlp c_proj
    qkv = Stage("ln1+qkv (ANE, fp32 I/O, 16 lanes)", 2 * qkv_params * lanes,
                qkv_params * fp16 + (c + 3 * c) * lanes * fp32)
    rest = Stage("attn_out+ln2+mlp (ANE, fp32 I/O, 16 lanes)", 2 * rest_params * lanes,
                 rest_params * fp16 + (2 * c + c) * lanes * fp32)
    attention = Stage("attention (CPU, fp32 KV cache)", 4 * context * c, 2 * context * c * fp32, on_ane=False)
    per_layer = [qkv, rest, attention]
    stages = [Stage(f"{s.name} x{config.n_layer}", s.flops_per_token * config.n_layer,
                    s.bytes_per_token * config.n_layer, s.on_ane) for s in per_layer]
    stages.append(Stage("logits (CPU, fp32 wte)", 2 * config.vocab_size * c, config.vocab_size * c * fp32,
                        on_ane=False))
    return stages, 2 * config.n_layer


def orion_plan_stages(plan: Any) -> tuple[list[Stage], int]:
    """Stages and dispatches per token of an Orion ``GPT2.decode_plan``."""
    stages = [Stage(p.name, float(p.flops_per_token), float(p.bytes_per_token)) for p in plan.programs]
    return stages, int(plan.dispatches_per_token)


def timed_tokens(tokens) -> tuple[list[int], float, float]:
    """Consume a token iterator: (tokens, seconds to the first token, seconds for the rest)."""
    start = time.perf_counter()
    out, first = [], 0.0
    for token in tokens:
        out.append(int(token))
        if len(out) == 1:
            first = time.perf_counter()
    end = time.perf_counter()
    return out, first - start, end - first


def rate(tokens: list[int], decode_s: float) -> float:
    """Decode tokens per second: the tokens after the first over the time after the first."""
    return (len(tokens) - 1) / decode_s if len(tokens) > 1 and decode_s > 0 else float("nan")


def run_orion(config: GPT2Config, prompt: list[int], new_tokens: int, seed: int) -> dict[str, Any]:
    """Greedy decode with Orion: timings, tokens and the model's decode plan."""
    start = time.perf_counter()
    model = GPT2.random(config=config, seed=seed)
    list(model.generate(prompt, max_new_tokens=2))  # warm-up: compiles and loads the programs
    setup = time.perf_counter() - start
    model.reset()
    tokens, prefill, decode = timed_tokens(model.generate(prompt, max_new_tokens=new_tokens, temperature=0.0,
                                                                 ignore_eos=True))
    return {"setup_s": setup, "prefill_ms": 1e3 * prefill, "decode_tok_per_s": rate(tokens, decode),
            "tokens": tokens, "plan": model.decode_plan}


class _Timestamps:
    """A transformers streamer recording when each new token arrives (the prompt comes first)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def run_hf(config: GPT2Config, prompt: list[int], new_tokens: int, seed: int, threads: int = 2) -> dict[str, Any]:
    """Greedy decode with Hugging Face GPT2LMHeadModel (fp32, KV cache) on the same random weights."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as directory:
        save_hf(directory, config, random_weights(config, seed))
        model = transformers.GPT2LMHeadModel.from_pretrained(directory, torch_dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    settings = dict(do_sample=False, use_cache=True, pad_token_id=0)

    def generate(n: int, streamer=None):
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=n, min_new_tokens=n, streamer=streamer, **settings)

    generate(4)  # warm-up
    stamps = _Timestamps()
    start = time.perf_counter()
    out = generate(new_tokens, stamps)
    end = time.perf_counter()
    tokens = out[0, len(prompt):].tolist()
    first = stamps.times[1] if len(stamps.times) > 1 else end  # times[0]: the prompt itself
    return {"versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "threads": threads, "prefill_ms": 1e3 * (first - start),
            "decode_tok_per_s": rate(tokens, end - first), "tokens": tokens}


def hf_available() -> str | None:
    """None when torch and transformers import, else why not."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        return f"Hugging Face transformers is not installed ({exc}); pip install torch transformers to compare"
    return None


def agreeing_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two generations share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def run(config_name: str = "124m", prompt_tokens: int = 16, new_tokens: int = 128, seed: int = 0,
        bandwidth_gbs: float = ANE_BANDWIDTH_GBS, cpu_gflops: float = CPU_GFLOPS,
        with_hf: bool = True, hf_threads: int = 2) -> dict[str, Any]:
    """The whole benchmark as one JSON-ready dict."""
    config = CONFIGS[config_name]
    if prompt_tokens < 1 or new_tokens < 2 or prompt_tokens + new_tokens > config.n_positions:
        raise ValueError(f"need prompt tokens >= 1, new tokens >= 2 and their sum <= n_positions "
                         f"({config.n_positions}); got {prompt_tokens} + {new_tokens}")
    prompt = np.random.default_rng(seed).integers(0, config.vocab_size, prompt_tokens).tolist()
    context = prompt_tokens + new_tokens // 2  # mean cached tokens over the decode
    result: dict[str, Any] = {
        "config": config_name, "params": config.param_count(), "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens, "seed": seed, "orion": None, "hf": None, "notes": [],
        "load_average_before": os.getloadavg()[0],
    }

    orion_result = run_orion(config, prompt, new_tokens, seed)
    plan = orion_result.pop("plan")
    result["orion"] = orion_result

    why = hf_available() if with_hf else "Hugging Face comparison skipped (--no-hf)"
    if why is None:
        result["hf"] = run_hf(config, prompt, new_tokens, seed, hf_threads)
    else:
        result["notes"].append(why)

    if result["hf"]:
        result["orion_over_hf"] = result["orion"]["decode_tok_per_s"] / result["hf"]["decode_tok_per_s"]
        result["tokens_agreeing"] = agreeing_prefix(result["orion"]["tokens"], result["hf"]["tokens"])

    assumptions = {
        "dispatch_ms": DISPATCH_MS, "ane_tflops_fp16": ANE_TFLOPS, "bandwidth_gbs": bandwidth_gbs,
        "bandwidth_basis": "Apple M4 unified memory (LPDDR5X-7500, 128-bit): 120 GB/s advertised"
        if bandwidth_gbs == ANE_BANDWIDTH_GBS else "set by --ane-bandwidth-gbs",
        "cpu_gflops_fp32": cpu_gflops, "mean_context_tokens": context,
        "model": "dispatches x dispatch_ms + sum over programs of max(FLOPs / peak, bytes / bandwidth)",
    }
    estimates: dict[str, Any] = {"assumptions": assumptions}
    stages, dispatches = original_design(config, context)
    estimates["original_design"] = estimate(stages, dispatches, bandwidth_gbs, cpu_gflops)
    stages, dispatches = orion_plan_stages(plan)
    estimates["orion_plan"] = estimate(stages, dispatches, bandwidth_gbs, cpu_gflops)
    result["ane_estimate"] = estimates
    return result


def report(result: dict[str, Any]) -> str:
    """Human-readable summary of ``run``'s result."""
    lines = [f"GPT-2 {result['config']} ({result['params'] / 1e6:.1f}M params): greedy decode, "
             f"{result['prompt_tokens']}-token prompt, {result['new_tokens']} new tokens"]
    hf = result["hf"]
    labels = {"orion": "Orion",
              "hf": hf and f"Hugging Face (PyTorch fp32, {hf['threads']} thread{'s' * (hf['threads'] != 1)})"}
    for key, label in labels.items():
        side = result[key]
        if side:
            lines.append(f"  {label:<44} {side['decode_tok_per_s']:8.1f} tok/s decode   "
                         f"prefill {side['prefill_ms']:7.1f} ms")
    if "orion_over_hf" in result:
        lines.append(f"  Orion / Hugging Face: {result['orion_over_hf']:.2f}x; first "
                     f"{result['tokens_agreeing']}/{result['new_tokens']} generated tokens agree")
    lines += [f"  note: {note}" for note in result["notes"]]
    lines.append(f"  load average before the run: {result['load_average_before']:.2f} "
                 f"(timings are only comparable at low load)")
    est = result["ane_estimate"]
    a = est["assumptions"]
    lines.append("ANE cost model per decoded token: " + a["model"])
    lines.append(f"  assumptions: {a['dispatch_ms']} ms per dispatch; {a['ane_tflops_fp16']} TFLOPS fp16 "
                 f"(M4 ANE, 38 TOPS advertised); {a['bandwidth_gbs']:g} GB/s ({a['bandwidth_basis']}); "
                 f"CPU stages at {a['cpu_gflops_fp32']:g} GFLOPS fp32; "
                 f"attention over {a['mean_context_tokens']} cached tokens (mean)")
    for key, label in (("orion_plan", "Orion plan"), ("original_design", "original design")):
        if key in est:
            e = est[key]
            lines.append(f"  {label:<16} {e['dispatches_per_token']:3d} dispatches = {e['dispatch_ms']:.2f} ms, "
                         f"ANE {e['ane_compute_or_memory_ms']:.2f} ms, CPU {e['cpu_ms']:.2f} ms -> "
                         f"{e['ms_per_token']:.2f} ms/token = {e['tok_per_s']:.0f} tok/s")
            for s in e["stages"]:
                lines.append(f"      {s['name']:<48} {s['flops_per_token'] / 1e6:9.1f} MFLOP "
                             f"{s['bytes_per_token'] / 1e6:8.2f} MB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="124m")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ane-bandwidth-gbs", type=float, default=ANE_BANDWIDTH_GBS)
    parser.add_argument("--cpu-gflops", type=float, default=CPU_GFLOPS)
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face comparison")
    parser.add_argument("--hf-threads", type=int, default=2, help="PyTorch threads for Hugging Face")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        result = run(args.config, args.prompt_tokens, args.new_tokens, args.seed, args.ane_bandwidth_gbs,
                     args.cpu_gflops, not args.no_hf, args.hf_threads)
    except ValueError as exc:
        parser.error(str(exc))
    if args.json:
        print(json.dumps(result))
    else:
        print(report(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
