"""Training-step benchmark: Orion's Trainer (ANE programs on this machine's backend, the fp32 CPU head and
AdamW) side by side with PyTorch CPU fp32 training of transformers' model from the same initial weights, on the
same batches, at 2 threads, in the same run (optional: without torch and transformers Orion runs alone).

After one untimed warm-up step per side (Orion's compiles its programs), the two sides' steps alternate, so both
see the same machine load; medians are reported. Per side: ms/step and tokens/s; for Orion also ANE dispatches
and compiles per step, the partitioner's FLOP split between ANE and CPU, and the first-step loss of both sides
(same weights and batch: they agree to fp16 rounding). Then the M4 ANE cost model's ms/step for the same plan,
against the published Stories110M figures: the Orion paper's 1,345 ms per 4 x 256-token step and maderix's
~91 ms per 256-token micro-batch (docs/hardware.md §8; the model's constants and their sources: §1).

``--profile`` also says where Orion's timed steps go: the emulator's per-program, per-op profile, and (by
cProfile) the step's disjoint parts per step: the layer forward programs, the gradient programs, the CPU's fp32
head and loss, the gradients' unscale, the embedding's backward, the gradient norm, AdamW, the weights' fp16 range
check and the rest (Python, numpy conversions); cProfile's own overhead is in the times."""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orion.autodiff.partition import Plan
from orion.autodiff.runner import WEIGHT_STRATEGIES
from orion.cli import HelpFormatter, non_negative_int, positive_int, report_errors
from orion.limits import DISPATCH_MS
from orion.train.trainer import SHAPES, TrainConfig, Trainer

THREADS = 2
DEFAULT_MODEL = "stories110m"
PUBLISHED = (("Orion paper, M4 Max, weight reload", 1345.0, 4, 256),  # (who, ms per step, windows, tokens each)
             ("maderix, M4, dynamic weights", 91.0, 1, 256))


@dataclass(frozen=True)
class M4CostModel:
    """Modelled time of a training step on an M4 (docs/hardware.md §1 gives the sources):
    ANE FLOPs at a sustained fraction of the fp16 peak, one dispatch per ANE evaluation (ANE-28), the CPU's
    fp32 FLOPs at the CPU's GEMM rate, and AdamW as a pass over memory."""

    ane_peak_flops: float = 19e12          # Apple's 38 TOPS (int8) for the M4 Neural Engine: ~19 TFLOPS fp16
    ane_sustained: float = 0.25            # assumed fraction of that peak over a training step's programs
    dispatch_ms: float = DISPATCH_MS       # per evaluate (ANE-28)
    cpu_flops: float = 1e12                # assumed fp32 GEMM rate of the M4 CPU through Accelerate
    memory_bytes_per_s: float = 120e9      # Apple's M4 unified-memory bandwidth
    optimizer_bytes_per_param: int = 28    # AdamW reads w, g, m, v and writes w, m, v (fp32)

    def step_ms(self, plan: Plan, windows: int, params: int) -> dict[str, float]:
        """Modelled ms of one optimizer step of ``windows`` windows of ``plan`` over ``params`` parameters."""
        parts = {"ane": plan.ane_flops * windows / (self.ane_peak_flops * self.ane_sustained) * 1e3,
                 "dispatch": plan.dispatches * windows * self.dispatch_ms,
                 "cpu": plan.cpu_flops * windows / self.cpu_flops * 1e3,
                 "optimizer": params * self.optimizer_bytes_per_param / self.memory_bytes_per_s * 1e3}
        return {**parts, "total": sum(parts.values())}

    def describe(self) -> str:
        return (f"ANE {self.ane_peak_flops / 1e12:.0f} TFLOPS fp16 peak x {self.ane_sustained:.0%} sustained, "
                f"{self.dispatch_ms} ms per dispatch, CPU {self.cpu_flops / 1e12:g} TFLOP/s fp32, AdamW "
                f"{self.optimizer_bytes_per_param} B/parameter at {self.memory_bytes_per_s / 1e9:.0f} GB/s")


def token_file(directory: Path, vocab: int, count: int = 200_000) -> Path:
    """A nanoGPT train.bin/val.bin of random tokens (the benchmark times steps; it does not need to learn)."""
    stream = np.random.default_rng(0).integers(0, vocab, count).astype("<u2")
    stream[: count * 9 // 10].tofile(directory / "train.bin")
    stream[count * 9 // 10:].tofile(directory / "val.bin")
    return directory


class TorchSide:
    """transformers' model from the trainer's initial weights, trained on the trainer's batches in order (fp32,
    AdamW with decay on matrices, the same clipping), at :data:`THREADS` threads."""

    def __init__(self, trainer: Trainer, directory: Path) -> None:
        import torch
        import transformers

        from orion.models import family_of
        from orion.train.data import BatchSampler

        torch.set_num_threads(THREADS)
        self.torch, self.config = torch, trainer.config
        family_of(trainer.model.config).weights.save_hf(directory / "hf", trainer.model.config, trainer.model.weights(trainer.params))
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


def torch_available() -> str | None:
    """None when torch and transformers import, else why not."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


# The disjoint parts of Orion's step (--profile): label, (source path suffix, function[, caller function]).
STEP_PARTS = (
    ("layer forward programs", ("autodiff/runner.py", "__call__", "_layers_forward")),
    ("layer gradient programs", ("autodiff/runner.py", "__call__", "loss_and_grads")),
    ("head and loss (CPU fp32)", ("trainable.py", "head")),
    ("gradients unscaled (fp16 -> fp32)", ("autodiff/runner.py", "_unscaled")),
    ("embedding backward", ("trainable.py", "embed_backward")),
    ("gradient norm", ("train/optim.py", "grad_norm")),
    ("AdamW", ("train/optim.py", "step")),
    ("weights' fp16 range check", ("train/trainer.py", "_program_params")),
)
# Parts inside the program calls above, shown apart.
PROGRAM_CALL_PARTS = (
    ("program input NaN checks", ("runtime/program.py", "_has_nan")),
    ("inputs written into surfaces", ("orion/compiler.py", "fill")),
    ("outputs read from surfaces", ("orion/compiler.py", "read")),
    ("emulator evaluate", ("~", "<built-in method orion._core.evaluate>")),
)


def step_breakdown(stats: pstats.Stats, steps: int) -> list[tuple[str, float]]:
    """``(part, ms per step)`` of :data:`STEP_PARTS`, the rest of the step, then :data:`PROGRAM_CALL_PARTS`."""
    table = stats.stats  # type: ignore[attr-defined]  # (file, line, function) -> (cc, nc, tt, ct, callers)

    def cumulative(path: str, function: str, caller: str | None = None) -> float:
        total = 0.0
        for (file, _, name), (_, _, _, ct, callers) in table.items():
            if name != function or not file.endswith(path):
                continue
            total += ct if caller is None else sum(c[3] for k, c in callers.items() if k[2] == caller)
        return total * 1e3 / steps

    parts = [(label, cumulative(*where)) for label, where in STEP_PARTS]
    step = cumulative("train/trainer.py", "_train_step")
    return [*parts, ("the rest (Python, numpy)", step - sum(ms for _, ms in parts)), ("step", step),
            *((f"  of the programs: {label}", cumulative(*where)) for label, where in PROGRAM_CALL_PARTS)]


def run(model: str = DEFAULT_MODEL, seq: int = 256, batch: int = 1, accum: int = 1, steps: int = 2,
        weights: str = "inputs", prefer: str = "auto", torch: bool = True,
        cost: M4CostModel | None = None, profile: bool = False, warmup: int = 2) -> dict[str, Any]:
    """Runs the benchmark; returns its figures (see :func:`report`). ``profile``: with the emulator's profile
    and :func:`step_breakdown` of Orion's timed steps. ``warmup``: untimed interleaved steps of both sides after
    the first (PyTorch's steps 2-4 ran up to 1.4x its later ones: its allocator and threads settle)."""
    from orion import backend, compile_count
    from orion.runtime import profile as emulator_profile

    cost = cost or M4CostModel()
    missing = torch_available() if torch else "--no-torch"
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        config = TrainConfig(steps=1000, seq=seq, batch=batch, accum=accum, warmup=100, weights=weights, prefer=prefer)
        trainer = Trainer(model, token_file(directory, SHAPES[model].vocab_size), directory / "run", config,
                          quiet=True)
        params = sum(p.size for p in trainer.params.values())
        reference = TorchSide(trainer, directory) if missing is None else None
        load_start = os.getloadavg()[0]
        first = trainer.train_step()  # compiles Orion's programs; untimed on both sides
        torch_first = reference.step()[0] if reference else None
        for _ in range(warmup):
            trainer.train_step()
            if reference:
                reference.step()
        compiles_before, orion_ms, torch_ms = compile_count(), [], []
        profiler = cProfile.Profile() if profile else None
        if profile:
            emulator_profile.reset()
        for _ in range(steps):  # interleaved passes
            if profiler:
                emulator_profile.enable()
                profiler.enable()
            orion_ms.append(trainer.train_step()["ms"])
            if profiler:
                profiler.disable()
                emulator_profile.enable(False)
            if reference:
                torch_ms.append(reference.step()[1])
        plan, windows = trainer.plan, batch * accum
        result = {
            "model": model, "params": params, "seq": seq, "batch": batch, "accum": accum, "weights": weights,
            "backend": backend(), "steps": steps, "warmup": warmup, "tokens_per_step": config.tokens_per_step, "plan": str(plan),
            "ms_per_step": float(np.median(orion_ms)), "first_step_ms": first["ms"], "first_loss": first["loss"],
            "dispatches_per_step": plan.dispatches * windows,
            "compiles_per_step": (compile_count() - compiles_before) / steps,
            "ane_gflop": plan.ane_flops * windows / 1e9, "cpu_gflop": plan.cpu_flops * windows / 1e9,
            "torch": None if reference is None else {"ms_per_step": float(np.median(torch_ms)),
                                                     "first_loss": torch_first},
            "torch_missing": missing, "load": (load_start, os.getloadavg()[0]), "cores": os.cpu_count(),
            "m4": cost.step_ms(plan, windows, params), "m4_constants": cost.describe(),
            "m4_published": [(who, ms, n, s, cost.step_ms(plan, n, params)["total"] if s == seq else None)
                             for who, ms, n, s in PUBLISHED],
            "profile": None if profiler is None else {"parts": step_breakdown(pstats.Stats(profiler), steps),
                                                      "emulator": emulator_profile.table(top=6)},
        }
    return result


def _loss(value: float | None) -> str:
    """A step's loss, or why it has none (the loss scaler skipped the step: non-finite gradients)."""
    return "none (step skipped: non-finite gradients)" if value is None else f"{value:.4f}"


def report(r: dict[str, Any]) -> str:
    """The benchmark's figures as text."""
    tokens, ms = r["tokens_per_step"], r["ms_per_step"]
    share = 100 * r["ane_gflop"] / (r["ane_gflop"] + r["cpu_gflop"])
    lines = [f"{r['model']}: {r['params'] / 1e6:.1f}M parameters, {tokens} tokens per step (seq {r['seq']} x batch "
             f"{r['batch']} x accum {r['accum']}), weights={r['weights']}, backend {r['backend']}, median of "
             f"{r['steps']} interleaved steps after {r['warmup']} untimed ones", r["plan"],
             f"orion:   {ms:9.1f} ms/step {tokens / ms * 1e3:9.1f} tokens/s | first step {r['first_step_ms']:.0f} ms "
             f"(compiles) | {r['dispatches_per_step']} ANE dispatches/step, {r['compiles_per_step']:.2f} compiles/step "
             f"| FLOPs ANE {r['ane_gflop']:.3g} GFLOP ({share:.1f}%), CPU {r['cpu_gflop']:.3g} GFLOP | first loss "
             f"{_loss(r['first_loss'])}"]
    if r["torch"] is None:
        lines.append(f"pytorch: not run ({r['torch_missing']}); Orion alone")
    else:
        ref = r["torch"]["ms_per_step"]
        lines.append(f"pytorch: {ref:9.1f} ms/step {tokens / ref * 1e3:9.1f} tokens/s | fp32 CPU, {THREADS} threads | "
                     f"first loss {_loss(r['torch']['first_loss'])}")
        lines.append(f"ratio:   Orion takes {ms / ref:.2f}x PyTorch's time per step")
    m4 = r["m4"]
    lines.append(f"M4 cost model: {m4['total']:.1f} ms/step ({tokens / m4['total'] * 1e3:.0f} tokens/s): ANE "
                 f"{m4['ane']:.1f} + dispatch {m4['dispatch']:.1f} + CPU {m4['cpu']:.1f} + AdamW {m4['optimizer']:.1f} "
                 f"ms; {r['m4_constants']}")
    for who, published, n, s, modelled in r["m4_published"]:
        same = "" if r["model"] == "stories110m" else f" (the published run is Stories110M; this is {r['model']})"
        model_text = "n/a (other sequence length)" if modelled is None else f"{modelled:.1f} ms modelled{same}"
        lines.append(f"  {who}: {published:,.0f} ms per {n} x {s}-token step; {model_text}")
    if r.get("profile"):
        lines.append(f"where Orion's step goes (cProfile, mean of {r['steps']} timed steps):")
        lines.extend(f"  {label:<48}{ms:9.1f} ms" for label, ms in r["profile"]["parts"])
        lines.append(r["profile"]["emulator"])
    load = r["load"]
    lines.append(f"load average (1 min): {load[0]:.1f} at the start, {load[1]:.1f} at the end, on {r['cores']} cores")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m orion.bench train``."""
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(SHAPES),
                        help=f"the random-weight shape to train (default {DEFAULT_MODEL})")
    parser.add_argument("--seq", type=positive_int, default=256, help="tokens per window (default 256)")
    parser.add_argument("--batch", type=positive_int, default=1, help="windows per micro-batch (default 1)")
    parser.add_argument("--accum", type=positive_int, default=1, help="micro-batches per step (default 1)")
    parser.add_argument("--steps", type=positive_int, default=2,
                        help="timed steps per side, after one warm-up step (default 2)")
    parser.add_argument("--weights", choices=WEIGHT_STRATEGIES, default="inputs",
                        help="the trainer's weight strategy (default inputs)")
    parser.add_argument("--prefer", choices=("auto", "ane", "cpu"), default="auto",
                        help="the partitioner's placement (default auto)")
    parser.add_argument("--warmup", type=non_negative_int, default=2,
                        help="untimed interleaved steps after the first (default 2)")
    parser.add_argument("--no-torch", action="store_true", help="Orion alone")
    parser.add_argument("--profile", action="store_true",
                        help="where Orion's timed steps go: the emulator's per-program profile and the step's parts")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orion.bench train", description=__doc__,
                                     formatter_class=HelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return report_errors(lambda: _print(run(args.model, args.seq, args.batch, args.accum, args.steps, args.weights,
                                            args.prefer, not args.no_torch, profile=args.profile,
                                            warmup=args.warmup)))


def _print(result: dict[str, Any]) -> int:
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
