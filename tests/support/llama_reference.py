"""An independent float32 numpy Llama, written from llama2.c's model.py and Hugging Face's LlamaForCausalLM.

It reads a LlamaConfig and LlamaWeights (plain arrays: projections [out, in]) and nothing else of Orion.
RoPE is computed as complex rotation of channel pairs: (2i, 2i+1) for the interleaved convention,
(i, i + head_dim/2) for rotate-half. Grouped-query attention repeats each KV head for its group of
query heads (head h reads KV head h // group), as transformers' repeat_kv does.
"""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, gain: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * gain over the last axis, computed in float64 (exact for any fp16 input)."""
    x64 = x.astype(np.float64)
    return (x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * gain).astype(np.float32)


def rope(x: np.ndarray, positions: np.ndarray, theta: float, convention: str) -> np.ndarray:
    """Rotate x [T, heads, head_dim] for positions [T] as complex pairs."""
    d = x.shape[-1]
    freqs = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)           # [d/2]
    angle = np.exp(1j * np.outer(positions, freqs))[:, None, :]             # [T, 1, d/2]
    if convention == "interleaved":
        pairs = x[..., 0::2] + 1j * x[..., 1::2]
        turned = pairs * angle
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = turned.real, turned.imag
    else:
        pairs = x[..., : d // 2] + 1j * x[..., d // 2:]
        turned = pairs * angle
        out = np.concatenate([turned.real, turned.imag], axis=-1)
    return out.astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def layer_forward(config, layer, x: np.ndarray, start: int = 0, window: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One decoder layer over hidden states x [T, dim] at positions start..start+T-1, attending causally to
    themselves only (with ``window``: to the keys t with p - window < t <= p). Returns (output [T, dim], rotated
    keys [T, kv_dim], values [T, kv_dim])."""
    t = x.shape[0]
    hd, nh, nkv = config.head_dim, config.n_heads, config.n_kv_heads
    h = rms_norm(x, layer.attn_norm, config.rms_norm_eps)
    q, k, v = h @ layer.wq.T, h @ layer.wk.T, h @ layer.wv.T
    if layer.bq is not None:
        q, k, v = q + layer.bq, k + layer.bk, v + layer.bv
    positions = np.arange(start, start + t)
    q = rope(q.reshape(t, nh, hd), positions, config.rope_theta, config.rope_convention)
    k = rope(k.reshape(t, nkv, hd), positions, config.rope_theta, config.rope_convention)
    v = v.reshape(t, nkv, hd)
    group = nh // nkv
    kh, vh = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # [T, nh, hd]
    scores = np.einsum("shd,thd->hst", q, kh) / np.float32(np.sqrt(hd))
    seen = np.tril(np.ones((t, t), bool))
    if window is not None:
        seen &= np.arange(t)[None, :] > np.arange(t)[:, None] - window
    scores = np.where(seen, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ctx = np.einsum("hst,thd->shd", probs, vh).reshape(t, nh * hd)
    x = x + ctx @ layer.wo.T
    h = rms_norm(x, layer.mlp_norm, config.rms_norm_eps)
    x = x + (silu(h @ layer.w_gate.T) * (h @ layer.w_up.T)) @ layer.w_down.T
    return x.astype(np.float32), k.reshape(t, -1), v.reshape(t, -1)


def head_logits(config, weights, x: np.ndarray) -> np.ndarray:
    """Final RMSNorm and LM head: hidden states [T, dim] -> logits [T, vocab_size]."""
    return (rms_norm(x, weights.norm, config.rms_norm_eps) @ weights.classifier.T).astype(np.float32)


def reference_logits(config, weights, ids) -> np.ndarray:
    """Logits [T, vocab_size] (float32) for token ids at positions 0..T-1."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1 or not 0 < len(ids) <= config.max_position_embeddings:
        raise ValueError(f"ids must be 1-D with 1..{config.max_position_embeddings} tokens, got shape {ids.shape}")
    x = weights.embed[ids].astype(np.float32)
    for i, layer in enumerate(weights.layers):
        x = layer_forward(config, layer, x, window=config.window(i) if hasattr(config, "window") else None)[0]
    return head_logits(config, weights, x)


def reference_greedy(config, weights, ids, n: int) -> list[int]:
    """The n tokens greedy decoding appends to ids (recomputes the whole sequence each step)."""
    seq = [int(i) for i in ids]
    for _ in range(n):
        seq.append(int(np.argmax(reference_logits(config, weights, seq)[-1])))
    return seq[len(ids):]
