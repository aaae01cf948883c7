"""A small weighted program (1x1 conv + bias add) for the weight-update and harness tests: its two weights
in one BLOBFILE, as Orion writes a program's weights (the weight patch is verified for one file)."""

from __future__ import annotations

import numpy as np

from support.handmil import blob_const, blobfile_many, const, op, program, ttype

C, S = 64, 32
ACT = (1, C, 1, S)
W_PATH = "@model_path/weights/weights.bin"
W_OFFSET, B_OFFSET = 64, 64 + 64 + C * C * 2  # the second chunk right after the first (8,192 bytes: aligned)
T = ttype("fp16", ACT)
TEXT = program(
    {"x": T},
    [
        blob_const("W", "fp16", (C, C, 1, 1), W_PATH, W_OFFSET),
        blob_const("B", "fp16", (1, C, 1, 1), W_PATH, B_OFFSET),
        const("dl", "int32", [1, 1], [2]), const("gr", "int32", 1), const("pd", "int32", [0, 0, 0, 0], [4]),
        const("pt", "string", "valid"), const("st", "int32", [1, 1], [2]),
        op("c", T, "conv", dilations="dl", groups="gr", pad="pd", pad_type="pt", strides="st", weight="W", x="x"),
        op("y", T, "add", x="c", y="B"),
    ],
    ["y"],
)


def weights(seed: int) -> tuple[dict[str, bytes], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((C, C)) / 8).astype(np.float16)
    b = rng.standard_normal(C).astype(np.float16)
    data, offsets = blobfile_many([w.tobytes(), b.tobytes()])
    assert offsets == [W_OFFSET, B_OFFSET]
    return {W_PATH: data}, w, b


def reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (w.astype(np.float32) @ x[0, :, 0, :].astype(np.float32) + b.astype(np.float32)[:, None])[None, :, None, :]
