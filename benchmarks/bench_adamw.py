"""AdamW speed on Stories110M-shaped tensors: orion (C++) against torch.optim.AdamW, same arrays, same run.

Run: ``ORION_NUM_THREADS=2 python benchmarks/bench_adamw.py [--repeats 5]``. Prints the median ms per
step of each, measured interleaved (orion, torch foreach=False, torch foreach=True, repeat). torch runs
at 2 threads, and also at 1: on a shared machine its 2-thread OpenMP runs suffer most from a busy neighbour.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from orion import _core
from orion.train.optim import AdamW, grad_norm

DIM, LAYERS, HIDDEN, VOCAB = 768, 12, 2048, 32000


def stories110m_shapes() -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"embed": (VOCAB, DIM), "norm_final": (DIM,)}
    for i in range(LAYERS):
        for name in ("wq", "wk", "wv", "wo"):
            shapes[f"l{i}.{name}"] = (DIM, DIM)
        shapes[f"l{i}.w1"], shapes[f"l{i}.w3"], shapes[f"l{i}.w2"] = (HIDDEN, DIM), (HIDDEN, DIM), (DIM, HIDDEN)
        shapes[f"l{i}.norm_att"], shapes[f"l{i}.norm_ffn"] = (DIM,), (DIM,)
    return shapes


def _with_threads(threads: int, step) -> None:
    torch.set_num_threads(threads)
    step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    shapes = stories110m_shapes()
    rng = np.random.default_rng(0)
    params = {n: rng.standard_normal(s, dtype=np.float32) * 0.02 for n, s in shapes.items()}
    grads = {n: rng.standard_normal(s, dtype=np.float32) * 1e-3 for n, s in shapes.items()}
    print(f"parameters: {sum(p.size for p in params.values()) / 1e6:.2f} M in {len(params)} tensors, "
          f"orion threads {_core.kernels.num_threads()} (ORION_NUM_THREADS)")
    ours = AdamW(params)
    decay = [n for n, p in params.items() if p.ndim >= 2]
    contenders = {"orion": lambda: ours.step(grads)}
    for foreach in (False, True):
        tparams = {n: torch.nn.Parameter(torch.from_numpy(p.copy())) for n, p in params.items()}
        for n, t in tparams.items():
            t.grad = torch.from_numpy(grads[n])
        topt = torch.optim.AdamW(
            [{"params": [tparams[n] for n in decay], "weight_decay": 0.1},
             {"params": [t for n, t in tparams.items() if n not in decay], "weight_decay": 0.0}],
            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, foreach=foreach)
        for threads in (2, 1):
            contenders[f"torch foreach={foreach} {threads}t"] = lambda step=topt.step, t=threads: _with_threads(t, step)
    contenders["orion grad_norm"] = lambda: grad_norm(grads)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for fn in contenders.values():
        fn()  # warm-up: first-touch of the moments
    for _ in range(args.repeats):
        for name, fn in contenders.items():
            start = time.perf_counter()
            with torch.no_grad():
                fn()
            times[name].append((time.perf_counter() - start) * 1e3)
    for name, t in times.items():
        print(f"{name:27s} median {statistics.median(t):8.1f} ms   (runs: {', '.join(f'{x:.0f}' for x in t)})")


if __name__ == "__main__":
    main()
