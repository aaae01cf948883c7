"""Outputs the I/O padding writes as add(all-zero const [1, k, 1, W], value [1, 1, 1, W]) -- the value in
every row -- are computed as one row and stored by copying it (csrc/emulator/emulator.cpp,
find_replicated_outputs). The whole surface must be what the add computes: every row x + 0 in fp16 (so -0
becomes +0, infinities stay), checked against numpy and against the same MIL with the add's result passed
through an identity (which takes the general path)."""

from __future__ import annotations

import numpy as np
import pytest

import orion
from support.handmil import blob_const, blobfile, const, op, program, ttype

K, W = 6, 64
ZEROS = "@model_path/weights/zeros.bin"


def padded_output(zero_bits: int, through_identity: bool) -> str:
    row, padded = ttype("fp16", (1, 1, 1, W)), ttype("fp16", (1, K, 1, W))
    body = [blob_const("zeros", "fp16", (1, K, 1, W), ZEROS), const("two", "fp16", 2.0)]
    body.append(op("h", row, "mul", x="x", y="two"))
    body.append(op("y_raw" if through_identity else "y", padded, "add", x="zeros", y="h"))
    if through_identity:
        body.append(op("y", padded, "identity", x="y_raw"))
    return program({"x": row}, body, ["y"]), {ZEROS: blobfile(np.full((K, W), zero_bits, np.uint16).tobytes())}


@pytest.mark.parametrize("zero_bits", [0x0000, 0x8000], ids=["+0 pad (replicated)", "-0 pad (general path)"])
def test_padded_outputs_hold_the_add_in_every_row(zero_bits: int) -> None:
    x = np.random.default_rng(1).standard_normal((1, 1, 1, W)).astype(np.float16)
    x[0, 0, 0, :3] = [-0.0, np.inf, -np.inf]  # (inputs may not hold NaN)
    x[0, 0, 0, 4] = 40000.0  # doubles to inf in fp16
    zero = np.uint16(zero_bits).view(np.float16)
    with np.errstate(over="ignore"):  # 40000 * 2 is inf in fp16, as on the ANE
        want = np.broadcast_to(zero + (x * np.float16(2)), (1, K, 1, W))  # numpy: fp16 ops, as the MIL says
    got = {}
    for twin in (False, True):
        text, weights = padded_output(zero_bits, twin)
        got[twin] = orion.compile(text, weights)(x=x)["y"]
        np.testing.assert_array_equal(got[twin].view(np.uint16), want.view(np.uint16))
    assert np.signbit(got[False][0, :, 0, 0]).tolist() == [zero_bits == 0x8000] * K  # -0 + (+0) is +0
