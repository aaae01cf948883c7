"""Where should the weight gradients run: in the ANE gradient program (fp16 operands, fp32 accumulation)
or on the CPU in fp32 from the program's fp16 ``x`` and ``dy`` (the public trainers' choice)?

Trains the same Stories110M-shaped Llama (dim 768, 12 heads, SwiGLU 2048, vocabulary 32,000, 256 tokens;
``--layers`` of them; ``--vocab`` may shrink the CPU classifier, which both placements share) twice from the same weights on the same batches, once per placement
(``partition(..., dw=)``), on the selected backend (the emulator here), and reports per placement:

- at step ``--check-step``: each layer weight's gradient cosine against a float64 numpy reference of the
  same parameters and batch (the layer graphs evaluated by the registry's references in float64);
- the training loss, mean of the last 10 steps, after ``--steps`` steps;
- the median milliseconds per ``loss_and_grads`` call.

Data: the UTF-8 bytes of Python's standard-library sources (``orion.train.corpus``) as token ids 0..255 of
the 32,000-entry vocabulary: real text, so real activations. AdamW 3e-4 (0.9, 0.95, decay 0.1), a
dynamic loss scale from 1024.

    python benchmarks/dw_placement.py --layers 2 --steps 200 --check-step 100 --out dw.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from orion.autodiff import numpy_eval
from orion.autodiff.runner import GradientRunner, NonFiniteGradient
from orion.autodiff.transform import backward, grad_name
from orion.models.llama import weights as llama_weights
from orion.models.llama.config import LlamaConfig
from orion.models.llama.trainable import LlamaTrainable
from orion.train.corpus import stdlib_text
from orion.train.loss_scale import DynamicLossScale
from orion.train.optim import AdamW


def model_of(layers: int, vocab: int) -> LlamaTrainable:
    base = LlamaConfig.stories110m()
    return LlamaTrainable(LlamaConfig(**{**base.__dict__, "n_layers": layers, "vocab_size": vocab}))


def batches(count: int, seq: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    data = np.frombuffer(stdlib_text(8 << 20).encode("utf-8"), np.uint8).astype(np.int64)
    starts = np.random.default_rng(seed).integers(0, len(data) - seq - 1, count)
    return [(data[s:s + seq], data[s + 1:s + seq + 1]) for s in starts]


def reference_grads(model: LlamaTrainable, params: dict[str, np.ndarray], ids: np.ndarray, targets: np.ndarray,
                    seq: int) -> dict[str, np.ndarray]:
    """Every layer weight's gradient in float64 (layer graphs by the registry's numpy references)."""
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    layer = model.layer_graph(seq)
    names = list(model.layer_shapes())
    grad_graph = backward(layer, ["x", *names])
    x = model.embed(p64, ids).astype(np.float64)
    saved = []
    for i in range(model.n_layers):
        arrays = {"x": x.T.reshape(1, x.shape[1], 1, seq), **model.layer_inputs(p64, i)}
        saved.append(arrays)
        x = numpy_eval.evaluate(layer, arrays, np.float64)["y"][0, :, 0, :].T
    _, dx, _ = model.head(p64, x, targets)
    grads = {}
    for i in reversed(range(model.n_layers)):
        dy = np.asarray(dx, np.float64).T.reshape(1, -1, 1, seq)
        out = numpy_eval.evaluate(grad_graph, {**saved[i], grad_name("y"): dy}, np.float64)
        for n in names:
            grads[model.layer_param(i, n)] = out[grad_name(n)]
        dx = out[grad_name("x")][0, :, 0, :].T
    return grads


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def run(placement: str, args: argparse.Namespace) -> dict:
    model = model_of(args.layers, args.vocab)
    params = {k: np.ascontiguousarray(v) for k, v in model.params(llama_weights.random_weights(model.config, seed=args.seed)).items()}
    runner = GradientRunner(model, args.seq, dw=placement)
    print(runner.plan, flush=True)
    optimizer = AdamW(params, lr=args.lr)
    scaler = DynamicLossScale(scale=1024.0)
    losses, times, cosines = [], [], {}
    for step, (ids, targets) in enumerate(batches(args.steps, args.seq, args.seed), start=1):
        start = time.perf_counter()
        try:
            loss, grads = runner.loss_and_grads(params, ids, targets, loss_scale=scaler.scale)
        except NonFiniteGradient:
            scaler.update(1)
            continue
        times.append((time.perf_counter() - start) * 1e3)
        scaler.update(0)
        if step == args.check_step:
            want = reference_grads(model, params, ids, targets, args.seq)
            for name, ref in want.items():
                cosines[name] = cosine(grads[name], ref)
        optimizer.step(grads)
        losses.append(loss)
        if step % 10 == 0:
            print(f"{placement} step {step}: loss {np.mean(losses[-10:]):.4f}, {statistics.median(times):.0f} ms/step",
                  flush=True)
    kinds: dict[str, list[float]] = {}
    for name, c in cosines.items():
        kinds.setdefault(name.split(".", 1)[1], []).append(c)
    return {"placement": placement, "final_loss": float(np.mean(losses[-10:])), "ms_per_step": statistics.median(times),
            "skipped": scaler.skipped_steps, "min_cosine": {k: min(v) for k, v in kinds.items()},
            "cosines": cosines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32000,
                        help="classifier rows (the byte tokens use 256; 512 spares the fp32 CPU head's time)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--check-step", type=int, default=100)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--placements", default="ane,cpu")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    results = [run(p, args) for p in args.placements.split(",")]
    for r in results:
        print(f"{r['placement']}: loss {r['final_loss']:.4f} after {args.steps} steps, {r['ms_per_step']:.0f} ms/step, "
              f"{r['skipped']} skipped; min cosine per weight: "
              + ", ".join(f"{k} {v:.6f}" for k, v in r["min_cosine"].items()))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
