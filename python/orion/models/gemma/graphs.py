"""Gemma 2 / Gemma 3 text layers as Orion graphs, written once (:func:`layer`) for prefill, chunked prefill,
decode and training.

The layout and the attention by query group are Llama's (``orion.models.llama.graphs``: its RoPE, partner matrix
and group rows are reused). What is Gemma's own: RMSNorms with gain ``1 + w`` before and after attention and the
MLP (the ``+ 1`` folded into the baked gain in float32, an input plus one in training, so the gradient is w's);
GeGLU (``gelu_pytorch_tanh``, the registry's tanh GELU); scores scaled by ``query_pre_attn_scalar ** -0.5`` and,
in Gemma 2, soft-capped (``cap * tanh(s / cap)``); Gemma 3's per-head q/k norms and its two RoPE tables (the
sliding layers' local base, the global layers' base and linear factor); sliding-window layers
(``orion.models.blocks``: windowed consts within the prompt, the ``mask_window`` input over the KV cache).

**Residual scale.** Gemma's residual stream outgrows fp16 in practice. Inference graphs may carry it divided by a
power of two ``s`` (:func:`residual_bound` picks it): the embedding is scaled by 1/s on the CPU, the norms that read
the stream use ``eps / s^2`` (RMSNorm(x / s) with eps / s^2 is RMSNorm(x) with eps), and the post-attention and
post-MLP norms' gains are divided by s, so every layer adds its output / s. Each step is exact in real arithmetic,
and scaling by a power of two is exact in fp16 too (above the subnormals): the logits are the unscaled model's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from orion.graph import Graph
from orion.graph.ir import Node
from orion.limits import MIN_LANES
from orion.lora.graph import Sites
from orion.models.blocks import (
    BakedParams,
    LayerParams,
    Projection,
    cached_attention,
    causal_mask_node,
    chunk_attention,
    linear,
    masked_attention,
    packed_mask_input,
    soft_cap,
    window_mask_input,
)
from orion.models.gemma.config import ConfigError, GemmaConfig
from orion.models.gemma.weights import GemmaWeights, LayerWeights
from orion.models.llama.graphs import apply_rope, group_rows, group_split, lora_site_names, rope_partner

ROPE_INPUTS = {False: "rope", True: "rope_local"}  # decode/chunk position inputs: global layers', Gemma 3's local ones


# -- RoPE ----------------------------------------------------------------------------------------------

def rope_tables(config: GemmaConfig, positions: np.ndarray, local: bool) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin ``[head_dim, len(positions)]`` (rotate-half order) of the global layers, or with ``local``
    of Gemma 3's sliding layers."""
    theta, factor = (config.rope_local_theta, 1.0) if local else (config.rope_theta, config.rope_linear_factor)
    d = config.head_dim
    freqs = theta ** (-2.0 * (np.arange(d) % (d // 2)) / d) / factor
    angles = np.outer(freqs, np.asarray(positions, dtype=np.float64))
    return np.cos(angles), np.sin(angles)


def local_rope(config: GemmaConfig, layer: int) -> bool:
    """Whether layer ``layer`` rotates with Gemma 3's local table."""
    return config.rope(layer) != (config.rope_theta, config.rope_linear_factor)


def uses_local_rope(config: GemmaConfig) -> bool:
    return any(local_rope(config, i) for i in range(config.n_layers))


# -- layer pieces --------------------------------------------------------------------------------------

NORMS = ("attn_norm", "attn_post_norm", "mlp_norm", "mlp_post_norm")


def layer_arrays(config: GemmaConfig, layer: LayerWeights) -> dict[str, np.ndarray]:
    """Layer ``layer``'s arrays by parameter name (``wq`` split by query group into ``wq_g<j>``, ``wo``'s columns
    into ``wo_g<j>``); norms hold transformers' ``w``."""
    arrays = {name: getattr(layer, name) for name in (*NORMS, "wk", "wv", "w_gate", "w_up", "w_down")}
    if config.qk_norm:
        arrays.update(q_norm=layer.q_norm, k_norm=layer.k_norm)
    for j in range(config.group_size):
        rows = group_rows(config, j)
        arrays[f"wq_g{j}"], arrays[f"wo_g{j}"] = group_split(layer.wq, layer.wo, rows)
    return arrays


def projections(config: GemmaConfig) -> tuple[Projection, Projection]:
    qkv = {"self_attn.q_proj": tuple((f"wq_g{j}", None) for j in range(config.group_size)),
           "self_attn.k_proj": (("wk", None),), "self_attn.v_proj": (("wv", None),)}
    return qkv, {"mlp.gate_proj": (("w_gate", None),), "mlp.up_proj": (("w_up", None),)}


def gain(g: Graph, p: LayerParams, name: str, scale: float = 1.0) -> Node | np.ndarray:
    """The norm gain ``(1 + w) * scale``: folded in float32 into the baked const, or the training input plus one."""
    w = p.vector(name)
    if isinstance(w, np.ndarray):
        return ((np.float32(1.0) + w.astype(np.float32)) * np.float32(scale)).astype(np.float32)
    if scale != 1.0:
        raise ConfigError("a residual scale applies to inference graphs only")
    return g.add(w, 1.0, name=f"{name}_gain")


def head_norm(g: Graph, x: Node, heads: int, weight: Node | np.ndarray, eps: float, name: str) -> Node:
    """Gemma 3's q/k RMSNorm of each head of ``x`` ``[1, heads * hd, 1, S]`` over its ``hd`` channels, gain
    ``weight`` ``[hd]`` (or its ``[1, hd, 1, 1]`` input): the registry's ``rms_norm`` (overflow-safe, its own
    gradient rule) over the heads laid side by side, ``[1, hd, 1, heads * S]``; returns ``[1, heads * hd, 1, S]``."""
    c, s = x.shape[1], x.shape[3]
    hd = c // heads
    side = g.transpose(g.reshape(x, [1, heads, hd, s], name=f"{name}_heads"), [0, 2, 1, 3], name=f"{name}_side")
    normed = g.rms_norm(g.reshape(side, [1, hd, 1, heads * s], name=f"{name}_flat"), weight, eps, name=name)
    back = g.transpose(g.reshape(normed, [1, hd, heads, s], name=f"{name}_unflat"), [0, 2, 1, 3], name=f"{name}_back")
    return g.reshape(back, [1, c, 1, s], name=f"{name}_out")


# (query group, its rotated queries [1, KV, hd, S], the rotated keys [1, KV, hd, S] and [1, kv_dim, 1, S],
# the values [1, kv_dim, 1, S]) -> the group's attention output [1, kv_dim, 1, S]
GroupAttend = Callable[[int, Node, Node, Node, Node], Node]


def layer(g: Graph, x: Node, config: GemmaConfig, p: LayerParams, rope: tuple[Node, Node, Node],
          attend: GroupAttend, residual_scale: float = 1.0) -> tuple[Node, Node, Node]:
    """One Gemma decoder layer on the residual stream ``x`` (divided by ``residual_scale``, see the module
    docstring), its weights read through ``p``: the one definition, for inference and training. ``rope``: this
    layer's cos and sin tables and the partner matrix; ``attend``: one query group's attention (scaled and capped
    scores). Returns the new ``x``, the rotated keys and the values (``[1, kv_dim, 1, S]``)."""
    kv, s, eps = config.n_kv_heads, x.shape[3], config.rms_norm_eps
    stream_eps = eps / residual_scale ** 2  # RMSNorm(x / s) with eps / s^2 = RMSNorm(x) with eps
    out_scale = 1.0 / residual_scale
    cos, sin, partner = rope
    qkv, gate_up = projections(config)
    h = g.rms_norm(x, gain(g, p, "attn_norm"), stream_eps, name="attn_norm")
    *queries, k, v = p.project(g, h, qkv, "qkv")
    if config.qk_norm:
        k = head_norm(g, k, kv, gain(g, p, "k_norm"), eps, "k_norm")
        queries = [head_norm(g, q, kv, gain(g, p, "q_norm"), eps, f"q{j}_norm") for j, q in enumerate(queries)]
    kh = apply_rope(g, k, kv, cos, sin, partner, "k_rope")
    k_out = g.reshape(kh, [1, config.kv_dim, 1, s], name="k_out")
    contexts = [attend(j, apply_rope(g, q, kv, cos, sin, partner, f"q{j}_rope"), kh, k_out, v)
                for j, q in enumerate(queries)]
    o = p.project_sum(g, contexts, "self_attn.o_proj", [f"wo_g{j}" for j in range(config.group_size)], "o")
    o = g.rms_norm(o, gain(g, p, "attn_post_norm", out_scale), eps, name="attn_post_norm")
    x = g.add(x, o, name="attn_res")
    h = g.rms_norm(x, gain(g, p, "mlp_norm"), stream_eps, name="mlp_norm")  # GeGLU: gelu(W_gate h) * W_up h
    gate, up = p.project(g, h, gate_up, "gate_up")
    geglu = g.mul(g.gelu(gate, name="gelu"), up, name="geglu")
    down = p.project(g, geglu, {"mlp.down_proj": (("w_down", None),)}, "down")[0]
    down = g.rms_norm(down, gain(g, p, "mlp_post_norm", out_scale), eps, name="mlp_post_norm")
    return g.add(x, down, name="mlp_res"), k_out, v


def group_attention(g: Graph, qh: Node, kh: Node, vh: Node, mask: Node, config: GemmaConfig, name: str) -> Node:
    """Attention of one query group ``[1, KV, hd, S]`` over keys and values of the same positions: scaled by
    ``query_pre_attn_scalar ** -0.5``, capped (Gemma 2), masked by ``mask`` ``[1, 1, S, S]`` (prefill, training)."""
    return masked_attention(g, qh, kh, vh, mask, config.attention_scale, config.attn_softcap, name)


def _baked(config: GemmaConfig, weights: GemmaWeights, i: int, adapters: Sites | None, quant: str) -> BakedParams:
    return BakedParams(layer_arrays(config, weights.layers[i]), lora_site_names(config, i), adapters, quant,
                       importance=None if weights.importance is None else weights.importance.layers[i])


def _check_span(config: GemmaConfig, length: int, what: str) -> None:
    if not 0 < length <= config.max_position_embeddings:
        raise ConfigError(f"{what}: outside the context length (max_position_embeddings "
                          f"{config.max_position_embeddings}); Orion does not extrapolate RoPE past it")


def _rope_input(g: Graph, config: GemmaConfig, name: str, seq: int) -> tuple[Node, Node]:
    d = config.head_dim
    parts = g.split(g.input(name, [1, 2 * d, 1, seq]), [d, d], axis=1, name=name)
    return tuple(g.reshape(part, [1, 1, d, seq], name=f"{name}_{n}") for part, n in zip(parts, ("cos", "sin"),
                                                                                         strict=True))  # type: ignore[return-value]


def _rope_consts(g: Graph, config: GemmaConfig, seq: int, local: bool) -> tuple[Node, Node]:
    d = config.head_dim
    cos, sin = rope_tables(config, np.arange(seq), local)
    name = ROPE_INPUTS[local]
    return g.const(f"{name}_cos", cos.reshape(1, 1, d, seq)), g.const(f"{name}_sin", sin.reshape(1, 1, d, seq))


# -- graphs ----------------------------------------------------------------------------------------------

def prefill_graph(config: GemmaConfig, weights: GemmaWeights, layers: range, seq: int, adapters: Sites | None = None,
                  quant: str = "fp16", past_context: int | None = None, residual_scale: float = 1.0,
                  packed: bool = False) -> Graph:
    """Layers ``layers`` over ``seq`` tokens at positions ``0..seq-1`` (a power of two; pad a shorter prompt at the
    end): input ``x`` ``[1, dim, 1, seq]``; outputs ``x`` and each layer's rotated keys ``k<i>`` and values ``v<i>``.

    ``past_context``: a chunk of a longer prompt over a KV cache of ``past_context`` positions: inputs ``mask``,
    ``mask_window`` (sliding layers), ``k<i>``/``v<i>`` and the chunk positions' ``rope`` (and ``rope_local``).
    ``packed``: several whole prompts side by side on the lanes, kept apart by the inputs ``mask_packed`` (and, for
    sliding layers, ``mask_packed_window``) ``[1, seq, 1, seq]`` (``orion.ops.packed_causal_mask``), with the
    ``rope`` (and ``rope_local``) inputs of each prompt's positions from 0."""
    if packed and past_context:
        raise ConfigError("prefill_graph(packed=True): packed prompts are whole prompts; give no past_context")
    bucket_limit = max(MIN_LANES["fp16"], 1 << (config.max_position_embeddings - 1).bit_length())
    if not 0 < seq <= bucket_limit:
        raise ConfigError(f"prefill of {seq} tokens: outside the context length (max_position_embeddings "
                          f"{config.max_position_embeddings}, so buckets of at most {bucket_limit} lanes)")
    kv, d = config.n_kv_heads, config.head_dim
    g = Graph(f"gemma_{'chunk' if past_context else 'packed' if packed else 'prefill'}_{layers.start}_{layers.stop}"
              f"_s{seq}")
    x = g.input("x", [1, config.dim, 1, seq])
    locals_used = sorted({local_rope(config, i) for i in layers})
    windows = {i: config.window(i) for i in layers}
    if past_context:
        _check_span(config, past_context, f"prefill chunk over a cache of {past_context} positions")
        t = past_context
        mask = g.input("mask", [1, 1, 1, t])
        window_mask = window_mask_input(g, t, seq) if any(windows.values()) else None
        ropes = {local: _rope_input(g, config, ROPE_INPUTS[local], seq) for local in locals_used}
        caches = {i: (g.input(f"k{i}", [1, config.kv_dim, 1, t]), g.input(f"v{i}", [1, config.kv_dim, 1, t]))
                  for i in layers}
    else:
        ropes = {local: _rope_input(g, config, ROPE_INPUTS[local], seq) if packed else _rope_consts(g, config, seq, local)
                 for local in locals_used}
    partner = rope_partner(g, config)
    own_masks = {w: packed_mask_input(g, seq, w is not None) if packed else causal_mask_node(g, seq, w)
                 for w in set(windows.values())}
    for i in layers:
        values: list[Node] = []

        def attend(j: int, qh: Node, kh: Node, k: Node, v: Node, i: int = i, values: list[Node] = values) -> Node:
            if past_context:
                with g.scope(f"attn_g{j}"):
                    q_flat = g.reshape(qh, [1, config.kv_dim, 1, seq], name="q_rotated")
                    return chunk_attention(g, q_flat, k, v, *caches[i], window_mask if windows[i] else mask,
                                           own_masks[windows[i]], kv, config.attention_scale, config.attn_softcap)
            if not values:
                values.append(g.reshape(v, [1, kv, d, seq], name="v_heads"))
            return group_attention(g, qh, kh, values[0], own_masks[windows[i]], config, f"attn_g{j}")

        with g.scope(f"l{i}"):
            x, k, v = layer(g, x, config, _baked(config, weights, i, adapters, quant),
                            (*ropes[local_rope(config, i)], partner), attend, residual_scale)
        g.output(k, f"k{i}")
        g.output(v, f"v{i}")
    g.output(x, "x")
    return g


def decode_graph(config: GemmaConfig, weights: GemmaWeights, layers: range, context: int | None = None,
                 adapters: Sites | None = None, quant: str = "fp16", residual_scale: float = 1.0,
                 lanes: int = 1) -> Graph:
    """Layers ``layers`` for one token of each of ``lanes`` sequences: inputs ``x`` ``[1, dim, 1, lanes]``, ``mask``
    ``[1, lanes, 1, T]``, ``mask_window`` ``[1, T, 1, lanes]`` (sliding layers), ``rope`` (and ``rope_local``)
    ``[1, 2 * head_dim, 1, lanes]`` and caches ``k<i>``/``v<i>`` ``[1, lanes * kv_dim, 1, T]``
    (``blocks.cached_attention``); outputs ``x`` and each layer's new ``k<i>``/``v<i>``."""
    t = context or config.max_position_embeddings
    _check_span(config, t, f"decode cache of {t} positions")
    kv = config.n_kv_heads
    g = Graph(f"gemma_decode_{layers.start}_{layers.stop}_t{t}" + (f"_l{lanes}" if lanes > 1 else ""))
    x = g.input("x", [1, config.dim, 1, lanes])
    mask = g.input("mask", [1, lanes, 1, t])
    windows = {i: config.window(i) for i in layers}
    window_mask = window_mask_input(g, t, lanes, per_lane=True) if any(windows.values()) else None
    ropes = {local: _rope_input(g, config, ROPE_INPUTS[local], lanes) for local in sorted({local_rope(config, i)
                                                                                           for i in layers})}
    caches = {i: (g.input(f"k{i}", [1, lanes * config.kv_dim, 1, t]),
                  g.input(f"v{i}", [1, lanes * config.kv_dim, 1, t])) for i in layers}
    partner = rope_partner(g, config)
    for i in layers:
        def attend(j: int, qh: Node, kh: Node, k: Node, v: Node, i: int = i) -> Node:
            q = g.reshape(qh, [1, config.kv_dim, 1, lanes], name=f"q{j}_rotated")
            with g.scope(f"attn_g{j}"):
                return cached_attention(g, q, k, v, *caches[i], window_mask if windows[i] else mask, kv,
                                        config.attention_scale, config.attn_softcap)

        with g.scope(f"l{i}"):
            x, k, v = layer(g, x, config, _baked(config, weights, i, adapters, quant),
                            (*ropes[local_rope(config, i)], partner), attend, residual_scale)
        g.output(k, f"k{i}")
        g.output(v, f"v{i}")
    g.output(x, "x")
    return g


def lm_head_graph(config: GemmaConfig, weights: GemmaWeights, vocab: range, seq: int, quant: str = "fp16",
                  residual_scale: float = 1.0) -> Graph:
    """Final ``(1 + w)`` RMSNorm, the LM head for token ids ``vocab`` and Gemma 2's final soft-capping:
    ``x`` -> ``logits`` ``[1, V, 1, S]``."""
    if not 0 <= vocab.start < vocab.stop <= config.vocab_size or vocab.step != 1:
        raise ConfigError(f"lm_head_graph: vocabulary chunk {vocab} is not a non-empty slice of range(0, "
                          f"{config.vocab_size})")
    g = Graph(f"gemma_lm_head_{vocab.start}_{vocab.stop}_s{seq}")
    x = g.input("x", [1, config.dim, 1, seq])
    h = g.rms_norm(x, (np.float32(1.0) + weights.norm).astype(np.float32), config.rms_norm_eps / residual_scale ** 2,
                   name="final_norm")
    logits = linear(g, h, weights.classifier[vocab.start:vocab.stop], None, quant, "lm_head")
    g.output(soft_cap(g, logits, config.final_softcap, "logits"), "logits")
    return g


def residual_bound(config: GemmaConfig, weights: GemmaWeights) -> float:
    """An upper bound of every entry of the residual stream, from the weights alone: the embedding's largest
    |entry| times sqrt(dim), plus, per layer, what its two post-norms can add: an RMS-normalized vector's entries
    are at most sqrt(dim) in size, times the largest |1 + w| of the gain."""
    limit = float(np.abs(weights.embed).max()) * config.embed_scale
    root = float(np.sqrt(config.dim))
    for layer_weights in weights.layers:
        for name in ("attn_post_norm", "mlp_post_norm"):
            limit += root * float(np.abs(1.0 + getattr(layer_weights, name)).max())
    return limit
