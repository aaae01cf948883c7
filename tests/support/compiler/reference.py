"""Independent numpy references, written from the textbook formulas on [C, S] matrices."""

from __future__ import annotations

import math

import numpy as np


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU with erf (the compiler uses the tanh approximation)."""
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """Normalize each column (token) of ``x[C, S]`` over channels."""
    mu = x.mean(axis=0)
    var = x.var(axis=0)
    return (x - mu) / np.sqrt(var + eps) * gamma[:, None] + beta[:, None]


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x**2).mean(axis=0) + eps) * gamma[:, None]


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int, causal: bool = True) -> np.ndarray:
    """``q, k, v[D, S]`` -> ``[D, S]``, head h owning channels ``h*hd .. (h+1)*hd - 1``."""
    d, s = q.shape
    hd = d // heads
    out = np.zeros_like(q)
    for h in range(heads):
        rows = slice(h * hd, (h + 1) * hd)
        qt, kt, vt = q[rows].T, k[rows].T, v[rows].T  # [S, hd]
        scores = qt @ kt.T / math.sqrt(hd)
        if causal:
            scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[rows] = (p @ vt).T
    return out


def cs(a: np.ndarray) -> np.ndarray:
    """``[1, C, 1, S]`` -> ``[C, S]``."""
    return a[0, :, 0, :]


def tensor(a: np.ndarray) -> np.ndarray:
    """``[C, S]`` -> ``[1, C, 1, S]``."""
    return a[None, :, None, :]
