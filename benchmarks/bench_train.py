"""Training-step benchmark: Orion's Trainer (ANE programs on this machine's backend, fp32 CPU head and AdamW)
against PyTorch CPU fp32 training of transformers' model from the same initial weights, on the same batches,
at 2 threads, in the same run.

    python benchmarks/bench_train.py                      # Stories110M shape, seq 256: about a minute
    python benchmarks/bench_train.py --model tiny-llama --steps 20

Reported per side: ms/step and tokens/s over the timed steps (after one untimed warm-up step, which compiles
Orion's programs); for Orion also the ANE dispatches and compiles per step and the partitioner's FLOP split
between ANE and CPU, and the first-step loss of both sides (same weights and batch: they should agree to
fp16 rounding). The last line estimates the wall time of a 1,000-step run at the measured ms/step, plus
validation and checkpoints at the trainer's defaults (every 100 steps).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from orion import backend, compile_count
from orion.models.gpt2 import weights as gpt2_weights
from orion.models.gpt2.config import GPT2Config
from orion.models.llama import weights as llama_weights
from orion.train.data import BatchSampler
from orion.train.trainer import SHAPES, TrainConfig, Trainer

THREADS = 2


def _tokens(directory: Path, vocab: int, count: int = 200_000) -> Path:
    stream = np.random.default_rng(0).integers(0, vocab, count).astype("<u2")
    stream[: count * 9 // 10].tofile(directory / "train.bin")
    stream[count * 9 // 10:].tofile(directory / "val.bin")
    return directory


def _orion(trainer: Trainer, steps: int) -> dict[str, float]:
    first = trainer.train_step()  # compiles the programs
    compiles_before = compile_count()
    records = [trainer.train_step() for _ in range(steps)]
    ms = float(np.mean([r["ms"] for r in records]))
    plan = trainer.plan
    return {"ms": ms, "first_loss": first["loss"], "compiles_per_step": (compile_count() - compiles_before) / steps,
            "first_step_ms": first["ms"], "dispatches": plan.dispatches, "ane_gflop": plan.ane_flops / 1e9,
            "cpu_gflop": plan.cpu_flops / 1e9}


def _torch(trainer: Trainer, initial: dict[str, np.ndarray], steps: int, directory: Path) -> dict[str, float]:
    import torch
    import transformers

    torch.set_num_threads(THREADS)
    cfg = trainer.config
    module = gpt2_weights if isinstance(trainer.model.config, GPT2Config) else llama_weights
    module.save_hf(directory / "hf", trainer.model.config, trainer.model.weights(initial))
    model = transformers.AutoModelForCausalLM.from_pretrained(directory / "hf", dtype=torch.float32,
                                                              attn_implementation="eager")
    groups = [{"params": [p for p in model.parameters() if p.ndim >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))
    sampler = BatchSampler(trainer.data.train, cfg.seq, cfg.batch, cfg.seed)  # Orion's batches, in order
    times, losses = [], []
    for _ in range(steps + 1):
        began = time.perf_counter()
        optimizer.zero_grad()
        windows = [w for _ in range(cfg.accum) for w in zip(*sampler.next_batch(), strict=True)]
        loss = sum(torch.nn.functional.cross_entropy(model(torch.tensor(i)[None]).logits[0], torch.tensor(t))
                   for i, t in windows) / len(windows)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
        times.append(time.perf_counter() - began)
        losses.append(loss.item())
    return {"ms": float(np.mean(times[1:])) * 1e3, "first_loss": losses[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="stories110m", choices=sorted(SHAPES))
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per side, after one warm-up step")
    parser.add_argument("--no-torch", action="store_true", help="Orion only")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        vocab = SHAPES[args.model].vocab_size
        config = TrainConfig(steps=1000, seq=args.seq, batch=args.batch, accum=args.accum, warmup=100)
        trainer = Trainer(args.model, _tokens(directory, vocab), directory / "run", config, quiet=True)
        initial = {name: p.copy() for name, p in trainer.params.items()}
        params = sum(p.size for p in initial.values())
        tokens = config.tokens_per_step
        print(f"{args.model}: {params / 1e6:.1f}M parameters, {tokens} tokens per step (seq {args.seq} x batch "
              f"{args.batch} x accum {args.accum}), backend {backend()}")
        orion = _orion(trainer, args.steps)
        print(trainer.plan)
        total = orion["ane_gflop"] + orion["cpu_gflop"]
        print(f"orion:   {orion['ms']:9.1f} ms/step {tokens / orion['ms'] * 1e3:9.1f} tokens/s | first step "
              f"{orion['first_step_ms']:.0f} ms (compiles) | {orion['dispatches']} ANE dispatches/step, "
              f"{orion['compiles_per_step']:.2f} compiles/step | FLOPs ANE {orion['ane_gflop']:.1f} GFLOP "
              f"({100 * orion['ane_gflop'] / total:.1f}%), CPU {orion['cpu_gflop']:.1f} GFLOP | first loss "
              f"{orion['first_loss']:.4f}")
        if not args.no_torch:
            ref = _torch(trainer, initial, args.steps, directory)
            print(f"pytorch: {ref['ms']:9.1f} ms/step {tokens / ref['ms'] * 1e3:9.1f} tokens/s | fp32 CPU, "
                  f"{THREADS} threads | first loss {ref['first_loss']:.4f}")
            print(f"ratio:   Orion takes {orion['ms'] / ref['ms']:.2f}x PyTorch's time per step")
        evals = config.eval_batches * (config.steps // config.eval_every)  # each a forward+backward window
        estimate = (orion["ms"] * config.steps + orion["ms"] / config.accum / config.batch * evals) / 1e3
        print(f"1,000-step run estimate on this backend: {estimate / 3600:.2f} h ({orion['ms']:.0f} ms/step, "
              f"{evals} validation windows, checkpoint writes not counted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
