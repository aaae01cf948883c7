"""LoRA on Orion: fine-tune ms/step against full fine-tuning and PEFT on PyTorch; adapter-switch latency, and
decode tok/s with and without an adapter.

``--part train`` (the training comparison): one shape (``--train-shape``, random weights of seed 0, random token
data) is stepped by three runs in the same process, interleaved: ``--passes`` passes of ``--steps`` optimizer
steps each, every pass running all three in turn so a load change on the shared machine hits them alike:

- Orion LoRA: ``Trainer(lora=r,alpha,targets)``: only A/B trained, the base baked per layer;
- Orion full fine-tuning: ``Trainer`` of every parameter (weights as program inputs);
- PEFT on PyTorch CPU (``--torch-threads``, default 2): transformers' model of the same weights with
  ``peft.get_peft_model`` of the same r/alpha/targets, forward, cross-entropy, backward, clipping, AdamW.

The medians of each run's step times over all timed steps (the first step of each run, which compiles, is
not timed) and the ratios are printed, with the load average.

``--part decode``: one model (``--config``: GPT-2 124M, tiny GPT-2, or Stories110M; random weights) loads
``--adapters`` random adapters of rank ``--rank`` on ``--targets`` (PEFT names; default q, k and v). Switch
latency is the mean of ``--switches`` ``set_adapter`` calls cycling through them (with the
``orion.compile_count()`` delta over them, which should be 0). Decode runs greedy from the same prompt, base
and adapter rounds interleaved (``--rounds`` of each); tok/s counts the tokens after the first one.

    python benchmarks/bench_lora.py [--part all|train|decode] [--train-shape stories110m|tiny-llama|tiny-gpt2]
        [--seq 256] [--lora r=16,alpha=32,targets=q,v] [--passes 3] [--steps 2] [--torch-threads 2]
        [--config 124m|tiny|stories110m] [--rank 16] [--targets c_attn] [--adapters 3] [--switches 100]
        [--new-tokens 32] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import orion
from orion.lora import LoraAdapter
from orion.lora.hot_swap import targeted_modules
from orion.lora.train import LoraSpec, modules_of
from orion.models import GPT2, GPT2Config, Llama
from orion.models.llama.config import LlamaConfig
from orion.train.trainer import SHAPES, Trainer

CONFIGS = {
    "124m": GPT2Config(),
    "tiny": GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=256),  # smoke runs
    "stories110m": LlamaConfig.stories110m(),
}
DEFAULT_TARGETS = {"124m": "c_attn", "tiny": "c_attn", "stories110m": "q_proj,k_proj,v_proj"}


def random_adapter(model: GPT2 | Llama, rank: int, targets: list[str], seed: int) -> LoraAdapter:
    """Random A and B (GPT-2-init scale) on every module ``targets`` selects."""
    rng = np.random.default_rng(seed)
    placements = model.lora_placements()
    modules = {p: (rng.normal(0, 0.02, (rank, placements[p].in_features)).astype(np.float32),
                   rng.normal(0, 0.02, (placements[p].out_features, rank)).astype(np.float32))
               for p in sorted(targeted_modules(targets, placements, "--targets"))}
    return LoraAdapter(rank, 2.0 * rank, modules)


def decode_tok_s(model: GPT2 | Llama, prompt: list[int], new_tokens: int) -> float:
    """Greedy decode tok/s after the first new token (prefill not timed)."""
    tokens = model.generate(prompt, new_tokens, ignore_eos=True)
    next(tokens)
    start = time.perf_counter()
    produced = sum(1 for _ in tokens)
    return produced / (time.perf_counter() - start)


def random_tokens(directory: Path, vocab: int) -> Path:
    """A nanoGPT token directory of uniform random ids (timing does not depend on the text)."""
    rng = np.random.default_rng(0)
    rng.integers(0, vocab, 200_000).astype("<u2").tofile(directory / "train.bin")
    rng.integers(0, vocab, 20_000).astype("<u2").tofile(directory / "val.bin")
    return directory


class TorchPeft:
    """PEFT on PyTorch CPU: transformers' model of ``trainer``'s base weights, adapters of ``spec``, AdamW."""

    def __init__(self, trainer: Trainer, spec: LoraSpec, directory: Path, threads: int) -> None:
        import peft
        import torch
        import transformers

        from orion.models.gpt2 import weights as gpt2_weights
        from orion.models.llama import weights as llama_weights

        torch.set_num_threads(threads)
        base = trainer.model.base
        module = gpt2_weights if isinstance(base.config, GPT2Config) else llama_weights
        module.save_hf(directory, base.config, base.weights(trainer.model.base_params))
        hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                               attn_implementation="eager")
        names = sorted({m.rsplit(".", 1)[-1] for m in modules_of(base, spec.targets)})
        self.model = peft.get_peft_model(hf, peft.LoraConfig(r=spec.r, lora_alpha=spec.alpha, target_modules=names,
                                                             lora_dropout=0.0, task_type="CAUSAL_LM",
                                                             fan_in_fan_out=isinstance(base.config, GPT2Config)))
        self.trained = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.trained, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
        self.sampler, self.torch = trainer.sampler, torch

    def step(self) -> float:
        """One optimizer step on the next batch; its milliseconds."""
        torch = self.torch
        began = time.perf_counter()
        inputs, targets = self.sampler.next_batch()
        self.optimizer.zero_grad()
        logits = self.model(torch.tensor(inputs[0])[None]).logits[0]
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(targets[0]))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.trained, 1.0)
        self.optimizer.step()
        return (time.perf_counter() - began) * 1e3


def train_part(args: argparse.Namespace) -> dict:
    """LoRA ms/step against full fine-tuning (Orion) and PEFT on PyTorch, interleaved passes."""
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as work:
        return _train_part(args, Path(work))


def _train_part(args: argparse.Namespace, work: Path) -> dict:
    spec = LoraSpec.parse(args.lora)
    data = random_tokens(work, SHAPES[args.train_shape].vocab_size)
    common = {"steps": 10_000, "seq": args.seq, "eval_every": 10_000, "checkpoint_every": 10_000, "quiet": True}
    trainers = {"orion_lora": Trainer(args.train_shape, data, work / "lora", lora=spec, **common),
                "orion_full": Trainer(args.train_shape, data, work / "full", **common)}
    steppers = {name: (lambda t=t: t.train_step()["ms"]) for name, t in trainers.items()}
    steppers["peft_torch"] = TorchPeft(trainers["orion_lora"], spec, work / "hf", args.torch_threads).step
    setup = {}
    for name, step in steppers.items():  # the first step compiles (Orion) or warms up (torch): not timed
        began = time.perf_counter()
        step()
        setup[name] = round(time.perf_counter() - began, 2)
    times: dict[str, list[float]] = {name: [] for name in steppers}
    for _ in range(args.passes):
        for name, step in steppers.items():
            times[name].extend(step() for _ in range(args.steps))
    median = {name: round(statistics.median(t), 1) for name, t in times.items()}
    lora = trainers["orion_lora"]
    return {
        "train_shape": args.train_shape, "seq": args.seq, "lora": args.lora, "passes": args.passes,
        "steps_per_pass": args.steps, "first_step_s": setup,
        "ms_per_step": median, "ms_per_step_all": {k: [round(v, 1) for v in t] for k, t in times.items()},
        "full_over_lora": round(median["orion_full"] / median["orion_lora"], 2),
        "lora_over_peft_torch": round(median["orion_lora"] / median["peft_torch"], 2),
        "trained_params": {"lora": int(sum(p.size for p in lora.params.values())),
                           "full": int(sum(p.size for p in trainers["orion_full"].params.values()))},
        "lora_plan": str(lora.plan).splitlines()[0], "full_plan": str(trainers["orion_full"].plan).splitlines()[0],
        "torch_threads": args.torch_threads, "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def decode_part(args: argparse.Namespace) -> dict:
    """Adapter-switch latency and decode tok/s with and without an adapter."""
    config = CONFIGS[args.config]
    start = time.perf_counter()
    model = (GPT2 if isinstance(config, GPT2Config) else Llama).random(config, progress=False)
    base_compile_s = time.perf_counter() - start
    targets = (args.targets or DEFAULT_TARGETS[args.config]).split(",")
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
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    result["adapter_over_base"] = round(result["decode_tok_s_adapter"] / result["decode_tok_s_base"], 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "train", "decode"), default="all")
    parser.add_argument("--train-shape", choices=sorted(SHAPES), default="stories110m")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--lora", default="r=16,alpha=32,targets=q,v", help="the fine-tune's --lora spec")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="timed steps of each run per pass")
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="124m")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--targets", default=None, help="comma-separated PEFT target_modules (default: q, k, v)")
    parser.add_argument("--adapters", type=int, default=3)
    parser.add_argument("--switches", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    result = {}
    if args.part in ("all", "train"):
        result["train"] = train_part(args)
    if args.part in ("all", "decode"):
        result["decode"] = decode_part(args)
    if args.json:
        print(json.dumps(result))
        return
    for part, values in result.items():
        print(f"[{part}]")
        for key, value in values.items():
            print(f"{key:>26}: {value}")


if __name__ == "__main__":
    main()
