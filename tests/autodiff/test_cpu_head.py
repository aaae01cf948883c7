"""The CPU head's fp32 products (``orion.autodiff.cpu.matmul`` on the emulator's gemm) and the cross-entropy built
on them, against numpy float64."""

from __future__ import annotations

import numpy as np
import pytest

from orion.autodiff import cpu
from orion.errors import EvaluateError
from orion.train.errors import TrainError


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 300, 13), (37, 50, 300), (256, 96, 1000)])
def test_matmul_matches_float64(shape, transpose_a, transpose_b) -> None:
    m, k, n = shape
    rng = np.random.default_rng(m * k + n)
    a = rng.standard_normal((k, m) if transpose_a else (m, k), dtype=np.float32)
    b = rng.standard_normal((n, k) if transpose_b else (k, n), dtype=np.float32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (a64.T if transpose_a else a64) @ (b64.T if transpose_b else b64)
    got = cpu.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
    assert got.shape == (m, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-6 * np.sqrt(k) * np.abs(want).max() + 1e-6)
    out = np.full((m, n), np.nan, np.float32)  # written whole: no NaN left
    assert cpu.matmul(a, b, out, transpose_a=transpose_a, transpose_b=transpose_b) is out
    np.testing.assert_array_equal(out, got)


def test_matmul_reads_strided_views() -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((40, 60), dtype=np.float32)
    b = rng.standard_normal((90, 50), dtype=np.float32)
    got = cpu.matmul(a[::2, 5:35], b[10:40:1, ::2])  # [20, 30] @ [30, 25], neither contiguous
    want = a[::2, 5:35].astype(np.float64) @ b[10:40, ::2].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("bad, message", [
    (lambda a, b: cpu.matmul(a, b.T), "inner sizes must match"),
    (lambda a, b: cpu.matmul(a, b, np.empty((3, 3), np.float32)), "out has shape"),
    (lambda a, b: cpu.matmul(a, b, np.empty((4, 6), np.float64)), "float32"),
    (lambda a, b: cpu.matmul(a, b, np.empty((6, 4), np.float32).T), "C-contiguous"),
])
def test_matmul_refuses_bad_operands(bad, message) -> None:
    a, b = np.ones((4, 5), np.float32), np.ones((5, 6), np.float32)
    with pytest.raises(TrainError, match=message):
        bad(a, b)


@pytest.mark.parametrize("frozen", [False, True])
def test_cross_entropy_matches_float64(frozen) -> None:
    rng = np.random.default_rng(7)
    s, c, v = 37, 50, 300
    h = rng.standard_normal((s, c), dtype=np.float32)
    w = rng.standard_normal((v, c), dtype=np.float32)
    targets = rng.integers(0, v, s)
    targets[3] = -100  # ignored position
    h64, w64 = h.astype(np.float64), w.astype(np.float64)
    logits = h64 @ w64.T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    kept = np.flatnonzero(targets >= 0)
    loss = -np.log(p[kept, targets[kept]]).mean()
    d = p.copy()
    d[kept, targets[kept]] -= 1.0
    d[targets < 0] = 0.0
    d /= len(kept)
    out = np.full((v, c), np.nan, np.float32)
    got_loss, dh, dw = cpu.cross_entropy(h, w, targets, frozen, out)
    assert got_loss == pytest.approx(loss, rel=1e-6)
    np.testing.assert_allclose(dh, d @ w64, rtol=0, atol=1e-6)
    if frozen:
        assert dw is None and np.isnan(out).all()
    else:
        assert dw is out
        np.testing.assert_allclose(dw, d.T @ h64, rtol=0, atol=1e-6)


@pytest.mark.parametrize("logits, targets, error, message", [
    (np.zeros((3, 5), np.float32), np.array([0, 5, 1]), TrainError, "outside the vocabulary of 5"),
    (np.zeros((3, 5), np.float64), np.array([0, 1, 1]), TrainError, "float32"),
    (np.zeros((3, 5), np.float32), np.array([0, 1]), TrainError, "positions"),
    (np.zeros((3, 5), np.float32), np.array([-100, -100, -1]), EvaluateError, "every target is ignored"),
])
def test_cross_entropy_refuses_bad_input_untouched(logits, targets, error, message) -> None:
    before = logits.copy()
    with pytest.raises(error, match=message):
        cpu.cross_entropy_of_logits(logits, targets)
    np.testing.assert_array_equal(logits, before)
