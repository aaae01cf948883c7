"""The emulator's profiler (orion.runtime.profile), and the memory savings it led to: pooled
intermediate buffers and repeated const blocks held once, both checked against numpy."""

from __future__ import annotations

import time

import numpy as np
import pytest

import orion
from orion.runtime import profile
from support.handmil import SEVERAL_SURFACES, blob_const, blobfile, const, op, program, ttype

M, K, N = 8, 32, 64


def small_program(m: int = M, n: int = N) -> str:
    """matmul -> add -> softmax over the last axis -> mul: four op kinds."""
    out = ttype("fp16", [1, 1, m, n])
    return program(
        {"x": ttype("fp16", [1, 1, m, K]), "y": ttype("fp16", [1, 1, K, n])},
        [const("tf", "bool", False), const("half", "fp16", 0.5), const("last", "int32", -1),
         op("mm", out, "matmul", x="x", y="y", transpose_x="tf", transpose_y="tf"),
         op("b", out, "add", x="mm", y="half"),
         op("p", out, "softmax", x="b", axis="last"),
         op("z", out, "mul", x="p", y="half")],
        ["z"])


def inputs(seed: int = 0, m: int = M, n: int = N) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((1, 1, m, K)).astype(np.float16),
            "y": rng.standard_normal((1, 1, K, n)).astype(np.float16)}


def test_profile_reports_each_op_kind_with_costs_that_add_up(profiling) -> None:
    p = orion.compile(small_program(), **SEVERAL_SURFACES)
    ins, outs = p.allocate_surfaces()
    for name, value in inputs().items():
        ins[name].write(value)
    runs = 3
    start = time.perf_counter()
    for _ in range(runs):
        p.evaluate(ins, outs)
    wall = time.perf_counter() - start
    rows = profile.snapshot()
    by_op = {r.op: r for r in rows}
    assert set(by_op) == {"matmul", "add", "softmax", "mul", "(io)"}
    assert len({r.program for r in rows}) == 1
    for r in rows:
        assert r.calls == runs and r.seconds >= 0.0 and r.bytes > 0
    assert sum(r.seconds for r in rows) <= wall  # the parts are timed inside the evaluates
    # FLOPs and bytes from the shapes, written out here: 2*M*N*K per matmul, one per element else.
    assert by_op["matmul"].flops == runs * 2 * M * N * K
    assert by_op["add"].flops == by_op["softmax"].flops == runs * M * N
    assert by_op["matmul"].bytes == runs * 2 * (M * K + K * N + M * N)  # fp16 operands and result
    assert by_op["softmax"].bytes == runs * 2 * 2 * M * N
    assert by_op["(io)"].bytes == runs * 2 * (M * K + K * N + M * N)
    assert by_op["matmul"].gflops == pytest.approx(by_op["matmul"].flops / by_op["matmul"].seconds / 1e9)
    text = profile.table()
    assert "matmul" in text and "softmax" in text and "GFLOP/s" in text
    profile.reset()
    assert profile.snapshot() == []


def test_nothing_is_recorded_while_off() -> None:
    profile.enable(False)
    profile.reset()
    orion.compile(small_program(), **SEVERAL_SURFACES)(**inputs())
    assert profile.snapshot() == []


def test_pooled_intermediates_give_the_numpy_result_on_every_evaluate() -> None:
    """The chain's intermediates (256 KiB of fp32 each, large enough to be pooled) share pooled
    buffers: repeated evaluates, interleaved with another program of the same shapes, keep matching
    the reference."""
    m, n = 256, 256
    first, second = orion.compile(small_program(m, n), **SEVERAL_SURFACES), orion.compile(small_program(m, n), **SEVERAL_SURFACES)
    for seed in range(3):
        for p in (first, second):
            given = inputs(seed, m, n)
            mm = (given["x"][0, 0].astype(np.float32) @ given["y"][0, 0].astype(np.float32)).astype(np.float16)
            b = (mm.astype(np.float32) + 0.5).astype(np.float16).astype(np.float32)
            e = np.exp(b - b.max(axis=-1, keepdims=True))
            want = ((e / e.sum(axis=-1, keepdims=True)).astype(np.float16).astype(np.float32) * 0.5)
            got = np.asarray(p(**given)["z"], dtype=np.float32)
            np.testing.assert_allclose(got.reshape(m, n), want, rtol=2e-3, atol=1e-6)


H, S = 3, 32


def mask_program(reader: str) -> str:
    """x [1, H, S, S] plus a per-head repeated causal mask from a BLOBFILE; `reader` names the op
    that reads the mask besides the add ("none" or "matmul": then it must stay whole)."""
    t = ttype("fp16", [1, H, S, S])
    body = [blob_const("mask", "fp16", [1, H, S, S], "@model_path/weights/mask.bin"),
            op("masked", t, "add", x="x", y="mask")]
    outputs = ["masked"]
    if reader == "matmul":
        body += [const("tf", "bool", False), op("mm", t, "matmul", x="x", y="mask", transpose_x="tf", transpose_y="tf")]
        outputs.append("mm")
    return program({"x": t}, body, outputs)


@pytest.mark.parametrize("reader", ["none", "matmul"])
def test_a_repeated_mask_const_gives_the_numpy_result(reader, profiling) -> None:
    causal = np.triu(np.full((S, S), -100.0, np.float16), 1)  # small enough for the matmul to stay finite
    mask = np.broadcast_to(causal, (1, H, S, S)).copy()
    mask[0, :, 0, 0] = np.float16(0.25)  # a nonzero entry inside the repeated block
    p = orion.compile(mask_program(reader), {"@model_path/weights/mask.bin": blobfile(mask.tobytes())})
    x = np.random.default_rng(1).standard_normal((1, H, S, S)).astype(np.float16)
    out = p(x=x)
    got = out["masked"]
    want = (x.astype(np.float32) + mask.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(np.asarray(got), want)
    # The add reads one [S, S] block when only broadcasting ops read the mask, all H heads otherwise.
    mask_bytes = 2 * S * S * (1 if reader == "none" else H)
    add = next(r for r in profile.snapshot() if r.op == "add")
    assert add.bytes == 2 * 2 * H * S * S + mask_bytes
    if reader == "matmul":
        want_mm = np.matmul(x.astype(np.float32), mask.astype(np.float32)).astype(np.float16)
        np.testing.assert_allclose(np.asarray(out["mm"], np.float32), want_mm.astype(np.float32), rtol=2e-3, atol=2e-3)
