"""The registry's rms_norm and layer_norm hold, forward and backward, for activations whose naive sum of squares
overflows fp16 (RMS(x) > sqrt(65504 / C)), as a trained model's residual stream does within a few layers
(SmolLM2-135M's reaches |x| = 800 by layer 3). Issue 27: the training graphs used the naive form, so every
fine-tune of a real model trained through norms that returned 0.

References: numpy float64 of the textbook formulas (forward), and central finite differences of it (backward).
Tolerances: forward, each lane to 0.5% of its own largest |value| (fp16 rounding); backward, 3% of the largest
gradient of each lane (the direct rule's fp16 terms).
"""

from __future__ import annotations

import numpy as np
import pytest

from orion import Graph, compile_graph
from orion.autodiff import backward

C, S = 256, 32  # sum(x^2) overflows fp16 once RMS(x) > 16 at C = 256
EPS = 1e-5
RNG = np.random.default_rng(0)
GAMMA = RNG.uniform(0.5, 1.5, C)
BETA = RNG.uniform(-1, 1, C)


def _activations() -> np.ndarray:
    """``[C, S]`` fp16 values: lanes with RMS 40 (past the limit), lanes up to 60000 and tiny lanes."""
    scale = np.concatenate([np.full(S // 2, 40.0), np.geomspace(1e-4, 1.5e4, S // 2)])
    return (RNG.standard_normal((C, S)) * scale).clip(-6e4, 6e4).astype(np.float16).astype(np.float64)


def _reference(x: np.ndarray, center: bool) -> np.ndarray:
    """The norm of ``x`` ``[C, S]`` over its channels, in float64."""
    if center:
        x = x - x.mean(axis=0, keepdims=True)
        return x / np.sqrt((x**2).mean(axis=0, keepdims=True) + EPS) * GAMMA[:, None] + BETA[:, None]
    return x / np.sqrt((x**2).mean(axis=0, keepdims=True) + EPS) * GAMMA[:, None]


def _graph(center: bool) -> Graph:
    g = Graph("layer_norm" if center else "rms_norm")
    x = g.input("x", [1, C, 1, S])
    g.output(g.layer_norm(x, GAMMA, BETA, EPS) if center else g.rms_norm(x, GAMMA, EPS), "y")
    return g


def _per_lane_close(got: np.ndarray, want: np.ndarray, fraction: float) -> None:
    for lane in range(want.shape[1]):
        scale = float(np.abs(want[:, lane]).max())
        np.testing.assert_allclose(got[:, lane], want[:, lane], rtol=0, atol=fraction * scale, err_msg=f"lane {lane}")


def test_the_inputs_overflow_the_naive_form() -> None:
    """What the test inputs do to the textbook graph: sum(x^2) = inf, so rstd = 0 and the output is 0."""
    x = _activations()
    g = Graph("naive")
    xi = g.input("x", [1, C, 1, S])
    mean_sq = g.mul(g.reduce_sum(g.mul(xi, xi), 1), 1.0 / C)
    g.output(g.mul(xi, g.pow(g.add(mean_sq, EPS), -0.5)), "y")
    naive = compile_graph(g)(x=x[None, :, None, :])["y"][0, :, 0, :]
    assert np.all(naive[:, : S // 2] == 0)


@pytest.mark.parametrize("center", [False, True], ids=["rms_norm", "layer_norm"])
def test_norm_holds_past_the_naive_overflow(center: bool) -> None:
    x = _activations()
    got = compile_graph(_graph(center))(x=x[None, :, None, :])["y"][0, :, 0, :]
    _per_lane_close(got, _reference(x, center), 0.005)


@pytest.mark.parametrize("center", [False, True], ids=["rms_norm", "layer_norm"])
def test_norm_gradient_holds_past_the_naive_overflow(center: bool) -> None:
    """d/dx of sum(norm(x) * r), compiled in fp16, against float64 central differences (lanes of RMS 40 and the
    tiny ones; a lane's gradient scales as 1/RMS, so each lane is compared to its own scale)."""
    x = _activations()
    r = RNG.uniform(-1, 1, (C, S))
    got = compile_graph(backward(_graph(center), ["x"]))(x=x[None, :, None, :], grad_y=r[None, :, None, :])
    got = got["grad_x"][0, :, 0, :]
    want = np.zeros((C, S))
    for c in range(C):
        step = np.maximum(np.abs(x[c]) * 1e-6, 1e-9)
        up, down = x.copy(), x.copy()
        up[c] += step
        down[c] -= step
        want[c] = ((_reference(up, center) - _reference(down, center)) * r).sum(axis=0) / (2 * step)
    _per_lane_close(got, want, 0.03)
