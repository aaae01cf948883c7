"""GPT-2 as Orion graphs: transformer blocks for prefill and for KV-cache decode, and the LM head.

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

from orion.graph import Graph
from orion.graph.ir import Node
from orion.lora.graph import Sites, adapted
from orion.models.blocks import cached_attention, chunk_attention, linear
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.weights import GPT2Weights
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


def _layers(g: Graph, x: Node, config: GPT2Config, weights: GPT2Weights, layers: range, attend: Attend,
            adapters: Sites | None, quant: str) -> Node:
    """Blocks ``layers`` on the residual stream ``x``; each block's key and value become outputs
    ``k<i>``/``v<i>``. ``attend`` is the attention itself (causal over the prompt, or over the cache);
    ``adapters`` the LoRA site ranks (``orion.lora.graph``)."""
    c, eps = config.n_embd, config.layer_norm_epsilon
    for i in layers:
        b, site = weights.blocks[i], lora_site_names(i)
        with g.scope(f"h{i}.attn"):
            h = g.layer_norm(x, b.ln1_g, b.ln1_b, eps, name="ln")
            qkv = adapted(g, linear(g, h, b.w_qkv, b.b_qkv, quant, "qkv"), [h], site["attn.c_attn"], adapters)
            q, k, v = g.split(qkv, [c, c, c], axis=1, name="qkv")
            g.output(k, f"k{i}")
            g.output(v, f"v{i}")
            a = attend(i, q, k, v)
            proj = adapted(g, linear(g, a, b.w_attn_out, b.b_attn_out, quant, "proj"), [a], site["attn.c_proj"], adapters)
            x = g.add(x, proj, name="res")
        with g.scope(f"h{i}.mlp"):
            h = g.layer_norm(x, b.ln2_g, b.ln2_b, eps, name="ln")
            fc = adapted(g, linear(g, h, b.w_fc, b.b_fc, quant, "fc"), [h], site["mlp.c_fc"], adapters)
            up = activation(g, fc, config.activation_function)
            down = adapted(g, linear(g, up, b.w_proj, b.b_proj, quant, "proj"), [up], site["mlp.c_proj"], adapters)
            x = g.add(x, down, name="res")
    return x


def decode_graph(config: GPT2Config, weights: GPT2Weights, layers: range, adapters: Sites | None = None,
                 quant: str = "fp16", context: int | None = None) -> Graph:
    """Layers ``layers`` for one token: inputs ``x``, ``mask``, ``k<i>``/``v<i>`` caches of ``context``
    positions (default ``n_positions``); outputs ``x`` (the residual stream after the last layer) and
    each layer's new ``k<i>``/``v<i>``."""
    c, t = config.n_embd, context or config.n_positions
    g = Graph(f"gpt2_decode_{layers.start}_{layers.stop}")
    x = g.input("x", [1, c, 1, 1])
    mask = g.input("mask", [1, 1, 1, t])
    caches = {i: (g.input(f"k{i}", [1, c, 1, t]), g.input(f"v{i}", [1, c, 1, t])) for i in layers}

    def attend(i: int, q: Node, k: Node, v: Node) -> Node:
        return cached_attention(g, q, k, v, *caches[i], mask, config.n_head, config.attention_scale(i))

    g.output(_layers(g, x, config, weights, layers, attend, adapters, quant), "x")
    return g


def prefill_graph(config: GPT2Config, weights: GPT2Weights, layers: range, seq: int,
                  adapters: Sites | None = None, quant: str = "fp16", past: bool = False) -> Graph:
    """Layers ``layers`` over ``seq`` tokens (a power of two) with causal attention: input ``x``;
    outputs ``x`` and each layer's ``k<i>``/``v<i>`` for the cache. ``adapters``: LoRA site ranks (None: base).

    ``past``: a chunk of a longer prompt, which also attends to the positions already in the KV cache:
    inputs ``mask`` and ``k<i>``/``v<i>`` caches as in :func:`decode_graph` (positions come from the
    cache's filled length, so one program serves every chunk)."""
    c, t = config.n_embd, config.n_positions
    g = Graph(f"gpt2_{'chunk' if past else 'prefill'}_{layers.start}_{layers.stop}_s{seq}")
    x = g.input("x", [1, c, 1, seq])
    if past:
        mask = g.input("mask", [1, 1, 1, t])
        caches = {i: (g.input(f"k{i}", [1, c, 1, t]), g.input(f"v{i}", [1, c, 1, t])) for i in layers}
        causal = graph_causal_mask(g, seq)

    def attend(i: int, q: Node, k: Node, v: Node) -> Node:
        if past:
            return chunk_attention(g, q, k, v, *caches[i], mask, causal, config.n_head, config.attention_scale(i))
        # g.attention scales by 1/sqrt(head_dim): other scales are folded into q first.
        factor = config.attention_scale(i) * math.sqrt(config.head_dim)
        if factor != 1.0:
            q = g.mul(q, factor, name="q_scale")
        return g.attention(q, k, v, config.n_head, causal=True, name="core")

    g.output(_layers(g, x, config, weights, layers, attend, adapters, quant), "x")
    return g


def lm_head_graph(config: GPT2Config, weights: GPT2Weights, vocab: range, seq: int, quant: str = "fp16") -> Graph:
    """Final LayerNorm and the tied LM head for token ids ``vocab``: ``x`` -> ``logits`` [1, V, 1, S]."""
    g = Graph(f"gpt2_lm_head_{vocab.start}_{vocab.stop}_s{seq}")
    x = g.input("x", [1, config.n_embd, 1, seq])
    h = g.layer_norm(x, weights.ln_f_g, weights.ln_f_b, config.layer_norm_epsilon, name="ln_f")
    g.output(linear(g, h, weights.wte[vocab.start:vocab.stop], None, quant, "lm_head"), "logits")
    return g
