"""The emulator's gemm (``orion._core.kernels.gemm``) beside ``torch.matmul`` (fp32, OpenBLAS/MKL, 2 threads) on
the matrix products of a Stories110M training step (dim 768, hidden 2048, 256 tokens): the forward's
``x @ W.T``, the backward's ``dy @ W`` and ``dy.T @ x``. Passes alternate Orion and torch on each shape; the
medians of ``--passes`` passes and their ratio are printed with the load average.

    python benchmarks/bench_gemm.py [--passes 7] [--reps 3] [--no-round]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from orion._core import kernels

THREADS = 2
DIM, HIDDEN, TOKENS = 768, 2048, 256
# (label, M, N, K, transpose_a, transpose_b): C[M, N] = op(A) @ op(B)
SHAPES = [
    ("fwd x@Wq.T", TOKENS, DIM, DIM, False, True),
    ("fwd x@W1.T", TOKENS, HIDDEN, DIM, False, True),
    ("fwd h@W2.T", TOKENS, DIM, HIDDEN, False, True),
    ("bwd dy@Wq", TOKENS, DIM, DIM, False, False),
    ("bwd dy@W1", TOKENS, DIM, HIDDEN, False, False),
    ("bwd dW=dy.T@x", DIM, DIM, TOKENS, True, False),
    ("bwd dW1=dy.T@x", HIDDEN, DIM, TOKENS, True, False),
    ("bwd dW2=dy.T@h", DIM, HIDDEN, TOKENS, True, False),
]


def timed(fn, reps: int) -> float:
    """Best-of-``reps`` milliseconds of one call (the first call of a pass warms caches)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        began = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - began)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=7)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-round", action="store_true", help="fp32 results (default: rounded to fp16 as the "
                                                                 "emulator's fp16 matmul does)")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    rng = np.random.default_rng(0)
    load = os.getloadavg()[0]
    total = {"orion": 0.0, "torch": 0.0}
    print(f"{'shape':<16} {'M':>5} {'N':>5} {'K':>5} {'orion ms':>9} {'torch ms':>9} {'ratio':>6} {'GFLOP/s':>8}")
    for label, M, N, K, ta, tb in SHAPES:
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        ta_t, tb_t = torch.from_numpy(a), torch.from_numpy(b)
        opa = ta_t.T if ta else ta_t
        opb = tb_t.T if tb else tb_t
        runs = {"orion": lambda a=a, b=b, ta=ta, tb=tb: kernels.gemm(a, b, transpose_a=ta, transpose_b=tb,
                                                                     round=not args.no_round),
                "torch": lambda x=opa, y=opb: torch.matmul(x, y)}
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.passes):
            for name, fn in runs.items():
                times[name].append(timed(fn, args.reps))
        med = {name: statistics.median(t) for name, t in times.items()}
        for name in total:
            total[name] += med[name]
        gflops = 2 * M * N * K / med["orion"] / 1e6
        print(f"{label:<16} {M:>5} {N:>5} {K:>5} {med['orion']:>9.2f} {med['torch']:>9.2f} "
              f"{med['orion'] / med['torch']:>6.2f} {gflops:>8.1f}")
    print(f"{'sum':<34} {total['orion']:>9.2f} {total['torch']:>9.2f} {total['orion'] / total['torch']:>6.2f}")
    print(f"load average (1 min): {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; torch threads "
          f"{torch.get_num_threads()}, orion's pool 2 cores")


if __name__ == "__main__":
    main()
