"""An independent float32 numpy Llama, written from llama2.c's model.py and Hugging Face's LlamaForCausalLM
(and the Llama-layer families: Qwen3's per-head q/k norms, SmolLM3's layers without RoPE, Phi-3's partial
RoPE, and RoPE scaling from the formulas of transformers' ``modeling_rope_utils``).

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


def inv_freq(config, seq_len: int) -> tuple[np.ndarray, float]:
    """RoPE's inverse frequencies over the rotated channels and the attention factor (on cos and sin), for a
    pass over ``seq_len`` positions, from the formulas of transformers' ``modeling_rope_utils`` (default,
    linear, dynamic within the context, llama3, yarn, longrope)."""
    dim = int(config.head_dim * config.partial_rotary_factor)
    theta, s = config.rope_theta, config.rope_scaling
    base = theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    kind = "default" if s is None else s.rope_type
    if kind in ("default", "dynamic"):  # dynamic: the default base while seq_len <= max_position_embeddings
        assert seq_len <= config.max_position_embeddings
        return base, 1.0
    if kind == "linear":
        return base / s.factor, 1.0
    omp = s.original_max_position_embeddings
    if kind == "llama3":
        wavelen = 2 * np.pi / base
        low, high = omp / s.low_freq_factor, omp / s.high_freq_factor
        smooth = np.clip((omp / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor), 0, 1)
        out = (1 - smooth) * base / s.factor + smooth * base
        return np.where(wavelen > low, base / s.factor, np.where(wavelen < high, base, out)), 1.0
    factor = s.factor or config.max_position_embeddings / omp
    if kind == "longrope":
        attention = s.attention_factor or (1.0 if factor <= 1 else np.sqrt(1 + np.log(factor) / np.log(omp)))
        return base / np.asarray(s.long_factor if seq_len > omp else s.short_factor), float(attention)
    def mscale(scale, m=1.0):  # yarn
        return 1.0 if scale <= 1 else 0.1 * m * np.log(scale) + 1.0
    attention = s.attention_factor or (mscale(factor, s.mscale) / mscale(factor, s.mscale_all_dim)
                                       if s.mscale and s.mscale_all_dim else mscale(factor))
    bound = [dim * np.log(omp / (r * 2 * np.pi)) / (2 * np.log(theta)) for r in (s.beta_fast or 32, s.beta_slow or 1)]
    if s.truncate is not False:
        bound = [np.floor(bound[0]), np.ceil(bound[1])]
    low, high = max(bound[0], 0), min(bound[1], dim - 1)
    ramp = np.clip((np.arange(dim // 2) - low) / ((high + 0.001 if low == high else high) - low), 0, 1)
    return base / factor * ramp + base * (1 - ramp), float(attention)


def rope(x: np.ndarray, positions: np.ndarray, config, seq_len: int | None = None) -> np.ndarray:
    """Rotate the first ``rotary_dim`` channels of x [T, heads, head_dim] for positions [T] as complex pairs
    (the others pass), scaled by the attention factor, for a pass over ``seq_len`` positions (default T)."""
    freqs, attention = inv_freq(config, len(positions) if seq_len is None else seq_len)
    r = 2 * len(freqs)
    angle = attention * np.exp(1j * np.outer(positions, freqs))[:, None, :]   # [T, 1, r/2]
    rot, rest = x[..., :r], x[..., r:]
    if config.rope_convention == "interleaved":
        turned = (rot[..., 0::2] + 1j * rot[..., 1::2]) * angle
        out = np.empty_like(rot)
        out[..., 0::2], out[..., 1::2] = turned.real, turned.imag
    else:
        turned = (rot[..., : r // 2] + 1j * rot[..., r // 2:]) * angle
        out = np.concatenate([turned.real, turned.imag], axis=-1)
    return np.concatenate([out, rest], axis=-1).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def layer_forward(config, layer, x: np.ndarray, start: int = 0, index: int = 0, window: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decoder layer ``index`` over hidden states x [T, dim] at positions start..start+T-1, attending causally to
    themselves only (with ``window``: to the keys t with p - window < t <= p). Returns (output [T, dim], rotated
    keys [T, kv_dim], values [T, kv_dim])."""
    t = x.shape[0]
    hd, nh, nkv = config.head_dim, config.n_heads, config.n_kv_heads
    h = rms_norm(x, layer.attn_norm, config.rms_norm_eps)
    q, k, v = h @ layer.wq.T, h @ layer.wk.T, h @ layer.wv.T
    if layer.bq is not None:
        q, k, v = q + layer.bq, k + layer.bk, v + layer.bv
    positions = np.arange(start, start + t)
    q, k, v = q.reshape(t, nh, hd), k.reshape(t, nkv, hd), v.reshape(t, nkv, hd)
    if getattr(layer, "q_norm", None) is not None:  # Qwen3: each head RMS-normalized before RoPE
        q = rms_norm(q, layer.q_norm, config.rms_norm_eps)
        k = rms_norm(k, layer.k_norm, config.rms_norm_eps)
    if index not in config.no_rope_layers:
        q, k = rope(q, positions, config, start + t), rope(k, positions, config, start + t)
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
    for index, layer in enumerate(weights.layers):
        x = layer_forward(config, layer, x, index=index,
                          window=config.window(index))[0]
    return head_logits(config, weights, x)


def reference_greedy(config, weights, ids, n: int) -> list[int]:
    """The n tokens greedy decoding appends to ids (recomputes the whole sequence each step)."""
    seq = [int(i) for i in ids]
    for _ in range(n):
        seq.append(int(np.argmax(reference_logits(config, weights, seq)[-1])))
    return seq[len(ids):]
