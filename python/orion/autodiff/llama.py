"""Llama for training: the layer graph with its weights as inputs (RoPE, grouped-query attention, SwiGLU),
and the fp32 CPU embedding and head."""

from __future__ import annotations

import numpy as np

from orion.autodiff import cpu
from orion.autodiff.context import GradientError
from orion.autodiff.trainable import TrainableModel, input_shape
from orion.graph.builder import Graph
from orion.graph.ir import Node
from orion.lora.adapter import LayerTarget
from orion.lora.graph import Sites, adapted, adapted_parts
from orion.models.llama.config import LlamaConfig
from orion.models.llama.graphs import _rope_partner, apply_rope, group_rows, rope_tables
from orion.models.llama.lora import lora_placements
from orion.models.llama.weights import LayerWeights, LlamaWeights


class LlamaTrainable(TrainableModel):
    """A Llama without q/k/v biases. Each query group's rows of ``wq`` (and columns of ``wo``) are their own
    inputs ``wq_g<j>`` / ``wo_g<j>``, so the groups attend as plain multi-head attention over the shared
    keys and values; RMSNorm is the registry op (its direct gradient rule holds for any gain)."""

    layer_prefix = "l"
    hf_layer_prefix, peft_fan_in_fan_out = "model.layers.", False  # PEFT module paths; nn.Linear weights

    def __init__(self, config: LlamaConfig) -> None:
        if config.qkv_bias:
            raise GradientError(f"{config.model_type}: q/k/v biases are not supported by the training layer graph yet. "
                                "Fix: train a model without qkv_bias")
        self.config = config
        self.name, self.n_layers, self.dim, self.vocab_size = "llama", config.n_layers, config.dim, config.vocab_size
        self.attention_per_layer = config.group_size  # one attention per query group, all of one layer

    @property
    def head_param(self) -> str:
        """The classifier's parameter: the embedding when tied."""
        return "embed" if self.config.tie_embeddings else "lm_head"

    def params(self, weights: LlamaWeights) -> dict[str, np.ndarray]:
        """The flat fp32 parameters of ``weights`` (``wq``/``wo`` split by query group)."""
        out = {"embed": weights.embed, "norm": weights.norm}
        if not self.config.tie_embeddings:
            out["lm_head"] = weights.classifier
        for i, layer in enumerate(weights.layers):
            part = {"attn_norm": layer.attn_norm, "wk": layer.wk, "wv": layer.wv, "mlp_norm": layer.mlp_norm,
                    "w_gate": layer.w_gate, "w_up": layer.w_up, "w_down": layer.w_down}
            for j in range(self.config.group_size):
                rows = group_rows(self.config, j)
                part[f"wq_g{j}"], part[f"wo_g{j}"] = layer.wq[rows], layer.wo[:, rows]
            out.update({self.layer_param(i, k): v for k, v in part.items()})
        return {k: np.array(v, np.float32) for k, v in out.items()}

    def weights(self, params: dict[str, np.ndarray]) -> LlamaWeights:
        """The inverse of :meth:`params`: float32 :class:`LlamaWeights` (query groups merged back)."""
        cfg = self.config
        layers = []
        for i in range(self.n_layers):
            p = {name: np.asarray(params[self.layer_param(i, name)], np.float32) for name in self.layer_shapes()}
            wq = np.zeros((cfg.q_dim, cfg.dim), np.float32)
            wo = np.zeros((cfg.dim, cfg.q_dim), np.float32)
            for j in range(cfg.group_size):
                rows = group_rows(cfg, j)
                wq[rows], wo[:, rows] = p[f"wq_g{j}"], p[f"wo_g{j}"]
            layers.append(LayerWeights(p["attn_norm"], wq, p["wk"], p["wv"], wo, p["mlp_norm"], p["w_gate"], p["w_up"],
                                       p["w_down"]))
        lm_head = None if cfg.tie_embeddings else np.asarray(params["lm_head"], np.float32)
        return LlamaWeights(np.asarray(params["embed"], np.float32), np.asarray(params["norm"], np.float32), layers,
                            lm_head)

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        d, kv, h = self.dim, self.config.kv_dim, self.config.hidden_dim
        shapes: dict[str, tuple[int, ...]] = {"attn_norm": (d,), "wk": (kv, d), "wv": (kv, d)}
        for j in range(self.config.group_size):
            shapes.update({f"wq_g{j}": (kv, d), f"wo_g{j}": (d, kv)})
        shapes.update({"mlp_norm": (d,), "w_gate": (h, d), "w_up": (h, d), "w_down": (d, h)})
        return shapes

    def lora_targets(self) -> dict[str, LayerTarget]:
        """PEFT's modules of a layer: q's rows split among the query groups (in the RoPE convention's row order,
        as the inference placements say), o's columns among them, the others one parameter each."""
        groups = range(self.config.group_size)
        placed = {path.split(".", 3)[3]: p for path, p in lora_placements(self.config).items()
                  if path.startswith("model.layers.0.")}
        grids = {"self_attn.q_proj": tuple((f"wq_g{j}",) for j in groups), "self_attn.k_proj": (("wk",),),
                 "self_attn.v_proj": (("wv",),), "self_attn.o_proj": (tuple(f"wo_g{j}" for j in groups),),
                 "mlp.gate_proj": (("w_gate",),), "mlp.up_proj": (("w_up",),), "mlp.down_proj": (("w_down",),)}
        return {module: LayerTarget(module.split(".")[1], grid, placed[module].src_rows, placed[module].cols)
                for module, grid in grids.items()}

    def layer_graph(self, seq: int, adapters: Sites | None = None, lora_scale: float = 1.0) -> Graph:
        """The layer; with ``adapters`` (site of :meth:`lora_targets` -> rank) plus their LoRA terms."""
        cfg = self.config
        kv, hd, eps = cfg.n_kv_heads, cfg.head_dim, cfg.rms_norm_eps
        g = Graph(f"llama_train_layer_d{self.dim}_s{seq}" + ("_lora" if adapters else ""))
        x = g.input("x", [1, self.dim, 1, seq])
        p = {name: g.input(name, input_shape(shape)) for name, shape in self.layer_shapes().items()}
        cos_table, sin_table = rope_tables(cfg, np.arange(seq))
        cos, sin = (g.const(n, t.reshape(1, 1, hd, seq)) for n, t in (("rope_cos", cos_table), ("rope_sin", sin_table)))
        partner = _rope_partner(g, cfg)
        site = {module: t.site for module, t in self.lora_targets().items()}

        def rotated(t: Node, name: str) -> Node:
            heads = apply_rope(g, t, kv, cos, sin, partner, name)
            return g.reshape(heads, [1, cfg.kv_dim, 1, seq], name=f"{name}_flat")

        def linear(h: Node, weight: str, name: str, module: str) -> Node:
            return adapted(g, g.linear(h, p[weight], name=name), [h], site[module], adapters, lora_scale)

        with g.scope("attn"):
            h = g.rms_norm(x, p["attn_norm"], eps, name="norm")
            k = rotated(linear(h, "wk", "k", "self_attn.k_proj"), "k_rope")
            v = linear(h, "wv", "v", "self_attn.v_proj")
            queries = adapted_parts(g, [g.linear(h, p[f"wq_g{j}"], name=f"q_g{j}") for j in range(cfg.group_size)],
                                    [h], site["self_attn.q_proj"], adapters, lora_scale)
            out, contexts = None, []
            for j, q in enumerate(queries):
                contexts.append(g.attention(rotated(q, f"q_g{j}_rope"), k, v, kv, name=f"core_g{j}"))
                part = g.linear(contexts[-1], p[f"wo_g{j}"], name=f"o_g{j}")
                out = part if out is None else g.add(out, part, name=f"o_sum{j}")
            x = g.add(x, adapted(g, out, contexts, site["self_attn.o_proj"], adapters, lora_scale), name="res")
        with g.scope("mlp"):
            h = g.rms_norm(x, p["mlp_norm"], eps, name="norm")
            act = g.silu(linear(h, "w_gate", "gate", "mlp.gate_proj"), name="silu")
            swiglu = g.mul(act, linear(h, "w_up", "up", "mlp.up_proj"), name="swiglu")
            x = g.add(x, linear(swiglu, "w_down", "down", "mlp.down_proj"), name="res")
        g.output(x, "y")
        return g

    def embed(self, params: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
        return params["embed"][ids]

    def embed_backward(self, params: dict[str, np.ndarray], ids: np.ndarray, dx: np.ndarray) -> dict[str, np.ndarray]:
        return {"embed": cpu.scatter_rows(params["embed"].shape, ids, dx)}

    def head(self, params: dict[str, np.ndarray], x: np.ndarray, targets: np.ndarray
             ) -> tuple[float, np.ndarray, dict[str, np.ndarray]]:
        h, saved = cpu.rms_norm(x, params["norm"], self.config.rms_norm_eps)
        loss, dh, d_cls = cpu.cross_entropy(h, params[self.head_param], targets)
        dx, d_norm = cpu.rms_norm_backward(dh, saved)
        return loss, dx, {self.head_param: d_cls, "norm": d_norm}
