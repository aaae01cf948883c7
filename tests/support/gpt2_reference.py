"""An independent float32 numpy GPT-2, written from the paper and Hugging Face's GPT2LMHeadModel.

It reads a GPT2Config and GPT2Weights (plain arrays: projections stored [out, in]) but uses no other
Orion code, so tests can compare Orion's compiled model against it.
"""

from __future__ import annotations

import numpy as np

from support.references import greedy_follows


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)  # biased variance, as torch.nn.LayerNorm
    return (x - mean) / np.sqrt(var + np.float32(eps)) * gamma + beta


def _gelu_new(x: np.ndarray) -> np.ndarray:
    """GPT-2's GELU, the tanh approximation."""
    return 0.5 * x * (1.0 + np.tanh(np.float32(np.sqrt(2.0 / np.pi)) * (x + 0.044715 * x**3)))


_ACTIVATIONS = {
    "gelu_new": _gelu_new,
    "relu": lambda x: np.maximum(x, np.float32(0)),
    "tanh": np.tanh,
}


def _attention(x: np.ndarray, w_qkv: np.ndarray, b_qkv: np.ndarray, n_head: int,
               scale: float | None = None) -> np.ndarray:
    """Causal multi-head self-attention of x [T, C] with scores ``q.k * scale`` (default 1/sqrt(head_dim)),
    before the output projection."""
    t, c = x.shape
    d = c // n_head
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    qkv = x @ w_qkv.T + b_qkv                                    # [T, 3C]: q, k, v in that order
    q, k, v = (qkv[:, i * c:(i + 1) * c].reshape(t, n_head, d).transpose(1, 0, 2) for i in range(3))
    scores = q @ k.transpose(0, 2, 1) * np.float32(scale)       # [H, T, T]
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, np.float32(-np.inf))
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    return (probs @ v).transpose(1, 0, 2).reshape(t, c)


def reference_logits(config, weights, ids) -> np.ndarray:
    """Logits [T, vocab_size] (float32) for token ids at positions 0..T-1. transformers' options: the MLP
    activation (``activation_function``), scores divided by sqrt(head_dim) when ``scale_attn_weights`` and
    by the layer's index + 1 when ``scale_attn_by_inverse_layer_idx``; the MLP width comes from the weights."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1 or not 0 < len(ids) <= config.n_positions:
        raise ValueError(f"ids must be 1-D with 1..{config.n_positions} tokens, got shape {ids.shape}")
    eps = config.layer_norm_epsilon
    x = (weights.wte[ids] + weights.wpe[: len(ids)]).astype(np.float32)
    act = _ACTIVATIONS[config.activation_function]
    for i, b in enumerate(weights.blocks):
        scale = 1.0 / np.sqrt(config.n_embd // config.n_head) if config.scale_attn_weights else 1.0
        if config.scale_attn_by_inverse_layer_idx:
            scale /= i + 1
        h = _attention(_layer_norm(x, b.ln1_g, b.ln1_b, eps), b.w_qkv, b.b_qkv, config.n_head, scale)
        x = x + h @ b.w_attn_out.T + b.b_attn_out
        h = act(_layer_norm(x, b.ln2_g, b.ln2_b, eps) @ b.w_fc.T + b.b_fc)
        x = x + h @ b.w_proj.T + b.b_proj
    x = _layer_norm(x, weights.ln_f_g, weights.ln_f_b, eps)
    return (x @ weights.wte.T).astype(np.float32)  # tied LM head


def reference_greedy(config, weights, ids, n: int) -> list[int]:
    """The n tokens greedy decoding appends to ids (recomputes the whole sequence each step)."""
    seq = [int(i) for i in ids]
    out: list[int] = []
    for _ in range(n):
        nxt = int(np.argmax(reference_logits(config, weights, seq)[-1]))
        seq.append(nxt)
        out.append(nxt)
    return out


def greedy_follows_reference(config, weights, ids, got: list[int], tolerance: float) -> int:
    """:func:`support.references.greedy_follows` against this reference."""
    return greedy_follows(lambda seq: reference_logits(config, weights, seq)[-1], ids, got, tolerance)
