"""An independent float64 numpy Gemma 2 / Gemma 3 (text), written from transformers' Gemma2ForCausalLM and
Gemma3ForCausalLM (eager attention).

It reads a GemmaConfig and GemmaWeights (plain arrays: projections [out, in], norms as stored, the w of 1 + w)
and nothing else of Orion. RoPE rotates complex pairs (i, i + head_dim/2); a sliding layer sees the keys t with
p - window < t <= p; grouped-query attention repeats each KV head for its group (head h reads KV head h // group).
Float64 throughout, so a residual stream far beyond fp16's range is computed exactly.
"""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Gemma's RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * (1 + w)."""
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (1.0 + w.astype(np.float64))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def rope(x: np.ndarray, positions: np.ndarray, theta: float, factor: float) -> np.ndarray:
    """Rotate x [T, heads, head_dim] (rotate-half pairs) at ``positions / factor``."""
    d = x.shape[-1]
    freqs = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d) / factor
    angle = np.exp(1j * np.outer(positions, freqs))[:, None, :]
    turned = (x[..., : d // 2] + 1j * x[..., d // 2:]) * angle
    return np.concatenate([turned.real, turned.imag], axis=-1)


def layer_forward(config, index: int, layer, x: np.ndarray) -> np.ndarray:
    """Decoder layer ``index`` over hidden states x [T, dim] at positions 0..T-1."""
    t = x.shape[0]
    hd, nh, nkv = config.head_dim, config.n_heads, config.n_kv_heads
    eps = config.rms_norm_eps
    h = rms_norm(x, layer.attn_norm, eps)
    q = (h @ layer.wq.T.astype(np.float64)).reshape(t, nh, hd)
    k = (h @ layer.wk.T.astype(np.float64)).reshape(t, nkv, hd)
    v = (h @ layer.wv.T.astype(np.float64)).reshape(t, nkv, hd)
    if config.qk_norm:
        q, k = rms_norm(q, layer.q_norm, eps), rms_norm(k, layer.k_norm, eps)
    sliding = index in config.sliding_layers
    if config.model_type == "gemma3_text" and sliding:
        theta, factor = config.rope_local_theta, 1.0
    else:
        theta, factor = config.rope_theta, config.rope_linear_factor
    positions = np.arange(t)
    q, k = rope(q, positions, theta, factor), rope(k, positions, theta, factor)
    group = nh // nkv
    kh, vh = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("shd,thd->hst", q, kh) * config.query_pre_attn_scalar ** -0.5
    if config.attn_softcap is not None:
        scores = np.tanh(scores / config.attn_softcap) * config.attn_softcap
    seen = np.tril(np.ones((t, t), bool))
    if sliding and config.sliding_window is not None:
        seen &= np.arange(t)[None, :] > np.arange(t)[:, None] - config.sliding_window
    scores = np.where(seen, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ctx = np.einsum("hst,thd->shd", probs, vh).reshape(t, nh * hd)
    x = x + rms_norm(ctx @ layer.wo.T.astype(np.float64), layer.attn_post_norm, eps)
    h = rms_norm(x, layer.mlp_norm, eps)
    mlp = (gelu_tanh(h @ layer.w_gate.T.astype(np.float64)) * (h @ layer.w_up.T.astype(np.float64))) @ layer.w_down.T
    return x + rms_norm(mlp, layer.mlp_post_norm, eps)


def reference_logits(config, weights, ids, residuals: list | None = None) -> np.ndarray:
    """Logits [T, vocab_size] (float64) for token ids at positions 0..T-1; ``residuals`` (a list) collects the
    residual stream after each layer."""
    ids = np.asarray(ids, dtype=np.int64)
    x = weights.embed[ids].astype(np.float64) * np.float32(np.sqrt(config.dim))
    for i, layer in enumerate(weights.layers):
        x = layer_forward(config, i, layer, x)
        if residuals is not None:
            residuals.append(x)
    logits = rms_norm(x, weights.norm, config.rms_norm_eps) @ weights.classifier.T.astype(np.float64)
    if config.final_softcap is not None:
        logits = np.tanh(logits / config.final_softcap) * config.final_softcap
    return logits
