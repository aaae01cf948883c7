"""The fp32 numpy side of a training step: embedding gather/scatter, the final norm, the classifier and
cross-entropy, forward and backward. Activations are ``[S, C]`` row-major (token per row)."""

from __future__ import annotations

import numpy as np

from orion import _core
from orion.errors import EvaluateError


def to_channels(x: np.ndarray) -> np.ndarray:
    """``[S, C]`` -> the program layout ``[1, C, 1, S]``."""
    return np.ascontiguousarray(x.T).reshape(1, x.shape[1], 1, x.shape[0])


def from_channels(x: np.ndarray) -> np.ndarray:
    """``[1, C, 1, S]`` -> ``[S, C]`` float32."""
    return np.ascontiguousarray(x[0, :, 0, :].T, dtype=np.float32)


def scatter_rows(table_shape: tuple[int, ...], ids: np.ndarray, d_rows: np.ndarray, into: np.ndarray | None = None
                 ) -> np.ndarray:
    """The gradient of ``table[ids]``: ``d_rows`` summed into the rows ``ids`` of a zero table, by one segmented
    sum over the rows sorted by id (``np.add.reduceat``; ``np.add.at`` adds a row at a time, several times slower).
    With ``into`` (float32 of ``table_shape``) the sums are added to its rows in place and ``into`` is returned:
    no table-sized temporary to fault in and add (a tied embedding's gradient joins the classifier's)."""
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
    sums = np.add.reduceat(np.asarray(d_rows, np.float32)[order], starts, axis=0)
    if into is not None and into.shape == tuple(table_shape) and into.dtype == np.float32:
        into[sorted_ids[starts]] += sums
        return into
    grad = np.zeros(table_shape, np.float32)
    grad[sorted_ids[starts]] = sums
    return grad


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> tuple[np.ndarray, tuple]:
    """LayerNorm over the last axis; returns the output and what :func:`layer_norm_backward` needs."""
    mu = x.mean(-1, keepdims=True)
    r = 1.0 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    x_hat = (x - mu) * r
    return x_hat * gamma + beta, (x_hat, r, gamma)


def layer_norm_backward(dy: np.ndarray, saved: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dx, dgamma, dbeta)``."""
    x_hat, r, gamma = saved
    gy = dy * gamma
    dx = r * (gy - gy.mean(-1, keepdims=True) - x_hat * (gy * x_hat).mean(-1, keepdims=True))
    return dx, (dy * x_hat).sum(0), dy.sum(0)


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> tuple[np.ndarray, tuple]:
    """RMSNorm over the last axis; returns the output and what :func:`rms_norm_backward` needs."""
    r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return x * r * gamma, (x * r, r, gamma)


def rms_norm_backward(dy: np.ndarray, saved: tuple) -> tuple[np.ndarray, np.ndarray]:
    """``(dx, dgamma)``, right for any gamma: dx = r * (gamma dy - x_hat * mean(gamma dy x_hat))."""
    x_hat, r, gamma = saved
    gy = dy * gamma
    return r * (gy - x_hat * (gy * x_hat).mean(-1, keepdims=True)), (dy * x_hat).sum(0)


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, *, transpose_a: bool = False,
           transpose_b: bool = False) -> np.ndarray:
    """``op(a) @ op(b)`` in float32 (``op`` transposes if asked), written into ``out`` (float32, C-contiguous, the
    product's shape; new if None) by the emulator's gemm on its thread pool. The head's products go here, not to
    numpy's BLAS: its worker threads spin on for ~0.1 s after each call, a third core's worth of work on the
    machine the layer programs that follow need whole (measured: 10 gemms of [256, 2048] x [2048, 768] on 2
    threads, 75-79 ms of CPU after 0.5 s idle, 104-112 ms right after a numpy head product)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if out is None:
        out = np.empty((a.shape[1 if transpose_a else 0], b.shape[0 if transpose_b else 1]), np.float32)
    _core.train.matmul(a, b, out, transpose_a, transpose_b)
    return out


def cross_entropy(h: np.ndarray, classifier: np.ndarray, targets: np.ndarray, frozen: bool = False,
                  out: np.ndarray | None = None) -> tuple[float, np.ndarray, np.ndarray | None]:
    """Mean cross-entropy of ``logits = h @ classifier.T`` against ``targets`` (:func:`cross_entropy_of_logits`);
    returns ``(loss, dh, dclassifier)``, dclassifier None when the classifier is ``frozen`` (``out``: see
    :func:`head_backward`)."""
    loss, d_logits = cross_entropy_of_logits(matmul(h, classifier, transpose_b=True), targets)
    return loss, *head_backward(h, classifier, d_logits, frozen, out)


def cross_entropy_of_logits(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of ``logits`` against ``targets`` over the positions whose target is not negative (``-100``,
    PyTorch's ignore_index, marks an untrained position: no loss, zero gradient); returns ``(loss, dlogits)``.

    ``logits`` (float32 ``[S, V]``, C-contiguous) is overwritten: it becomes ``dlogits`` (softmax / kept rows, minus
    1 / kept at each target). One pass on every core (``orion._core.train.cross_entropy``): each row's max,
    exponentials, their sum and the scaling while the row sits in cache (at Stories110M's 256 x 32000 each pass
    over the logits costs milliseconds), rounded as numpy's ``max``/``exp``/``sum``/``*=`` passes round them but
    for the last bits of the exp; the loss in float64 (log-sum-exps, summed in row order)."""
    targets = np.ascontiguousarray(targets, np.int64)
    if not (targets >= 0).any():
        raise EvaluateError("cross_entropy: every target is ignored (negative). Fix: give each window at least one "
                            "trained target")
    return _core.train.cross_entropy(logits, targets), logits


def head_backward(h: np.ndarray, classifier: np.ndarray, d_logits: np.ndarray, frozen: bool = False,
                  out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """``(dh, dclassifier)`` of ``logits = h @ classifier.T``, float32 (:func:`matmul`); dclassifier None (not
    computed: a third of the head's products) when the classifier is ``frozen``. ``out`` (float32, the
    classifier's shape, C-contiguous): dclassifier is written there instead of into new memory, which a step
    would fault in page by page."""
    dh = matmul(d_logits, classifier)
    if frozen:
        return dh, None
    if not (out is not None and out.shape == classifier.shape and out.dtype == np.float32 and out.flags.c_contiguous):
        out = None
    return dh, matmul(d_logits, h, out, transpose_a=True)
