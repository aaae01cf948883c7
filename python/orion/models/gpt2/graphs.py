"""GPT-2 as Orion graphs: transformer blocks for prefill and for KV-cache decode, and the LM head.

Every tensor is ``[1, C, 1, S]``, channel-major. A decode graph sees one token (``S = 1``; the I/O
padding pass gives its surfaces the lanes the ANE needs) and each layer's KV cache as
``[1, C, 1, T]`` inputs (``T = n_positions``) with an additive mask ``[1, 1, 1, T]``: 0 for filled
positions, -65504 for the rest. The new token's own key and value are merged into the attention
inside the program, so a decode graph needs no cache write before it runs; it returns them so the
caller stores them at the token's position.
"""

from __future__ import annotations

import math

from orion.graph import Graph
from orion.graph.ir import Node
from orion.limits import FP16_MAX
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.weights import BlockWeights, GPT2Weights

MASKED = -FP16_MAX  # additive mask of an empty cache position (fp16's lowest finite value)


def _mlp(g: Graph, x: Node, b: BlockWeights, eps: float, name: str) -> Node:
    h = g.layer_norm(x, b.ln2_g, b.ln2_b, eps, name=f"{name}_ln2")
    up = g.gelu(g.linear(h, b.w_fc, b.b_fc, name=f"{name}_fc"), name=f"{name}_gelu")
    return g.add(x, g.linear(up, b.w_proj, b.b_proj, name=f"{name}_proj"), name=f"{name}_out")


def _qkv(g: Graph, x: Node, b: BlockWeights, c: int, eps: float, name: str) -> list[Node]:
    h = g.layer_norm(x, b.ln1_g, b.ln1_b, eps, name=f"{name}_ln1")
    return g.split(g.linear(h, b.w_qkv, b.b_qkv, name=f"{name}_qkv"), [c, c, c], axis=1, name=f"{name}_qkv")


def cached_attention(g: Graph, q: Node, k: Node, v: Node, k_cache: Node, v_cache: Node, mask: Node,
                     heads: int, name: str) -> Node:
    """One token's multi-head attention over a KV cache plus its own key/value.

    softmax([q.K_cache + mask, q.k]) . [V_cache, v] written with reductions, so the new key needs no
    concat: m = max(max_t s_t, s_self); out = (sum_t e_t V_t + e_self v) / (sum_t e_t + e_self).
    """
    c, t = q.shape[1], k_cache.shape[3]
    d = c // heads
    qh = g.reshape(g.mul(q, 1.0 / math.sqrt(d), name=f"{name}_qs"), [1, heads, 1, d], name=f"{name}_qh")
    kh, vh = (g.reshape(n, [1, heads, 1, d], name=f"{name}_{p}h") for n, p in ((k, "k"), (v, "v")))
    keys = g.reshape(k_cache, [1, heads, d, t], name=f"{name}_keys")
    values = g.reshape(v_cache, [1, heads, d, t], name=f"{name}_values")
    scores = g.add(g.matmul(qh, keys, name=f"{name}_scores"), mask, name=f"{name}_masked")  # [1,H,1,T]
    self_score = g.reduce_sum(g.mul(qh, kh, name=f"{name}_qk"), axis=3, name=f"{name}_self")  # [1,H,1,1]
    top = g.reduce_max(scores, axis=3, name=f"{name}_top")
    m = g.add(self_score, g.relu(g.sub(top, self_score, name=f"{name}_gap"), name=f"{name}_over"),
              name=f"{name}_max")  # max(top, self_score) without a max op
    e = g.exp(g.sub(scores, m, name=f"{name}_shift"), name=f"{name}_e")
    e_self = g.exp(g.sub(self_score, m, name=f"{name}_shift_self"), name=f"{name}_e_self")
    denom = g.add(g.reduce_sum(e, axis=3, name=f"{name}_esum"), e_self, name=f"{name}_denom")
    num = g.add(g.matmul(e, values, transpose_y=True, name=f"{name}_ev"),
                g.mul(e_self, vh, name=f"{name}_ev_self"), name=f"{name}_num")  # [1,H,1,D]
    out = g.mul(num, g.pow(denom, -1.0, name=f"{name}_inv"), name=f"{name}_ctx")
    return g.reshape(out, [1, c, 1, 1], name=f"{name}_merged")


def decode_graph(config: GPT2Config, weights: GPT2Weights, layers: range) -> Graph:
    """Layers ``layers`` for one token: inputs ``x``, ``mask``, ``k<i>``/``v<i>`` caches; outputs
    ``x`` (the residual stream after the last layer) and each layer's new ``k<i>``/``v<i>``."""
    c, t, eps = config.n_embd, config.n_positions, config.layer_norm_epsilon
    g = Graph(f"gpt2_decode_{layers.start}_{layers.stop}")
    x = g.input("x", [1, c, 1, 1])
    mask = g.input("mask", [1, 1, 1, t])
    caches = {i: (g.input(f"k{i}", [1, c, 1, t]), g.input(f"v{i}", [1, c, 1, t])) for i in layers}
    for i in layers:
        b, name = weights.blocks[i], f"l{i}"
        q, k, v = _qkv(g, x, b, c, eps, name)
        g.output(k, f"k{i}")
        g.output(v, f"v{i}")
        a = cached_attention(g, q, k, v, *caches[i], mask, config.n_head, f"{name}_attn")
        x = g.add(x, g.linear(a, b.w_attn_out, b.b_attn_out, name=f"{name}_attn_proj"), name=f"{name}_res")
        x = _mlp(g, x, b, eps, name)
    g.output(x, "x")
    return g


def prefill_graph(config: GPT2Config, weights: GPT2Weights, layers: range, seq: int) -> Graph:
    """Layers ``layers`` over ``seq`` tokens (a power of two) with causal attention: input ``x``;
    outputs ``x`` and each layer's ``k<i>``/``v<i>`` for the cache."""
    c, eps = config.n_embd, config.layer_norm_epsilon
    g = Graph(f"gpt2_prefill_{layers.start}_{layers.stop}_s{seq}")
    x = g.input("x", [1, c, 1, seq])
    for i in layers:
        b, name = weights.blocks[i], f"l{i}"
        q, k, v = _qkv(g, x, b, c, eps, name)
        g.output(k, f"k{i}")
        g.output(v, f"v{i}")
        a = g.attention(q, k, v, config.n_head, causal=True, name=f"{name}_attn")
        x = g.add(x, g.linear(a, b.w_attn_out, b.b_attn_out, name=f"{name}_attn_proj"), name=f"{name}_res")
        x = _mlp(g, x, b, eps, name)
    g.output(x, "x")
    return g


def lm_head_graph(config: GPT2Config, weights: GPT2Weights, vocab: range, seq: int) -> Graph:
    """Final LayerNorm and the tied LM head for token ids ``vocab``: ``x`` -> ``logits`` [1, V, 1, S]."""
    g = Graph(f"gpt2_lm_head_{vocab.start}_{vocab.stop}_s{seq}")
    x = g.input("x", [1, config.n_embd, 1, seq])
    h = g.layer_norm(x, weights.ln_f_g, weights.ln_f_b, config.layer_norm_epsilon, name="ln_f")
    g.output(g.linear(h, weights.wte[vocab.start:vocab.stop], name="lm_head"), "logits")
    return g
