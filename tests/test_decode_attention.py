"""The emulator's fused decode attention (csrc/emulator/decode_attention.h): a decode step's attention of one
query per head over its KV cache plus its own key and value (``blocks.cached_attention``), 19 MIL ops, runs
as one kernel.

It must compute exactly what the ops do, for any data. The unfused twin is the same MIL with one
intermediate (the exponentials) also returned: an intermediate something else reads is never fused. Both
are compared bit for bit, and against a float64 numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from orion.graph import Graph
from orion.models.blocks import cached_attention
from support.twins import RAN_ITS_OPS, kernel_calls, stage_twins

FUSED = "attention (decode, fused)"


def decode_graph(heads: int, d: int, positions: int, lanes: int = 1) -> Graph:
    """q, k, v [1, H*D, 1, L], per-lane caches [1, L*H*D, 1, T] and mask [1, L, 1, T] -> the context."""
    g = Graph("decode_attention")
    c = heads * d
    q, k, v = (g.input(n, [1, c, 1, lanes]) for n in "qkv")
    kc, vc = g.input("kc", [1, lanes * c, 1, positions]), g.input("vc", [1, lanes * c, 1, positions])
    mask = g.input("mask", [1, lanes, 1, positions])
    g.output(cached_attention(g, q, k, v, kc, vc, mask, heads), "y")
    return g



def run_twins(heads: int, d: int, positions: int, filled: int, lanes: int = 1, amplitude: float = 1.0,
              live: int | None = None, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Random inputs (the first ``filled`` positions of each lane's cache unmasked), and output "y" of the
    fused program and of its twin; ``live``: a live-lanes hint on the caches and the mask."""
    fused, unfused = stage_twins(decode_graph(heads, d, positions, lanes), "exp")
    rng = np.random.default_rng(seed)
    xs = {name: (rng.standard_normal(fused.input(name).shape) * amplitude).astype(np.float16)
          for name in ("q", "k", "v", "kc", "vc")}
    xs["mask"] = np.where(np.arange(positions) < filled, 0.0, -65504.0).astype(np.float16) * np.ones((1, lanes, 1, 1),
                                                                                                     np.float16)
    hints = {"kc": live, "vc": live, "mask": live} if live is not None else None
    outs = []
    for stage in (fused, unfused):
        for name, x in xs.items():
            stage.input(name)[...] = x
        calls = kernel_calls(stage, hints)
        assert (FUSED in calls and FUSED + RAN_ITS_OPS not in calls) == (stage is fused), calls
        outs.append(stage.output("y").copy())
    return xs, outs[0], outs[1]


def reference(xs: dict[str, np.ndarray], heads: int, filled: int) -> np.ndarray:
    """float64: per lane and head, softmax over the first ``filled`` cached keys and its own key."""
    c, lanes = xs["q"].shape[1], xs["q"].shape[3]
    d = c // heads
    x = {n: a.astype(np.float64) for n, a in xs.items()}
    out = np.zeros((1, c, 1, lanes))
    for b in range(lanes):
        for h in range(heads):
            rows = slice(h * d, (h + 1) * d)
            cache = slice(b * c + h * d, b * c + (h + 1) * d)
            q = x["q"][0, rows, 0, b]
            keys = np.concatenate([x["kc"][0, cache, 0, :filled], x["k"][0, rows, 0, b:b + 1]], axis=1)
            values = np.concatenate([x["vc"][0, cache, 0, :filled], x["v"][0, rows, 0, b:b + 1]], axis=1)
            s = q @ keys / np.sqrt(d)
            p = np.exp(s - s.max())
            out[0, rows, 0, b] = values @ (p / p.sum())
    return out


def assert_same_bits(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))


@pytest.mark.parametrize("heads, d, positions, filled", [(3, 64, 256, 90), (2, 32, 64, 64), (4, 16, 100, 1)])
def test_decode_attention_is_its_ops_bit_for_bit(heads, d, positions, filled) -> None:
    """Shapes of SmolLM2's head groups, a full cache, and a position count that is no multiple of 8 (the
    matmul kernels' vector tails). Reference: float64, within fp16 rounding of the ~20 steps."""
    xs, fused, unfused = run_twins(heads, d, positions, filled)
    assert_same_bits(fused, unfused)
    np.testing.assert_allclose(fused.astype(np.float64), reference(xs, heads, filled), rtol=0, atol=0.02)


def test_decode_attention_over_several_lanes() -> None:
    """A batched decode step (each lane a sequence with its own cache and mask row): the mask row is
    broadcast over the lane's heads."""
    xs, fused, unfused = run_twins(2, 32, 64, 40, lanes=3)
    assert_same_bits(fused, unfused)
    np.testing.assert_allclose(fused.astype(np.float64), reference(xs, 2, 40), rtol=0, atol=0.02)


def test_decode_attention_with_a_live_lanes_hint() -> None:
    """A cache filled to 40 of 128 positions, declared live on 48 (the hint a decode step gives): the ops
    then score, sum and weigh 48 positions, and so does the kernel. Dead positions hold NaN, never read."""
    heads, d, positions, live = 2, 32, 128, 48
    fused, unfused = stage_twins(decode_graph(heads, d, positions), "exp")
    rng = np.random.default_rng(5)
    xs = {n: rng.standard_normal(fused.input(n).shape).astype(np.float16) for n in ("q", "k", "v", "kc", "vc")}
    for n in ("kc", "vc"):
        xs[n][..., live:] = np.nan
    xs["mask"] = np.where(np.arange(positions) < 40, 0.0, -65504.0).astype(np.float16).reshape(1, 1, 1, positions)
    outs = []
    for stage in (fused, unfused):
        for name, x in xs.items():
            stage.input(name)[...] = x
        stage.run({"kc": live, "vc": live, "mask": live})
        outs.append(stage.output("y").copy())
    assert_same_bits(outs[0], outs[1])
    assert np.isfinite(outs[0]).all()
    np.testing.assert_allclose(outs[0].astype(np.float64), reference(xs, heads, 40), rtol=0, atol=0.02)


def test_decode_attention_overflow_is_the_ops_overflow() -> None:
    """Activations so large that scores overflow fp16 (inf, then NaN in the softmax): the kernel gives the
    ops' bits there too, NaNs and infinities included."""
    _, fused, unfused = run_twins(2, 32, 64, 30, amplitude=300.0, seed=3)
    assert not np.isfinite(unfused).all()  # the case is reached
    assert_same_bits(fused, unfused)


def test_decode_attention_of_dead_sequences_is_not_computed() -> None:
    """A batched step of 4 lanes with 2 live (a live-lanes hint on q, k and v: the loop's dead sequences). The
    kernel computes the live lanes' heads only, as the ops do: their dead inputs hold NaN and are never read,
    and the output is the ops' bit for bit, dead lanes included (the store zeroes both)."""
    heads, d, positions, lanes, live = 2, 32, 64, 4, 2
    fused, unfused = stage_twins(decode_graph(heads, d, positions, lanes), "exp")
    rng = np.random.default_rng(7)
    xs = {n: rng.standard_normal(fused.input(n).shape).astype(np.float16) for n in ("q", "k", "v", "kc", "vc")}
    for n in ("q", "k", "v"):
        xs[n][..., live:] = np.nan
    xs["mask"] = np.where(np.arange(positions) < 30, 0.0, -65504.0).astype(np.float16) * np.ones((1, lanes, 1, 1),
                                                                                                 np.float16)
    outs = []
    for stage in (fused, unfused):
        for name, x in xs.items():
            stage.input(name)[...] = x
        calls = kernel_calls(stage, {"q": live, "k": live, "v": live})
        assert (FUSED in calls and FUSED + RAN_ITS_OPS not in calls) == (stage is fused), calls
        outs.append(stage.output("y").copy())
    assert_same_bits(outs[0], outs[1])
    assert np.isfinite(outs[0][..., :live]).all()
    expected = reference({n: x[..., :live] if n in "qkv" else x for n, x in xs.items()}, heads, 30)
    np.testing.assert_allclose(outs[0][..., :live].astype(np.float64), expected, rtol=0, atol=0.02)
