"""Times Orion's 1x1 conv kernel (fp16 weights, prepacked) against numpy's fp32 matmul.

Inputs are [1, C, 1, 32] activations, i.e. x is [cin, 32] channel-major; the decode rows use one
live lane of the 32. Each timing is the best of --repeat runs of a loop lasting about --min-time.
For 32 lanes, "program ms" times the whole path as well: a compiled one-conv MIL program
evaluated on surfaces (fp16 I/O conversion included).

    python benchmarks/bench_conv.py [--repeat N] [--min-time S] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import orion
from orion._core import kernels
from orion.mil import MilProgram, Type, Value

SHAPES = [(768, 768), (768, 3072), (3072, 768)]  # (cin, cout), GPT-2 124M's projections
SEQ = 32
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def best_time(fn, repeat: int, min_time: float) -> float:
    """Best seconds per call over `repeat` loops of about `min_time` seconds each."""
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    calls = max(1, int(min_time / once))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def conv_program(weight16: np.ndarray) -> orion.Program:
    """A compiled MIL program computing one 1x1 conv on [1, cin, 1, SEQ]."""
    cout, cin = weight16.shape
    p = MilProgram()
    p.add_input("x", Type.tensor("fp16", [1, cin, 1, SEQ]))
    p.add_const("dl", Value.list(Type.tensor("int32", [2]), [1, 1]))
    p.add_const("gr", Value.number("int32", 1))
    p.add_const("pd", Value.list(Type.tensor("int32", [4]), [0, 0, 0, 0]))
    p.add_const("pt", Value.string("valid"))
    p.add_const("st", Value.list(Type.tensor("int32", [2]), [1, 1]))
    p.add_const("w", Value.blob(Type.tensor("fp16", [cout, cin, 1, 1]), "@model_path/weights/w.bin"))
    p.add_op("conv", "y", Type.tensor("fp16", [1, cout, 1, SEQ]),
             [("dilations", "dl"), ("groups", "gr"), ("pad", "pd"), ("pad_type", "pt"), ("strides", "st"),
              ("weight", "w"), ("x", "x")])
    p.outputs = ["y"]
    return orion.compile(orion.mil.emit(p), {"@model_path/weights/w.bin": orion.blobfile.write(weight16)})


def bench_case(cin: int, cout: int, lanes: int, repeat: int, min_time: float) -> dict:
    rng = np.random.default_rng(0)
    weight16 = (rng.standard_normal((cout, cin)) / np.sqrt(cin)).astype(np.float16)
    weight32 = weight16.astype(np.float32)
    x = rng.standard_normal((cin, SEQ)).astype(np.float32)
    x_live = np.ascontiguousarray(x[:, :lanes])
    packed = kernels.PackedConv1x1(weight16)

    got = packed(x, lanes=lanes, round=False)[:, :lanes]
    want = weight32 @ x_live
    err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))

    t_orion = best_time(lambda: packed(x, lanes=lanes, round=True), repeat, min_time)
    t_numpy = best_time(lambda: weight32 @ x_live, repeat, min_time)
    t_program = None
    if lanes == SEQ:
        program = conv_program(weight16)
        inputs, outputs = program.allocate_surfaces()
        inputs["x"].write(x.reshape(1, cin, 1, SEQ))
        t_program = best_time(lambda: program.evaluate(inputs, outputs), repeat, min_time)
    flops = 2.0 * cout * cin * lanes
    return {
        "program_ms": None if t_program is None else t_program * 1e3,
        "cin": cin,
        "cout": cout,
        "seq": SEQ,
        "lanes": lanes,
        "orion_ms": t_orion * 1e3,
        "numpy_ms": t_numpy * 1e3,
        "orion_gflops": flops / t_orion / 1e9,
        "numpy_gflops": flops / t_numpy / 1e9,
        "speedup": t_numpy / t_orion,
        "orion_weight_gbps": cout * cin * 2 / t_orion / 1e9,  # fp16 weights streamed
        "numpy_weight_gbps": cout * cin * 4 / t_numpy / 1e9,  # fp32 weights streamed
        "max_rel_err": err,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed loops per case (best is kept)")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per timed loop")
    parser.add_argument("--json", action="store_true", help="print machine-readable results")
    args = parser.parse_args()

    results = [
        bench_case(cin, cout, lanes, args.repeat, args.min_time) for lanes in (SEQ, 1) for cin, cout in SHAPES
    ]
    info = {
        "simd_path": kernels.simd_path(),
        "num_threads": kernels.num_threads(),
        "numpy": np.__version__,
        "env": {name: os.environ.get(name) for name in BLAS_ENV},
    }
    if args.json:
        print(json.dumps({"info": info, "results": results}, indent=2))
        return

    print(f"simd_path={info['simd_path']}  orion threads={info['num_threads']}  numpy {info['numpy']}")
    for name, value in info["env"].items():
        print(f"  {name}: {'set to ' + repr(value) if value is not None else 'not set'}")
    header = (
        f"{'conv (cin->cout)':>17} {'lanes':>5} | {'orion ms':>9} {'GFLOP/s':>8} {'w GB/s':>7} | "
        f"{'numpy ms':>9} {'GFLOP/s':>8} {'w GB/s':>7} | {'orion/numpy':>11} | {'program ms':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['cin']:>8}->{r['cout']:<8} {r['lanes']:>5} | {r['orion_ms']:>9.4f} {r['orion_gflops']:>8.1f} "
            f"{r['orion_weight_gbps']:>7.1f} | {r['numpy_ms']:>9.4f} {r['numpy_gflops']:>8.1f} "
            f"{r['numpy_weight_gbps']:>7.1f} | {r['speedup']:>10.2f}x | "
            + (f"{r['program_ms']:>10.4f}" if r["program_ms"] is not None else f"{'-':>10}")
        )
    print("orion/numpy = numpy time / orion time (>1: Orion faster); w GB/s = weight bytes streamed per second")


if __name__ == "__main__":
    main()
