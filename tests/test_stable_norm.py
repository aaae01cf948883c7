"""The emulator's fused stable norm (csrc/emulator/stable_norm.h): LayerNorm's and RMSNorm's overflow-safe
normalization of [1, C, 1, S] (ops/reduction.py stable_norm, 17 or 20 MIL ops) runs as one kernel: a decode
step's few lanes in one pass, a prompt's in blocks of 64 lanes.

It must compute exactly what the ops do, for any data. The unfused twin is the same MIL with one
intermediate (the rstd) also returned: an intermediate something else reads is never fused. Both are
compared bit for bit, and against a float64 numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from orion.graph import Graph
from support.twins import RAN_ITS_OPS, kernel_calls, stage_twins

FUSED = "norm (fused)"
EPS = 1e-5


def norm_graph(kind: str, channels: int, lanes: int, gamma: np.ndarray, beta: np.ndarray) -> Graph:
    g = Graph("norm")
    x = g.input("x", [1, channels, 1, lanes])
    y = g.rms_norm(x, gamma, EPS) if kind == "rms" else g.layer_norm(x, gamma, beta, EPS)
    g.output(y, "y")
    return g



def run_twins(kind: str, channels: int, lanes: int, x: np.ndarray, uniform: bool = False,
              live: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Output "y" of the fused program and of its twin on x, and the norm's parameters (random, or with
    ``uniform`` one value each, which the emulator holds as a single value); ``live``: a live-lanes hint on x."""
    rng = np.random.default_rng(1)
    gamma, beta = (rng.standard_normal(channels).astype(np.float16) for _ in range(2))
    if uniform:
        gamma, beta = np.full(channels, 1.5, np.float16), np.full(channels, 0.25, np.float16)
    fused, unfused = stage_twins(norm_graph(kind, channels, lanes, gamma, beta), "pow", "_rstd")
    outs = []
    for stage in (fused, unfused):
        stage.input("x")[...] = x
        calls = kernel_calls(stage, None if live is None else {"x": live})
        assert (FUSED in calls and FUSED + RAN_ITS_OPS not in calls) == (stage is fused), calls
        outs.append(stage.output("y").copy())
    return outs[0], outs[1], gamma, beta


def reference(kind: str, x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    g, b = gamma.astype(np.float64).reshape(1, -1, 1, 1), beta.astype(np.float64).reshape(1, -1, 1, 1)
    if kind == "rms":
        return x / np.sqrt((x**2).mean(axis=1, keepdims=True) + EPS) * g
    mu, var = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(var + EPS) * g + b


def assert_same_bits(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("channels, lanes, amplitude", [(576, 1, 1.0), (96, 3, 1.0), (64, 1, 3000.0)])
def test_stable_norm_is_its_ops_bit_for_bit(kind, channels, lanes, amplitude) -> None:
    """SmolLM2's width for one sequence, a few sequences, and a residual stream far past where squaring
    overflows fp16 (the case the stable form exists for). Reference: float64, within fp16 rounding."""
    x = (np.random.default_rng(channels).standard_normal((1, channels, 1, lanes)) * amplitude).astype(np.float16)
    fused, unfused, gamma, beta = run_twins(kind, channels, lanes, x)
    assert_same_bits(fused, unfused)
    want = reference(kind, x, gamma, beta)
    np.testing.assert_allclose(fused.astype(np.float64), want, rtol=0, atol=0.01 * np.abs(want).max())


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_stable_norm_of_zeros_and_non_finite_values_is_the_ops(kind) -> None:
    """A zero lane, a lane with an infinity and one with a NaN: the kernel gives the ops' bits, NaNs included."""
    x = np.random.default_rng(2).standard_normal((1, 32, 1, 3)).astype(np.float16)
    x[..., 0] = 0
    x[0, 5, 0, 1] = np.inf
    x[0, 7, 0, 2] = np.nan
    fused, unfused, _, _ = run_twins(kind, 32, 3, x)
    assert_same_bits(fused, unfused)


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_stable_norm_with_uniform_parameters(kind) -> None:
    """gamma and beta each one value repeated (a fresh model's ones): held as one value, read for every channel."""
    x = np.random.default_rng(3).standard_normal((1, 48, 1, 2)).astype(np.float16)
    fused, unfused, gamma, beta = run_twins(kind, 48, 2, x, uniform=True)
    assert_same_bits(fused, unfused)
    want = reference(kind, x, gamma, beta)
    np.testing.assert_allclose(fused.astype(np.float64), want, rtol=0, atol=0.01 * np.abs(want).max())


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_stable_norm_of_a_batched_step_with_dead_sequences(kind) -> None:
    """8 lanes, 3 live (the loop's hint on a batched step's dead sequences), NaN in the dead ones: the kernel
    still runs, and the live lanes are the ops' bit for bit (dead lanes are undefined for both)."""
    x = np.random.default_rng(4).standard_normal((1, 64, 1, 8)).astype(np.float16)
    x[..., 3:] = np.nan
    fused, unfused, gamma, beta = run_twins(kind, 64, 8, x, live=3)
    assert_same_bits(fused[..., :3], unfused[..., :3])
    want = reference(kind, x[..., :3], gamma, beta)
    np.testing.assert_allclose(fused[..., :3].astype(np.float64), want, rtol=0, atol=0.01 * np.abs(want).max())


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("live", [None, 150])
def test_stable_norm_of_a_prompt_in_blocks_of_lanes(kind, live) -> None:
    """200 lanes (three blocks of 64 and one of 8), all live or 150 (a prompt shorter than its bucket, NaN past it):
    the live lanes are the ops' bit for bit, and match float64 within fp16 rounding."""
    x = (np.random.default_rng(5).standard_normal((1, 96, 1, 200)) * 40).astype(np.float16)
    n = 200 if live is None else live
    x[..., n:] = np.nan
    fused, unfused, gamma, beta = run_twins(kind, 96, 200, x, live=live)
    assert_same_bits(fused[..., :n], unfused[..., :n])
    want = reference(kind, x[..., :n], gamma, beta)
    np.testing.assert_allclose(fused[..., :n].astype(np.float64), want, rtol=0, atol=0.01 * np.abs(want).max())
