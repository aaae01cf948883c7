"""Llama-family layers as Orion graphs: RMSNorm, RoPE, grouped-query attention and SwiGLU, for prefill
(a whole sequence, causal) and for one decode step over a KV cache, plus the final norm and LM head. The
layer is written once (:func:`layer`); the prefill, chunk and decode graphs bake its weights and pass their
attention, and the training layer graph (``orion.models.llama.trainable``) reads them as inputs.

Every tensor is ``[1, C, 1, S]``, channel-major, and only conservative ops are used (1x1 conv for
projections, matmul for attention, no concat, SiLU as ``x * sigmoid(x)``, an explicit additive causal
mask). Attention is computed per *query group*: the fused qkv projection orders the query heads
group-major, so query group ``j`` (head ``kv * group_size + j`` of every KV head ``kv``) is one
contiguous ``[1, kv_dim, 1, S]`` slice that attends to the KV heads as plain multi-head attention.
The KV tensors are shared by every group (never copied per query head), the cache holds
``kv_dim = n_kv_heads * head_dim`` channels per token, and the output projection is the sum of one
projection per group, so no group outputs are concatenated.

RoPE multiplies by cos/sin tables ``[1, 1, head_dim, S]`` broadcast over heads and adds the rotation
partner (each channel's pair mate, signed), made by a matmul with a constant ``[head_dim, head_dim]``
signed permutation: one formula for both conventions. Prefill covers positions ``0..S-1`` from const
tables; a decode graph takes the current position's cos/sin as its ``rope`` input
(:func:`rope_row`), so one program serves every position. The decode graph's I/O match GPT-2's:
``x``, ``mask`` ``[1, 1, 1, T]`` (0 for filled positions, -65504 for the rest) and per layer
``k<i>``/``v<i>`` caches ``[1, kv_dim, 1, T]`` of rotated keys and values; it returns the new token's
``k<i>``/``v<i>`` for the caller to store at its position. ``quant`` says how the projection and LM-head
weights are stored: "fp16" or "int8" (orion.quant; each output-projection group slice has its own scales).

Broadcasts stay one-sided: ``[1, C, 1, S]`` with ``[1, 1, 1, S]`` or ``[1, C, 1, 1]`` (norms, GPT-2's
decode attention) and ``[1, H, a, b]`` with ``[1, 1, a, b]`` (RoPE tables, the causal mask, and the
constant RoPE partner matrix as a batch-broadcast matmul operand, as legalization's placement matmuls do).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from orion.graph import Graph
from orion.graph.ir import Node
from orion.limits import MIN_LANES
from orion.lora.graph import Sites
from orion.models.blocks import BakedParams, LayerParams, Projection, cached_attention, chunk_attention, linear
from orion.models.llama.config import ConfigError, LlamaConfig
from orion.models.llama.weights import LayerWeights, LlamaWeights
from orion.ops import graph_causal_mask


def _check_span(config: LlamaConfig, length: int, what: str) -> None:
    if not 0 < length <= config.max_position_embeddings:
        raise ConfigError(f"{what}: outside the context length (max_position_embeddings "
                          f"{config.max_position_embeddings}); Orion does not extrapolate RoPE past it")


# -- RoPE ----------------------------------------------------------------------------------------

def _pair_mate(config: LlamaConfig) -> tuple[np.ndarray, np.ndarray]:
    """For each channel of a head: the channel it is paired with and the sign of the mate's term."""
    d = config.head_dim
    idx = np.arange(d)
    if config.rope_convention == "interleaved":
        return idx ^ 1, np.where(idx % 2 == 0, -1.0, 1.0)
    half = d // 2
    return (idx + half) % d, np.where(idx < half, -1.0, 1.0)


def rope_tables(config: LlamaConfig, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin ``[head_dim, len(positions)]`` in the convention's channel order (each pair's angle on
    both of its channels)."""
    d = config.head_dim
    idx = np.arange(d)
    pair = idx // 2 if config.rope_convention == "interleaved" else idx % (d // 2)
    freqs = config.rope_theta ** (-2.0 * pair / d)
    angles = np.outer(freqs, np.asarray(positions, dtype=np.float64))
    return np.cos(angles), np.sin(angles)


def rope_row(config: LlamaConfig, position: int) -> np.ndarray:
    """The decode graph's ``rope`` input ``[1, 2 * head_dim, 1, 1]`` for the token at ``position``: the cos
    column of :func:`rope_tables`, then the sin column."""
    _check_span(config, position + 1, f"position {position}")
    cos, sin = rope_tables(config, np.array([position]))
    return np.concatenate([cos[:, 0], sin[:, 0]]).reshape(1, -1, 1, 1).astype(np.float32)


def rope_partner(g: Graph, config: LlamaConfig) -> Node:
    """``[1, 1, head_dim, head_dim]`` signed permutation P with (P x)[c] = sign[c] * x[mate[c]]."""
    mate, sign = _pair_mate(config)
    p = np.zeros((config.head_dim, config.head_dim))
    p[np.arange(config.head_dim), mate] = sign
    return g.const("rope_partner", p.reshape(1, 1, config.head_dim, config.head_dim))


def apply_rope(g: Graph, x: Node, heads: int, cos: Node, sin: Node, partner: Node, name: str) -> Node:
    """Rotate ``x`` ``[1, heads*head_dim, 1, S]``; returns head form ``[1, heads, head_dim, S]``."""
    d, s = cos.shape[2], x.shape[3]
    xh = g.reshape(x, [1, heads, d, s], name=f"{name}_heads")
    mate = g.matmul(partner, xh, name=f"{name}_mate")
    return g.add(g.mul(xh, cos, name=f"{name}_cos"), g.mul(mate, sin, name=f"{name}_sin"), name=name)


# -- layer pieces ----------------------------------------------------------------------------------

def group_rows(config: LlamaConfig, group: int) -> np.ndarray:
    """Rows of ``wq`` (columns of ``wo``) of query group ``group``: head ``kv * group_size + group`` of each KV head."""
    heads = np.arange(config.n_kv_heads) * config.group_size + group
    return (heads[:, None] * config.head_dim + np.arange(config.head_dim)[None, :]).reshape(-1)


def lora_site_names(layer: int) -> dict[str, str]:
    """The LoRA site of each Hugging Face module of layer ``layer`` (relative to ``model.layers.<layer>``):
    q/k/v share the fused qkv projection, gate/up the fused gate_up one."""
    qkv, gate_up = f"l{layer}_qkv", f"l{layer}_gate_up"
    return {"self_attn.q_proj": qkv, "self_attn.k_proj": qkv, "self_attn.v_proj": qkv,
            "self_attn.o_proj": f"l{layer}_o", "mlp.gate_proj": gate_up, "mlp.up_proj": gate_up,
            "mlp.down_proj": f"l{layer}_down"}


def qkv_order(config: LlamaConfig) -> np.ndarray:
    """Rows of ``wq`` in the fused projection's order (query group after query group)."""
    return np.concatenate([group_rows(config, j) for j in range(config.group_size)])


def layer_arrays(config: LlamaConfig, layer: LayerWeights) -> dict[str, np.ndarray]:
    """Layer ``layer``'s arrays by parameter name: ``wq`` (and ``bq``) split by query group into ``wq_g<j>``
    (``bq_g<j>``), ``wo``'s columns into ``wo_g<j>``; the others as they are."""
    arrays = {"attn_norm": layer.attn_norm, "wk": layer.wk, "wv": layer.wv, "mlp_norm": layer.mlp_norm,
              "w_gate": layer.w_gate, "w_up": layer.w_up, "w_down": layer.w_down}
    for j in range(config.group_size):
        rows = group_rows(config, j)
        arrays[f"wq_g{j}"], arrays[f"wo_g{j}"] = layer.wq[rows], layer.wo[:, rows]
    if config.qkv_bias:
        arrays.update({f"bq_g{j}": layer.bq[group_rows(config, j)] for j in range(config.group_size)})
        arrays.update(bk=layer.bk, bv=layer.bv)
    return arrays


def projections(config: LlamaConfig) -> tuple[Projection, Projection]:
    """The layer's q/k/v and gate/up projections by Hugging Face module (query groups in order)."""
    def bias(name: str) -> str | None:
        return name if config.qkv_bias else None

    groups = range(config.group_size)
    qkv = {"self_attn.q_proj": tuple((f"wq_g{j}", bias(f"bq_g{j}")) for j in groups),
           "self_attn.k_proj": (("wk", bias("bk")),), "self_attn.v_proj": (("wv", bias("bv")),)}
    return qkv, {"mlp.gate_proj": (("w_gate", None),), "mlp.up_proj": (("w_up", None),)}


# (query group, its rotated queries [1, KV, hd, S], the rotated keys [1, KV, hd, S] and [1, kv_dim, 1, S],
# the values [1, kv_dim, 1, S]) -> the group's attention output [1, kv_dim, 1, S]
GroupAttend = Callable[[int, Node, Node, Node, Node], Node]


def layer(g: Graph, x: Node, config: LlamaConfig, p: LayerParams, rope: tuple[Node, Node, Node],
          attend: GroupAttend) -> tuple[Node, Node, Node]:
    """One decoder layer on the residual stream ``x``, its weights read through ``p``: the one definition of
    a Llama-family layer, for inference and training. ``rope``: the cos and sin tables and the partner
    matrix (:func:`apply_rope`); ``attend``: the attention of one query group (over the prompt, a cache or
    both). Returns the new ``x``, the rotated keys and the values (``[1, kv_dim, 1, S]``)."""
    kv, s, eps = config.n_kv_heads, x.shape[3], config.rms_norm_eps
    cos, sin, partner = rope
    qkv, gate_up = projections(config)
    h = g.rms_norm(x, p.vector("attn_norm"), eps, name="attn_norm")
    *queries, k, v = p.project(g, h, qkv, "qkv")
    kh = apply_rope(g, k, kv, cos, sin, partner, "k_rope")
    k_out = g.reshape(kh, [1, config.kv_dim, 1, s], name="k_out")
    contexts = [attend(j, apply_rope(g, q, kv, cos, sin, partner, f"q{j}_rope"), kh, k_out, v)
                for j, q in enumerate(queries)]
    o = p.project_sum(g, contexts, "self_attn.o_proj", [f"wo_g{j}" for j in range(config.group_size)], "o")
    x = g.add(x, o, name="attn_res")
    h = g.rms_norm(x, p.vector("mlp_norm"), eps, name="mlp_norm")  # SwiGLU: x + W_down(silu(W_gate h) * W_up h)
    gate, up = p.project(g, h, gate_up, "gate_up")
    act = g.silu(gate, name="silu")  # legalized to gate * sigmoid(gate); its own gradient rule in training
    swiglu = g.mul(act, up, name="swiglu")
    down = p.project(g, swiglu, {"mlp.down_proj": (("w_down", None),)}, "down")[0]
    return g.add(x, down, name="mlp_res"), k_out, v


def _baked(config: LlamaConfig, weights: LlamaWeights, i: int, adapters: Sites | None, quant: str) -> BakedParams:
    return BakedParams(layer_arrays(config, weights.layers[i]), lora_site_names(i), adapters, quant)


def _group_attention(g: Graph, q: Node, k: Node, v: Node, mask: Node, name: str) -> Node:
    """Causal attention of one query group ``[1, KV, hd, S]`` over keys/values ``[1, KV, hd, S]``."""
    kv, d, s = q.shape[1], q.shape[2], q.shape[3]
    scores = g.matmul(q, k, transpose_x=True, name=f"{name}_scores")  # [1, KV, S, S]
    probs = g.softmax(g.add(scores, mask, name=f"{name}_masked"), axis=-1, name=f"{name}_probs")
    ctx = g.matmul(v, probs, transpose_y=True, name=f"{name}_ctx")  # [1, KV, hd, S]
    return g.reshape(ctx, [1, kv * d, 1, s], name=f"{name}_merged")


# -- graphs --------------------------------------------------------------------------------------

def prefill_graph(config: LlamaConfig, weights: LlamaWeights, layers: range, seq: int,
                  adapters: Sites | None = None, quant: str = "fp16", past_context: int | None = None) -> Graph:
    """Layers ``layers`` over ``seq`` tokens at positions ``0..seq-1`` (a power of two, at most the context
    length rounded up to one; pad a shorter prompt at the end, the causal mask keeps padding out of earlier
    tokens): input ``x`` ``[1, dim, 1, seq]``; outputs ``x`` and each layer's rotated keys ``k<i>`` and
    values ``v<i>`` ``[1, kv_dim, 1, seq]``. ``adapters``: LoRA site ranks (``orion.lora.graph``; None: base).

    ``past_context``: a chunk of a longer prompt that also attends to the positions already in a KV cache of
    ``past_context`` positions: inputs ``mask`` and ``k<i>``/``v<i>`` caches as in :func:`decode_graph`, and
    ``rope`` ``[1, 2 * head_dim, 1, seq]`` (the chunk's positions' cos, then sin), so one program serves
    every chunk."""
    bucket_limit = max(MIN_LANES["fp16"], 1 << (config.max_position_embeddings - 1).bit_length())
    if not 0 < seq <= bucket_limit:  # positions past the context are padding lanes of the last bucket
        raise ConfigError(f"prefill of {seq} tokens: outside the context length (max_position_embeddings "
                          f"{config.max_position_embeddings}, so buckets of at most {bucket_limit} lanes)")
    kv, d = config.n_kv_heads, config.head_dim
    g = Graph(f"llama_{'chunk' if past_context else 'prefill'}_{layers.start}_{layers.stop}_s{seq}")
    x = g.input("x", [1, config.dim, 1, seq])
    if past_context:
        _check_span(config, past_context, f"prefill chunk over a cache of {past_context} positions")
        t = past_context
        mask = g.input("mask", [1, 1, 1, t])
        cos, sin = (g.reshape(part, [1, 1, d, seq], name=f"rope_{n}") for part, n in
                    zip(g.split(g.input("rope", [1, 2 * d, 1, seq]), [d, d], axis=1, name="rope"), ("cos", "sin"),
                        strict=True))
        caches = {i: (g.input(f"k{i}", [1, config.kv_dim, 1, t]), g.input(f"v{i}", [1, config.kv_dim, 1, t]))
                  for i in layers}
    else:
        cos_table, sin_table = rope_tables(config, np.arange(seq))
        cos, sin = (g.const(n, t.reshape(1, 1, d, seq)) for n, t in (("rope_cos", cos_table), ("rope_sin", sin_table)))
    partner = rope_partner(g, config)
    mask_causal = graph_causal_mask(g, seq)
    for i in layers:
        values: list[Node] = []  # the values in head form, made once and shared by the query groups

        def attend(j: int, qh: Node, kh: Node, k: Node, v: Node, i: int = i, values: list[Node] = values) -> Node:
            if past_context:
                with g.scope(f"attn_g{j}"):
                    q_flat = g.reshape(qh, [1, config.kv_dim, 1, seq], name="q_rotated")
                    return chunk_attention(g, q_flat, k, v, *caches[i], mask, mask_causal, kv)
            if not values:
                values.append(g.reshape(v, [1, kv, d, seq], name="v_heads"))
            qh = g.mul(qh, 1.0 / math.sqrt(d), name=f"q{j}_scaled")
            return _group_attention(g, qh, kh, values[0], mask_causal, f"attn_g{j}")

        with g.scope(f"l{i}"):
            x, k, v = layer(g, x, config, _baked(config, weights, i, adapters, quant), (cos, sin, partner), attend)
        g.output(k, f"k{i}")
        g.output(v, f"v{i}")
    g.output(x, "x")
    return g


def decode_graph(config: LlamaConfig, weights: LlamaWeights, layers: range, context: int | None = None,
                 adapters: Sites | None = None, quant: str = "fp16", lanes: int = 1) -> Graph:
    """Layers ``layers`` for one token of each of ``lanes`` sequences: inputs ``x`` ``[1, dim, 1, lanes]``,
    ``mask`` ``[1, lanes, 1, T]``, ``rope`` ``[1, 2 * head_dim, 1, lanes]`` (:func:`rope_row` per lane) and
    caches ``k<i>``/``v<i>`` ``[1, lanes * kv_dim, 1, T]`` (``T = context``, default
    ``max_position_embeddings``; ``blocks.cached_attention``); outputs ``x`` and each layer's new ``k<i>``/``v<i>``."""
    t = context or config.max_position_embeddings
    _check_span(config, t, f"decode cache of {t} positions")
    kv, d = config.n_kv_heads, config.head_dim
    g = Graph(f"llama_decode_{layers.start}_{layers.stop}_t{t}" + (f"_l{lanes}" if lanes > 1 else ""))
    x = g.input("x", [1, config.dim, 1, lanes])
    mask = g.input("mask", [1, lanes, 1, t])
    cos, sin = (g.reshape(part, [1, 1, d, lanes], name=f"rope_{n}") for part, n in
                zip(g.split(g.input("rope", [1, 2 * d, 1, lanes]), [d, d], axis=1, name="rope"), ("cos", "sin"),
                    strict=True))
    caches = {i: (g.input(f"k{i}", [1, lanes * config.kv_dim, 1, t]),
                  g.input(f"v{i}", [1, lanes * config.kv_dim, 1, t])) for i in layers}
    partner = rope_partner(g, config)
    for i in layers:
        def attend(j: int, qh: Node, kh: Node, k: Node, v: Node, i: int = i) -> Node:
            q = g.reshape(qh, [1, config.kv_dim, 1, lanes], name=f"q{j}_rotated")
            with g.scope(f"attn_g{j}"):
                return cached_attention(g, q, k, v, *caches[i], mask, kv)

        with g.scope(f"l{i}"):
            x, k, v = layer(g, x, config, _baked(config, weights, i, adapters, quant), (cos, sin, partner), attend)
        g.output(k, f"k{i}")
        g.output(v, f"v{i}")
    g.output(x, "x")
    return g


def lm_head_graph(config: LlamaConfig, weights: LlamaWeights, vocab: range, seq: int, quant: str = "fp16") -> Graph:
    """Final RMSNorm and the LM head (tied or not) for token ids ``vocab``: ``x`` -> ``logits`` ``[1, V, 1, S]``."""
    if not 0 <= vocab.start < vocab.stop <= config.vocab_size or vocab.step != 1:
        raise ConfigError(f"lm_head_graph: vocabulary chunk {vocab} is not a non-empty slice of range(0, "
                          f"{config.vocab_size})")
    g = Graph(f"llama_lm_head_{vocab.start}_{vocab.stop}_s{seq}")
    x = g.input("x", [1, config.dim, 1, seq])
    h = g.rms_norm(x, weights.norm, config.rms_norm_eps, name="final_norm")
    g.output(linear(g, h, weights.classifier[vocab.start:vocab.stop], None, quant, "lm_head"), "logits")
    return g
