"""Where each Hugging Face Llama module's LoRA update lands in Orion's fused Llama graphs."""

from __future__ import annotations

import numpy as np

from orion.lora.adapter import Placement, Site
from orion.models.llama.config import LlamaConfig
from orion.models.llama.graphs import group_rows, lora_site_names, projections, qkv_order
from orion.models.llama.weights import hf_rows


def lora_placements(config: LlamaConfig) -> dict[str, Placement]:
    """Module path -> placement for every layer: q, k, v on the qkv site (q rows in query-group order, q/k rows
    in the RoPE convention's order), o on the o site with one input piece per query group, gate and up on
    the gate_up site, down alone; a fused checkpoint's qkv_proj and gate_up_proj each fill their whole site."""
    dim, q_dim, kv, hidden = config.dim, config.n_heads * config.head_dim, config.kv_dim, config.hidden_dim
    groups = range(config.group_size)
    q_rows = hf_rows(config, config.n_heads)[qkv_order(config)]
    k_rows = hf_rows(config, config.n_kv_heads)
    first_qkv, first_gate_up = (next(iter(modules)) for modules in projections(config))
    placements = {}
    for i in range(config.n_layers):
        names = lora_site_names(config, i)
        qkv = Site(names[first_qkv], q_dim + 2 * kv, (dim,))
        gate_up = Site(names[first_gate_up], 2 * hidden, (dim,))
        o = Site(names["self_attn.o_proj"], dim, tuple(kv for _ in groups))
        layer = {
            "self_attn.o_proj": Placement(o, q_dim, dim, slice(0, dim), None,
                                          tuple(group_rows(config, j) for j in groups)),
            "mlp.down_proj": Placement(Site(names["mlp.down_proj"], dim, (hidden,)), hidden, dim, slice(0, dim)),
        }
        if config.fused_checkpoint:
            rows = np.concatenate([q_rows, q_dim + k_rows, q_dim + kv + np.arange(kv)])
            layer["self_attn.qkv_proj"] = Placement(qkv, dim, q_dim + 2 * kv, slice(0, q_dim + 2 * kv), rows)
            layer["mlp.gate_up_proj"] = Placement(gate_up, dim, 2 * hidden, slice(0, 2 * hidden))
        else:
            layer |= {
                "self_attn.q_proj": Placement(qkv, dim, q_dim, slice(0, q_dim), q_rows),
                "self_attn.k_proj": Placement(qkv, dim, kv, slice(q_dim, q_dim + kv), k_rows),
                "self_attn.v_proj": Placement(qkv, dim, kv, slice(q_dim + kv, q_dim + 2 * kv)),
                "mlp.gate_proj": Placement(gate_up, dim, hidden, slice(0, hidden)),
                "mlp.up_proj": Placement(gate_up, dim, hidden, slice(hidden, 2 * hidden)),
            }
        placements.update({f"model.layers.{i}.{module}": p for module, p in layer.items()})
    return placements
