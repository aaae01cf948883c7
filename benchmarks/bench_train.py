"""Training-step benchmark: Orion's Trainer (ANE programs on this machine's backend, fp32 CPU head and AdamW)
against PyTorch CPU fp32 training of transformers' model from the same initial weights, on the same batches,
at 2 threads, in the same run.

    python benchmarks/bench_train.py                      # Stories110M shape, seq 256: about a minute
    python benchmarks/bench_train.py --model tiny-llama --steps 20

Reported per side: ms/step and tokens/s over the timed steps (after one untimed warm-up step, which compiles
Orion's programs; the two sides' steps alternate so both see the same machine load); for Orion also the ANE
dispatches and compiles per step and the partitioner's FLOP split between ANE and CPU, and the first-step
loss of both sides (same weights and batch: they should agree to fp16 rounding). The last line estimates the
wall time of a 1,000-step run at the measured ms/step plus validation at the trainer's defaults (4 windows
every 100 steps; checkpoint writes not counted).
"""

from __future__ import annotations

import argparse
import os
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


class _TorchSide:
    """transformers' model from the same initial weights, trained on Orion's batches in order (fp32, AdamW)."""

    def __init__(self, trainer: Trainer, initial: dict[str, np.ndarray], directory: Path) -> None:
        import torch
        import transformers

        torch.set_num_threads(THREADS)
        self.torch, self.config = torch, trainer.config
        module = gpt2_weights if isinstance(trainer.model.config, GPT2Config) else llama_weights
        module.save_hf(directory / "hf", trainer.model.config, trainer.model.weights(initial))
        self.model = transformers.AutoModelForCausalLM.from_pretrained(directory / "hf", dtype=torch.float32,
                                                                       attn_implementation="eager")
        groups = [{"params": [p for p in self.model.parameters() if p.ndim >= 2],
                   "weight_decay": self.config.weight_decay},
                  {"params": [p for p in self.model.parameters() if p.ndim < 2], "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=self.config.lr, betas=(0.9, 0.95))
        self.sampler = BatchSampler(trainer.data.train, self.config.seq, self.config.batch, self.config.seed)

    def step(self) -> tuple[float, float]:
        """One training step: ``(loss, ms)``."""
        torch, cfg = self.torch, self.config
        began = time.perf_counter()
        self.optimizer.zero_grad()
        windows = [w for _ in range(cfg.accum) for w in zip(*self.sampler.next_batch(), strict=True)]
        loss = sum(torch.nn.functional.cross_entropy(self.model(torch.tensor(i)[None]).logits[0], torch.tensor(t))
                   for i, t in windows) / len(windows)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        return loss.item(), (time.perf_counter() - began) * 1e3


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
        reference = None if args.no_torch else _TorchSide(trainer, initial, directory)
        load = os.getloadavg()[0]
        first = trainer.train_step()  # compiles Orion's programs; untimed on both sides
        ref_first = reference.step()[0] if reference else None
        compiles_before, orion_ms, torch_ms = compile_count(), [], []
        for _ in range(args.steps):  # interleaved, so both sides see the same machine load
            orion_ms.append(trainer.train_step()["ms"])
            if reference:
                torch_ms.append(reference.step()[1])
        plan, ms = trainer.plan, float(np.mean(orion_ms))
        print(plan)
        ane, cpu = plan.ane_flops / 1e9, plan.cpu_flops / 1e9
        print(f"orion:   {ms:9.1f} ms/step {tokens / ms * 1e3:9.1f} tokens/s | first step {first['ms']:.0f} ms "
              f"(compiles) | {plan.dispatches} ANE dispatches/step, "
              f"{(compile_count() - compiles_before) / args.steps:.2f} compiles/step | FLOPs ANE {ane:.1f} GFLOP "
              f"({100 * ane / (ane + cpu):.1f}%), CPU {cpu:.1f} GFLOP | first loss {first['loss']:.4f}")
        if reference:
            ref = float(np.mean(torch_ms))
            print(f"pytorch: {ref:9.1f} ms/step {tokens / ref * 1e3:9.1f} tokens/s | fp32 CPU, {THREADS} threads | "
                  f"first loss {ref_first:.4f}")
            print(f"ratio:   Orion takes {ms / ref:.2f}x PyTorch's time per step")
        print(f"load average (1 min): {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on "
              f"{os.cpu_count()} cores")
        evals = config.eval_batches * (config.steps // config.eval_every)  # each a forward+backward window
        estimate = (ms * config.steps + ms / config.accum / config.batch * evals) / 1e3
        print(f"1,000-step run estimate on this backend: {estimate / 3600:.2f} h ({ms:.0f} ms/step, "
              f"{evals} validation windows, checkpoint writes not counted)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
