"""GPT-2 as Orion graphs: transformer blocks for prefill and for KV-cache decode, and the LM head. The block
is written once (:func:`block`); these graphs bake its weights, and the training layer graph
(``orion.models.gpt2.trainable``) reads them as inputs.

Every tensor is ``[1, C, 1, S]``, channel-major. A decode graph sees one token (``S = 1``; the I/O
padding pass gives its surfaces the lanes the ANE needs) and each layer's KV cache as
``[1, C, 1, T]`` inputs (``T``: the cache's length, at most ``n_positions``) with an additive mask ``[1, 1, 1, T]``: 0 for filled
positions, -65504 for the rest. The new token's own key and value are merged into the attention
inside the program, so a decode graph needs no cache write before it runs; it returns them so the
caller stores them at the token's position. Node names follow Hugging Face's: ``h3_attn_qkv``.
``quant`` says how the linear weights (and the LM head's) are stored: "fp16" or "int8" (orion.quant).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from orion.graph import Graph
from orion.graph.ir import Node
from orion.lora.graph import Sites
from orion.models.blocks import (
    BakedParams,
    LayerParams,
    cached_attention,
    chunk_attention,
    linear,
    packed_attention,
    packed_mask_input,
)
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.weights import BlockWeights, GPT2Weights
from orion.ops import graph_causal_mask

# (layer, q, k, v) -> attention output, [1, C, 1, S]
Attend = Callable[[int, Node, Node, Node], Node]


def activation(g: Graph, x: Node, name: str) -> Node:
    """The MLP activation transformers calls ``name`` (one of ``config.ACTIVATIONS``)."""
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu"):
        return g.gelu(x, name="gelu")
    if name == "quick_gelu":  # x * sigmoid(1.702 x)
        return g.mul(x, g.sigmoid(g.mul(x, 1.702, name="quick_scale"), name="quick_sigmoid"), name="quick_gelu")
    if name in ("silu", "swish"):
        return g.silu(x, name="silu")
    if name == "linear":
        return x
    return {"relu": g.relu, "tanh": g.tanh, "sigmoid": g.sigmoid}[name](x, name=name)


def lora_site_names(layer: int) -> dict[str, str]:
    """The LoRA sites of block ``layer`` by Hugging Face module (relative to ``transformer.h.<layer>``)."""
    return {"attn.c_attn": f"h{layer}_attn_qkv", "attn.c_proj": f"h{layer}_attn_proj",
            "mlp.c_fc": f"h{layer}_mlp_fc", "mlp.c_proj": f"h{layer}_mlp_proj"}


# the attention and MLP projections by Hugging Face module: (weight, bias) parameters in output-row order
QKV = {"attn.c_attn": (("w_q", "b_q"), ("w_k", "b_k"), ("w_v", "b_v"))}
ATTN_OUT = {"attn.c_proj": (("w_attn_out", "b_attn_out"),)}
FC = {"mlp.c_fc": (("w_fc", "b_fc"),)}
MLP_OUT = {"mlp.c_proj": (("w_proj", "b_proj"),)}


def layer_arrays(block: BlockWeights) -> dict[str, np.ndarray]:
    """Block ``block``'s arrays by parameter name (``w_qkv`` as its ``w_q``, ``w_k``, ``w_v`` rows)."""
    c = block.w_attn_out.shape[0]
    arrays = {"ln1_g": block.ln1_g, "ln1_b": block.ln1_b, "w_attn_out": block.w_attn_out,
              "b_attn_out": block.b_attn_out, "ln2_g": block.ln2_g, "ln2_b": block.ln2_b, "w_fc": block.w_fc,
              "b_fc": block.b_fc, "w_proj": block.w_proj, "b_proj": block.b_proj}
    for j, t in enumerate("qkv"):
        arrays[f"w_{t}"], arrays[f"b_{t}"] = block.w_qkv[j * c:(j + 1) * c], block.b_qkv[j * c:(j + 1) * c]
    return arrays


def block(g: Graph, x: Node, config: GPT2Config, p: LayerParams, layer: int, attend: Attend) -> tuple[Node, Node, Node]:
    """Transformer block ``layer`` on the residual stream ``x``, its weights read through ``p``: the one
    definition of a GPT-2 block, for inference and training. Returns the new ``x`` and the block's key
    and value; ``attend`` is the attention itself (causal over the prompt, or over the cache)."""
    eps = config.layer_norm_epsilon
    with g.scope(f"h{layer}.attn"):
        h = g.layer_norm(x, p.vector("ln1_g"), p.vector("ln1_b"), eps, name="ln")
        q, k, v = p.project(g, h, QKV, "qkv")
        a = attend(layer, q, k, v)
        x = g.add(x, p.project(g, a, ATTN_OUT, "proj")[0], name="res")
    with g.scope(f"h{layer}.mlp"):
        h = g.layer_norm(x, p.vector("ln2_g"), p.vector("ln2_b"), eps, name="ln")
        up = activation(g, p.project(g, h, FC, "fc")[0], config.activation_function)
        x = g.add(x, p.project(g, up, MLP_OUT, "proj")[0], name="res")
    return x, k, v


def _layers(g: Graph, x: Node, config: GPT2Config, weights: GPT2Weights, layers: range, attend: Attend,
            adapters: Sites | None, quant: str) -> Node:
    """Blocks ``layers`` with baked weights; each block's key and value become outputs ``k<i>``/``v<i>``.
    ``adapters``: the LoRA site ranks (``orion.lora.graph``)."""
    for i in layers:
        b = weights.blocks[i]
        params = BakedParams(layer_arrays(b), lora_site_names(i), adapters, quant,
                             {("w_q", "w_k", "w_v"): b.w_qkv, ("b_q", "b_k", "b_v"): b.b_qkv},
                             None if weights.importance is None else weights.importance.layers[i])
        x, k, v = block(g, x, config, params, i, attend)
        g.output(k, f"k{i}")
        g.output(v, f"v{i}")
    return x


def prefill_attention(g: Graph, config: GPT2Config, layer: int, q: Node, k: Node, v: Node,
                      scale: Node | None = None, packed_mask: Node | None = None) -> Node:
    """Causal attention over the whole sequence. ``g.attention`` scales by 1/sqrt(head_dim): another scale
    (``config.attention_scale``, or the ``[1, C, 1, 1]`` factor ``scale`` on it) is folded into ``q`` first.
    ``packed_mask``: several prompts in one pass, the additive ``[1, 1, S, S]`` mask input that keeps each
    to itself (``blocks.packed_attention``) in place of the causal one."""
    factor = config.attention_scale(layer) * math.sqrt(config.head_dim)
    if scale is not None:
        q = g.mul(q, scale, name="q_scale")
    elif factor != 1.0:
        q = g.mul(q, factor, name="q_scale")
    if packed_mask is not None:
        return packed_attention(g, q, k, v, packed_mask, config.n_head, name="core")
    return g.attention(q, k, v, config.n_head, causal=True, name="core")


def decode_graph(config: GPT2Config, weights: GPT2Weights, layers: range, adapters: Sites | None = None,
                 quant: str = "fp16", context: int | None = None, lanes: int = 1) -> Graph:
    """Layers ``layers`` for one token of each of ``lanes`` sequences: inputs ``x`` ``[1, C, 1, lanes]``,
    ``mask`` ``[1, lanes, 1, T]``, ``k<i>``/``v<i>`` caches ``[1, lanes * C, 1, T]`` of ``T = context``
    positions (default ``n_positions``; ``blocks.cached_attention``); outputs ``x`` (the residual stream
    after the last layer) and each layer's new ``k<i>``/``v<i>``."""
    c, t = config.n_embd, context or config.n_positions
    g = Graph(f"gpt2_decode_{layers.start}_{layers.stop}" + (f"_l{lanes}" if lanes > 1 else ""))
    x = g.input("x", [1, c, 1, lanes])
    mask = g.input("mask", [1, lanes, 1, t])
    caches = {i: (g.input(f"k{i}", [1, lanes * c, 1, t]), g.input(f"v{i}", [1, lanes * c, 1, t])) for i in layers}

    def attend(i: int, q: Node, k: Node, v: Node) -> Node:
        return cached_attention(g, q, k, v, *caches[i], mask, config.n_head, config.attention_scale(i))

    g.output(_layers(g, x, config, weights, layers, attend, adapters, quant), "x")
    return g


def prefill_graph(config: GPT2Config, weights: GPT2Weights, layers: range, seq: int,
                  adapters: Sites | None = None, quant: str = "fp16", past: bool = False,
                  context: int | None = None, packed: bool = False) -> Graph:
    """Layers ``layers`` over ``seq`` tokens (a power of two) with causal attention: input ``x``;
    outputs ``x`` and each layer's ``k<i>``/``v<i>`` for the cache. ``adapters``: LoRA site ranks (None: base).

    ``past``: a chunk of a longer prompt, which also attends to the positions already in the KV cache:
    inputs ``mask`` and ``k<i>``/``v<i>`` caches as in :func:`decode_graph` (positions come from the
    cache's filled length, so one program serves every chunk) of ``context`` positions (default ``n_positions``).
    ``packed``: several whole prompts side by side on the lanes, each attending only to its own earlier
    positions through the input ``mask_packed`` ``[1, seq, 1, seq]`` (``orion.ops.packed_causal_mask``; positions
    are embedded by the caller, each prompt from 0)."""
    if past and packed:
        raise ValueError("prefill_graph: a packed pass reads whole prompts; it has no past (give one of them)")
    c, t = config.n_embd, context or config.n_positions
    g = Graph(f"gpt2_{'chunk' if past else 'packed' if packed else 'prefill'}_{layers.start}_{layers.stop}_s{seq}")
    x = g.input("x", [1, c, 1, seq])
    packed_mask = packed_mask_input(g, seq) if packed else None
    if past:
        mask = g.input("mask", [1, 1, 1, t])
        caches = {i: (g.input(f"k{i}", [1, c, 1, t]), g.input(f"v{i}", [1, c, 1, t])) for i in layers}
        causal = graph_causal_mask(g, seq)

    def attend(i: int, q: Node, k: Node, v: Node) -> Node:
        if past:
            return chunk_attention(g, q, k, v, *caches[i], mask, causal, config.n_head, config.attention_scale(i))
        return prefill_attention(g, config, i, q, k, v, packed_mask=packed_mask)

    g.output(_layers(g, x, config, weights, layers, attend, adapters, quant), "x")
    return g


def lm_head_graph(config: GPT2Config, weights: GPT2Weights, vocab: range, seq: int, quant: str = "fp16") -> Graph:
    """Final LayerNorm and the tied LM head for token ids ``vocab``: ``x`` -> ``logits`` [1, V, 1, S]."""
    g = Graph(f"gpt2_lm_head_{vocab.start}_{vocab.stop}_s{seq}")
    x = g.input("x", [1, config.n_embd, 1, seq])
    h = g.layer_norm(x, weights.ln_f_g, weights.ln_f_b, config.layer_norm_epsilon, name="ln_f")
    g.output(linear(g, h, weights.wte[vocab.start:vocab.stop], None, quant, "lm_head"), "logits")
    return g
