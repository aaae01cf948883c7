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
signed permutation: one formula for both conventions. The tables hold RoPE's scaling and attention factor
(:mod:`orion.models.llama.rope`) and leave the channels past ``rotary_dim`` unrotated (cos 1, sin 0); the
layers of ``config.no_rope_layers`` take none, and with ``config.qk_norm`` each query and key head is
RMS-normalized before it (:func:`head_norm`). Prefill covers positions ``0..S-1`` from const
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

from orion.graph import Graph, lineage
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
    packed_mask_input,
    window_mask_input,
)
from orion.models.llama.config import ConfigError, LlamaConfig
from orion.models.llama.rope import frequencies
from orion.models.llama.weights import LayerWeights, LlamaWeights


def _check_span(config: LlamaConfig, length: int, what: str) -> None:
    if not 0 < length <= config.max_position_embeddings:
        raise ConfigError(f"{what}: outside the context length (max_position_embeddings "
                          f"{config.max_position_embeddings}); Orion does not extrapolate RoPE past it")


# -- RoPE ----------------------------------------------------------------------------------------

def _pair_mate(config: LlamaConfig) -> tuple[np.ndarray, np.ndarray]:
    """For each channel of a head: the channel it is paired with and the sign of the mate's term (channels past
    ``rotary_dim`` are not rotated: their own mate, sign 0)."""
    d, r = config.head_dim, config.rotary_dim
    idx = np.arange(d)
    if config.rope_convention == "interleaved":
        mate, sign = idx ^ 1, np.where(idx % 2 == 0, -1.0, 1.0)
    else:
        half = r // 2
        mate, sign = (idx + half) % r, np.where(idx < half, -1.0, 1.0)
    return np.where(idx < r, mate, idx), np.where(idx < r, sign, 0.0)


def rope_by_length(config: LlamaConfig) -> bool:
    """Whether RoPE's tables depend on the length of the forward pass, not only on the positions (longrope:
    short or long factors), so prefill graphs take them as an input rather than as consts."""
    return config.rope_scaling is not None and config.rope_scaling.rope_type == "longrope"


def rope_tables(config: LlamaConfig, positions: np.ndarray, seq_end: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin ``[head_dim, len(positions)]`` in the convention's channel order (each pair's angle on
    both of its channels; channels past ``rotary_dim`` pass unrotated: cos 1, sin 0), scaled as transformers
    scales them (:mod:`orion.models.llama.rope`), the attention factor included, for a forward pass over
    the positions below ``seq_end`` (default: the largest position + 1)."""
    positions = np.asarray(positions, dtype=np.float64)
    d, r = config.head_dim, config.rotary_dim
    end = int(positions.max()) + 1 if seq_end is None and len(positions) else (seq_end or 0)
    inv_freq, attention = frequencies(config.rope_scaling, config.rope_theta, r, config.max_position_embeddings,
                                      end)
    idx = np.arange(r)
    pair = idx // 2 if config.rope_convention == "interleaved" else idx % (r // 2)
    angles = np.outer(inv_freq[pair], positions)
    cos, sin = np.ones((d, len(positions))), np.zeros((d, len(positions)))
    cos[:r], sin[:r] = np.cos(angles) * attention, np.sin(angles) * attention
    return cos, sin


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


def lora_site_names(config: LlamaConfig, layer: int) -> dict[str, str]:
    """The LoRA site of each Hugging Face module of layer ``layer`` (relative to ``model.layers.<layer>``):
    q/k/v (or a fused checkpoint's qkv_proj) share the fused qkv projection, gate/up (gate_up_proj) the fused
    gate_up one."""
    qkv, gate_up, o, down = f"l{layer}_qkv", f"l{layer}_gate_up", f"l{layer}_o", f"l{layer}_down"
    if config.fused_checkpoint:
        return {"self_attn.qkv_proj": qkv, "self_attn.o_proj": o, "mlp.gate_up_proj": gate_up, "mlp.down_proj": down}
    return {"self_attn.q_proj": qkv, "self_attn.k_proj": qkv, "self_attn.v_proj": qkv, "self_attn.o_proj": o,
            "mlp.gate_proj": gate_up, "mlp.up_proj": gate_up, "mlp.down_proj": down}


def qkv_order(config: LlamaConfig) -> np.ndarray:
    """Rows of ``wq`` in the fused projection's order (query group after query group)."""
    return np.concatenate([group_rows(config, j) for j in range(config.group_size)])


def group_split(wq: np.ndarray, wo: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A query group's rows ``rows`` of ``wq`` and the same columns of ``wo`` (read-only, their derivation
    recorded: :mod:`orion.graph.lineage`)."""
    return lineage.derived(wq[rows], "rows", [wq], lineage.index_key(rows)), \
        lineage.derived(np.take(wo, rows, axis=1), "columns", [wo], lineage.index_key(rows))  # owns its data


def layer_arrays(config: LlamaConfig, layer: LayerWeights) -> dict[str, np.ndarray]:
    """Layer ``layer``'s arrays by parameter name: ``wq`` (and ``bq``) split by query group into ``wq_g<j>``
    (``bq_g<j>``), ``wo``'s columns into ``wo_g<j>``; the others (``q_norm``/``k_norm`` with ``qk_norm``) as they are."""
    arrays = {"attn_norm": layer.attn_norm, "wk": layer.wk, "wv": layer.wv, "mlp_norm": layer.mlp_norm,
              "w_gate": layer.w_gate, "w_up": layer.w_up, "w_down": layer.w_down}
    for j in range(config.group_size):
        rows = group_rows(config, j)
        arrays[f"wq_g{j}"], arrays[f"wo_g{j}"] = group_split(layer.wq, layer.wo, rows)
    if config.qkv_bias:
        for j in range(config.group_size):
            rows = group_rows(config, j)
            arrays[f"bq_g{j}"] = lineage.derived(layer.bq[rows], "rows", [layer.bq], lineage.index_key(rows))
        arrays.update(bk=layer.bk, bv=layer.bv)
    if config.qk_norm:
        arrays.update(q_norm=layer.q_norm, k_norm=layer.k_norm)
    return arrays


def projections(config: LlamaConfig) -> tuple[Projection, Projection]:
    """The layer's q/k/v and gate/up projections by Hugging Face module (query groups in order; a fused
    checkpoint's ``qkv_proj`` and ``gate_up_proj`` are one module each)."""
    def bias(name: str) -> str | None:
        return name if config.qkv_bias else None

    groups = range(config.group_size)
    q = tuple((f"wq_g{j}", bias(f"bq_g{j}")) for j in groups)
    k, v = (("wk", bias("bk")),), (("wv", bias("bv")),)
    if config.fused_checkpoint:  # one Hugging Face module each (Phi-3)
        return {"self_attn.qkv_proj": (*q, *k, *v)}, {"mlp.gate_up_proj": (("w_gate", None), ("w_up", None))}
    return ({"self_attn.q_proj": q, "self_attn.k_proj": k, "self_attn.v_proj": v},
            {"mlp.gate_proj": (("w_gate", None),), "mlp.up_proj": (("w_up", None),)})


# (query group, its rotated queries [1, KV, hd, S], the rotated keys [1, KV, hd, S] and [1, kv_dim, 1, S],
# the values [1, kv_dim, 1, S]) -> the group's attention output [1, kv_dim, 1, S]
GroupAttend = Callable[[int, Node, Node, Node, Node], Node]


def head_norm(g: Graph, x: Node, heads: int, gain: Node | np.ndarray, eps: float, name: str) -> Node:
    """RMSNorm of each head of ``x`` ``[1, heads * head_dim, 1, S]`` over its ``head_dim`` channels, one gain
    ``[head_dim]`` for all heads (Qwen3's q/k norms): the heads moved beside the positions, normalized as
    channels, moved back."""
    d, s = x.shape[1] // heads, x.shape[3]
    lanes = g.transpose(g.reshape(x, [1, heads, d, s], name=f"{name}_heads"), [0, 2, 1, 3], name=f"{name}_t")
    normed = g.rms_norm(g.reshape(lanes, [1, d, 1, heads * s], name=f"{name}_lanes"), gain, eps, name=name)
    back = g.transpose(g.reshape(normed, [1, d, heads, s], name=f"{name}_split"), [0, 2, 1, 3], name=f"{name}_back")
    return g.reshape(back, [1, heads * d, 1, s], name=f"{name}_flat")


# The rope of a layer: cos and sin tables and the partner matrix (apply_rope), or None for a layer without RoPE.
Rope = tuple[Node, Node, Node] | None


def layer(g: Graph, x: Node, config: LlamaConfig, p: LayerParams, rope: Rope, attend: GroupAttend
          ) -> tuple[Node, Node, Node]:
    """One decoder layer on the residual stream ``x``, its weights read through ``p``: the one definition of
    a Llama-family layer, for inference and training. ``rope``: the cos and sin tables and the partner
    matrix (:func:`apply_rope`), None for a layer that does not rotate (SmolLM3); with ``config.qk_norm``
    each query and key head is RMS-normalized first (Qwen3). ``attend``: the attention of one query group
    (over the prompt, a cache or both). Returns the new ``x``, the rotated keys and the values
    (``[1, kv_dim, 1, S]``)."""
    kv, s, eps, d = config.n_kv_heads, x.shape[3], config.rms_norm_eps, config.head_dim
    qkv, gate_up = projections(config)
    h = g.rms_norm(x, p.vector("attn_norm"), eps, name="attn_norm")
    *queries, k, v = p.project(g, h, qkv, "qkv")

    def rotate(t: Node, norm: str, name: str) -> Node:  # -> head form [1, KV, hd, S]
        if config.qk_norm:
            t = head_norm(g, t, kv, p.vector(norm), eps, f"{name}_norm")
        if rope is None:
            return g.reshape(t, [1, kv, d, s], name=f"{name}_heads")
        return apply_rope(g, t, kv, *rope, f"{name}_rope")

    kh = rotate(k, "k_norm", "k")
    k_out = g.reshape(kh, [1, config.kv_dim, 1, s], name="k_out")
    contexts = [attend(j, rotate(q, "q_norm", f"q{j}"), kh, k_out, v) for j, q in enumerate(queries)]
    o = p.project_sum(g, contexts, "self_attn.o_proj", [f"wo_g{j}" for j in range(config.group_size)], "o")
    x = g.add(x, o, name="attn_res")
    h = g.rms_norm(x, p.vector("mlp_norm"), eps, name="mlp_norm")  # SwiGLU: x + W_down(silu(W_gate h) * W_up h)
    gate, up = p.project(g, h, gate_up, "gate_up")
    act = g.silu(gate, name="silu")  # legalized to gate * sigmoid(gate); its own gradient rule in training
    swiglu = g.mul(act, up, name="swiglu")
    down = p.project(g, swiglu, {"mlp.down_proj": (("w_down", None),)}, "down")[0]
    return g.add(x, down, name="mlp_res"), k_out, v


def _baked(config: LlamaConfig, weights: LlamaWeights, i: int, adapters: Sites | None, quant: str) -> BakedParams:
    return BakedParams(layer_arrays(config, weights.layers[i]), lora_site_names(config, i), adapters, quant,
                       importance=None if weights.importance is None else weights.importance.layers[i])


def _group_attention(g: Graph, q: Node, k: Node, v: Node, mask: Node, name: str) -> Node:
    """Causal attention of one query group ``[1, KV, hd, S]`` over keys/values ``[1, KV, hd, S]``."""
    kv, d, s = q.shape[1], q.shape[2], q.shape[3]
    scores = g.matmul(q, k, transpose_x=True, name=f"{name}_scores")  # [1, KV, S, S]
    probs = g.softmax(g.add(scores, mask, name=f"{name}_masked"), axis=-1, name=f"{name}_probs")
    ctx = g.matmul(v, probs, transpose_y=True, name=f"{name}_ctx")  # [1, KV, hd, S]
    return g.reshape(ctx, [1, kv * d, 1, s], name=f"{name}_merged")


# -- graphs --------------------------------------------------------------------------------------

def prefill_graph(config: LlamaConfig, weights: LlamaWeights, layers: range, seq: int,
                  adapters: Sites | None = None, quant: str = "fp16", past_context: int | None = None,
                  packed: bool = False) -> Graph:
    """Layers ``layers`` over ``seq`` tokens at positions ``0..seq-1`` (a power of two, at most the context
    length rounded up to one; pad a shorter prompt at the end, the causal mask keeps padding out of earlier
    tokens): input ``x`` ``[1, dim, 1, seq]``; outputs ``x`` and each layer's rotated keys ``k<i>`` and
    values ``v<i>`` ``[1, kv_dim, 1, seq]``. ``adapters``: LoRA site ranks (``orion.lora.graph``; None: base).

    ``past_context``: a chunk of a longer prompt that also attends to the positions already in a KV cache of
    ``past_context`` positions: inputs ``mask`` and ``k<i>``/``v<i>`` caches as in :func:`decode_graph`, and
    ``rope`` ``[1, 2 * head_dim, 1, seq]`` (the chunk's positions' cos, then sin), so one program serves
    every chunk. Prefill graphs of a model whose tables depend on the prompt's length (:func:`rope_by_length`)
    take that ``rope`` input too; graphs whose layers all skip RoPE take none.

    ``packed``: several whole prompts side by side on the lanes, each attending only to its own earlier positions
    through the input ``mask_packed`` ``[1, seq, 1, seq]`` (``orion.ops.packed_causal_mask``; sliding-window
    layers ``mask_packed_window``), with the ``rope`` input (each prompt's positions from 0)."""
    if packed and past_context:
        raise ConfigError("prefill_graph(packed=True): packed prompts are whole prompts; give no past_context")
    bucket_limit = max(MIN_LANES["fp16"], 1 << (config.max_position_embeddings - 1).bit_length())
    if not 0 < seq <= bucket_limit:  # positions past the context are padding lanes of the last bucket
        raise ConfigError(f"prefill of {seq} tokens: outside the context length (max_position_embeddings "
                          f"{config.max_position_embeddings}, so buckets of at most {bucket_limit} lanes)")
    kv, d = config.n_kv_heads, config.head_dim
    g = Graph(f"llama_{'chunk' if past_context else 'packed' if packed else 'prefill'}_{layers.start}_{layers.stop}"
              f"_s{seq}")
    x = g.input("x", [1, config.dim, 1, seq])
    if past_context:
        _check_span(config, past_context, f"prefill chunk over a cache of {past_context} positions")
        t = past_context
        mask = g.input("mask", [1, 1, 1, t])
        caches = {i: (g.input(f"k{i}", [1, config.kv_dim, 1, t]), g.input(f"v{i}", [1, config.kv_dim, 1, t]))
                  for i in layers}
    rope = _layer_rope(g, config, layers, seq,
                       past_context is not None and past_context > 0 or rope_by_length(config) or packed)
    windows = {i: config.window(i) for i in layers}
    own_masks = {w: packed_mask_input(g, seq, w is not None) if packed else causal_mask_node(g, seq, w)
                 for w in set(windows.values())}  # within the prompt (chunk, or each packed prompt)
    # over the cache (chunk): the filled positions, or a sliding window's, an input since it moves with the position
    window_mask = window_mask_input(g, t, seq) if past_context and any(windows.values()) else None
    for i in layers:
        values: list[Node] = []  # the values in head form, made once and shared by the query groups

        def attend(j: int, qh: Node, kh: Node, k: Node, v: Node, i: int = i, values: list[Node] = values) -> Node:
            own_mask = own_masks[windows[i]]
            if past_context:
                with g.scope(f"attn_g{j}"):
                    q_flat = g.reshape(qh, [1, config.kv_dim, 1, seq], name="q_rotated")
                    past_mask = window_mask if windows[i] else mask
                    return chunk_attention(g, q_flat, k, v, *caches[i], past_mask, own_mask, kv)
            if not values:
                values.append(g.reshape(v, [1, kv, d, seq], name="v_heads"))
            qh = g.mul(qh, 1.0 / math.sqrt(d), name=f"q{j}_scaled")
            return _group_attention(g, qh, kh, values[0], own_mask, f"attn_g{j}")

        with g.scope(f"l{i}"):
            x, k, v = layer(g, x, config, _baked(config, weights, i, adapters, quant),
                            rope if config.uses_rope(i) else None, attend)
        g.output(k, f"k{i}")
        g.output(v, f"v{i}")
    g.output(x, "x")
    return g


def _layer_rope(g: Graph, config: LlamaConfig, layers: range, seq: int, as_input: bool) -> Rope:
    """The rope of ``layers`` over ``seq`` lanes: tables of positions ``0..seq-1`` as consts, or (``as_input``)
    the ``rope`` input ``[1, 2 * head_dim, 1, seq]`` (cos, then sin); None when no layer rotates."""
    if not any(config.uses_rope(i) for i in layers):
        return None
    d = config.head_dim
    if as_input:
        parts = g.split(g.input("rope", [1, 2 * d, 1, seq]), [d, d], axis=1, name="rope")
        cos, sin = (g.reshape(part, [1, 1, d, seq], name=f"rope_{n}") for part, n in zip(parts, ("cos", "sin"),
                                                                                         strict=True))
    else:
        tables = rope_tables(config, np.arange(seq))
        cos, sin = (g.const(n, t.reshape(1, 1, d, seq)) for n, t in zip(("rope_cos", "rope_sin"), tables, strict=True))
    return cos, sin, rope_partner(g, config)


def decode_graph(config: LlamaConfig, weights: LlamaWeights, layers: range, context: int | None = None,
                 adapters: Sites | None = None, quant: str = "fp16", lanes: int = 1) -> Graph:
    """Layers ``layers`` for one token of each of ``lanes`` sequences: inputs ``x`` ``[1, dim, 1, lanes]``,
    ``mask`` ``[1, lanes, 1, T]``, ``rope`` ``[1, 2 * head_dim, 1, lanes]`` (:func:`rope_row` per lane) and
    caches ``k<i>``/``v<i>`` ``[1, lanes * kv_dim, 1, T]`` (``T = context``, default
    ``max_position_embeddings``; ``blocks.cached_attention``); outputs ``x`` and each layer's new ``k<i>``/``v<i>``."""
    t = context or config.max_position_embeddings
    _check_span(config, t, f"decode cache of {t} positions")
    kv = config.n_kv_heads
    g = Graph(f"llama_decode_{layers.start}_{layers.stop}_t{t}" + (f"_l{lanes}" if lanes > 1 else ""))
    x = g.input("x", [1, config.dim, 1, lanes])
    mask = g.input("mask", [1, lanes, 1, t])
    rope = _layer_rope(g, config, layers, lanes, True)
    caches = {i: (g.input(f"k{i}", [1, lanes * config.kv_dim, 1, t]),
                  g.input(f"v{i}", [1, lanes * config.kv_dim, 1, t])) for i in layers}
    window_mask = window_mask_input(g, t, lanes, per_lane=True) if any(config.window(i) for i in layers) else None
    for i in layers:
        def attend(j: int, qh: Node, kh: Node, k: Node, v: Node, i: int = i) -> Node:
            q = g.reshape(qh, [1, config.kv_dim, 1, lanes], name=f"q{j}_rotated")
            with g.scope(f"attn_g{j}"):
                return cached_attention(g, q, k, v, *caches[i], window_mask if config.window(i) else mask, kv)

        with g.scope(f"l{i}"):
            x, k, v = layer(g, x, config, _baked(config, weights, i, adapters, quant),
                            rope if config.uses_rope(i) else None, attend)
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
