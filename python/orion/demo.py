"""The built-in demo: a GPT-2-sized MLP block written as a MIL program, compiled, run and checked.

It shows the whole low-level flow: build a ``orion.mil.MilProgram`` -> emit MIL text + BLOBFILE
weights -> ``orion.compile`` -> evaluate on surfaces -> compare with numpy fp32.
"""

from __future__ import annotations

import time

import numpy as np

import orion
from orion.mil import MilProgram, Type, Value


def mlp_program(channels: int, hidden: int, lanes: int) -> MilProgram:
    """x [1, C, 1, S] -> conv(W_up) -> tanh GELU -> conv(W_down) -> + x, all fp16."""
    act, wide = Type.tensor("fp16", [1, channels, 1, lanes]), Type.tensor("fp16", [1, hidden, 1, lanes])
    p = MilProgram()
    p.add_input("x", act)
    p.add_const("dl", Value.list(Type.tensor("int32", [2]), [1, 1]))
    p.add_const("gr", Value.number("int32", 1))
    p.add_const("pd", Value.list(Type.tensor("int32", [4]), [0, 0, 0, 0]))
    p.add_const("pt", Value.string("valid"))
    p.add_const("st", Value.list(Type.tensor("int32", [2]), [1, 1]))
    for name, shape in (("w_up", [hidden, channels, 1, 1]), ("w_down", [channels, hidden, 1, 1])):
        p.add_const(name, Value.blob(Type.tensor("fp16", shape), f"@model_path/weights/{name}.bin"))
    for name, value in (("c3", 0.044715), ("k", 0.7978845608), ("half", 0.5), ("one", 1.0)):
        p.add_const(name, Value.number("fp16", value))
    conv = [("dilations", "dl"), ("groups", "gr"), ("pad", "pd"), ("pad_type", "pt"), ("strides", "st")]
    p.add_op("conv", "up", wide, conv + [("weight", "w_up"), ("x", "x")])
    for out, op, x, y in (("u2", "mul", "up", "up"), ("u3", "mul", "u2", "up"), ("cu3", "mul", "u3", "c3"),
                          ("inner", "add", "up", "cu3"), ("scaled", "mul", "inner", "k")):
        p.add_op(op, out, wide, [("x", x), ("y", y)])
    p.add_op("tanh", "th", wide, [("x", "scaled")])
    for out, op, x, y in (("onep", "add", "th", "one"), ("hu", "mul", "up", "half"), ("gelu", "mul", "hu", "onep")):
        p.add_op(op, out, wide, [("x", x), ("y", y)])
    p.add_op("conv", "down", act, conv + [("weight", "w_down"), ("x", "gelu")])
    p.add_op("add", "y", act, [("x", "x"), ("y", "down")])
    p.outputs = ["y"]
    return p


def reference(x: np.ndarray, w_up: np.ndarray, w_down: np.ndarray) -> np.ndarray:
    v = x[0, :, 0, :].astype(np.float32)
    u = w_up[:, :, 0, 0].astype(np.float32) @ v
    g = 0.5 * u * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (u + 0.044715 * u**3)))
    return (v + w_down[:, :, 0, 0].astype(np.float32) @ g)[None, :, None, :]


def main(channels: int = 768, hidden: int = 3072, lanes: int = 32, iterations: int = 50) -> int:
    rng = np.random.default_rng(0)
    w_up = (rng.standard_normal((hidden, channels, 1, 1)) / np.sqrt(channels)).astype(np.float16)
    w_down = (rng.standard_normal((channels, hidden, 1, 1)) / np.sqrt(hidden)).astype(np.float16)
    x = rng.standard_normal((1, channels, 1, lanes)).astype(np.float16)

    text = orion.mil.emit(mlp_program(channels, hidden, lanes))
    weights = {f"@model_path/weights/{n}.bin": orion.blobfile.write(w) for n, w in (("w_up", w_up), ("w_down", w_down))}
    print(f"backend: {orion.backend()}  |  GPT-2 MLP block C={channels} H={hidden} lanes={lanes}  |  "
          f"MIL {len(text.splitlines())} lines, weights {sum(map(len, weights.values())) / 1e6:.1f} MB")
    start = time.perf_counter()
    program = orion.compile(text, weights)
    print(f"compiled in {(time.perf_counter() - start) * 1e3:.1f} ms (compile {orion.compile_count()} of "
          f"{orion.compile_budget()} this process)")

    inputs, outputs = program.allocate_surfaces()
    inputs["x"].write(x)
    program.evaluate(inputs, outputs)
    error = float(np.abs(outputs["y"].array.astype(np.float32) - reference(x, w_up, w_down)).max())
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        program.evaluate(inputs, outputs)
        times.append(time.perf_counter() - start)
    best, median = min(times), float(np.median(times))
    flops = 2 * 2 * channels * hidden * lanes
    print(f"evaluate: median {median * 1e3:.2f} ms, best {best * 1e3:.2f} ms, {flops / median / 1e9:.1f} GFLOP/s "
          f"over {iterations} runs")
    ok = error < 0.05
    print(f"max |orion - numpy fp32| = {error:.4f}  ({'OK' if ok else 'MISMATCH'}, tolerance 0.05)")
    program.unload()
    return 0 if ok else 1
