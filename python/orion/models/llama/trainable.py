"""A Llama-family model (Llama, Mistral, Qwen2, Qwen3, SmolLM3, Phi-3) for training: the parameter map, the layer graph
(:func:`orion.models.llama.graphs.layer` with its weights as inputs) and the fp32 CPU embedding and head."""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from orion.autodiff import cpu
from orion.autodiff.trainable import TrainableModel
from orion.graph.builder import Graph
from orion.graph.ir import Node
from orion.lora.adapter import LayerTarget
from orion.lora.graph import Sites
from orion.models.blocks import InputParams, layer_flag_pick, masked_attention, window_causal_mask
from orion.models.hf_checkpoint import DecoderWeights
from orion.models.llama.config import LlamaConfig
from orion.models.llama.graphs import group_rows, layer, layer_arrays, rope_partner, rope_tables
from orion.models.llama.lora import lora_placements
from orion.models.llama.weights import LayerWeights, LlamaWeights
from orion.ops import causal_mask

Weights = TypeVar("Weights", bound=DecoderWeights)


class LlamaTrainable(TrainableModel):
    """Each query group's rows of ``wq`` (and ``bq``, and columns of ``wo``) are their own inputs ``wq_g<j>``
    (``bq_g<j>``) / ``wo_g<j>``, so the groups attend as plain multi-head attention over the shared keys and
    values; RMSNorm is the registry op (its direct gradient rule holds for any gain)."""

    layer_prefix = "l"
    hf_layer_prefix, peft_fan_in_fan_out = "model.layers.", False  # PEFT module paths; nn.Linear weights
    lora_aliases = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
                    "down": "down_proj"}  # short target names of the command line -> PEFT module names

    def __init__(self, config: LlamaConfig) -> None:
        self.config = config
        self.name, self.n_layers, self.dim, self.vocab_size = "llama", config.n_layers, config.dim, config.vocab_size
        self.context = config.max_position_embeddings
        self.attention_per_layer = config.group_size  # one attention per query group, all of one layer
        if config.variant.fused_checkpoint:  # Phi-3: q/k/v and gate/up are one module each
            self.lora_aliases = {"q": "qkv_proj", "k": "qkv_proj", "v": "qkv_proj", "qkv": "qkv_proj", "o": "o_proj",
                                 "gate": "gate_up_proj", "up": "gate_up_proj", "gate_up": "gate_up_proj",
                                 "down": "down_proj"}

    @property
    def head_param(self) -> str:
        """The classifier's parameter: the embedding when tied."""
        return "embed" if self.config.tie_embeddings else "lm_head"

    def params(self, weights: LlamaWeights) -> dict[str, np.ndarray]:
        """The flat fp32 parameters of ``weights`` (``wq``/``bq``/``wo`` split by query group)."""
        return flat_params(self, weights)

    def layer_params(self, weights: LlamaWeights, layer: int) -> dict[str, np.ndarray]:
        return layer_arrays(self.config, weights.layers[layer])

    def weights(self, params: dict[str, np.ndarray]) -> LlamaWeights:
        """The inverse of :meth:`params`: float32 :class:`LlamaWeights` (query groups merged back)."""
        return grouped_weights(self, params, LayerWeights, LlamaWeights)

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        d, kv, h = self.dim, self.config.kv_dim, self.config.hidden_dim
        shapes: dict[str, tuple[int, ...]] = {"attn_norm": (d,), "wk": (kv, d), "wv": (kv, d)}
        for j in range(self.config.group_size):
            shapes.update({f"wq_g{j}": (kv, d), f"wo_g{j}": (d, kv)})
        if self.config.qkv_bias:
            shapes.update({f"bq_g{j}": (kv,) for j in range(self.config.group_size)})
            shapes.update(bk=(kv,), bv=(kv,))
        if self.config.qk_norm:
            shapes.update(q_norm=(self.config.head_dim,), k_norm=(self.config.head_dim,))
        shapes.update({"mlp_norm": (d,), "w_gate": (h, d), "w_up": (h, d), "w_down": (d, h)})
        return shapes

    def lora_targets(self) -> dict[str, LayerTarget]:
        """PEFT's modules of a layer: q's rows split among the query groups (in the RoPE convention's row order,
        as the inference placements say), o's columns among them, the others one parameter each (a fused
        checkpoint's qkv_proj: the query groups' rows, then k's, then v's; gate_up_proj: gate's, then up's)."""
        groups = range(self.config.group_size)
        placed = {path.split(".", 3)[3]: p for path, p in lora_placements(self.config).items()
                  if path.startswith("model.layers.0.")}
        q = tuple((f"wq_g{j}",) for j in groups)
        grids = {"self_attn.o_proj": (tuple(f"wo_g{j}" for j in groups),), "mlp.down_proj": (("w_down",),)}
        if self.config.variant.fused_checkpoint:
            grids |= {"self_attn.qkv_proj": (*q, ("wk",), ("wv",)), "mlp.gate_up_proj": (("w_gate",), ("w_up",))}
        else:
            grids |= {"self_attn.q_proj": q, "self_attn.k_proj": (("wk",),), "self_attn.v_proj": (("wv",),),
                      "mlp.gate_proj": (("w_gate",),), "mlp.up_proj": (("w_up",),)}
        return {module: LayerTarget(module.split(".")[1], grid, placed[module].src_rows, placed[module].cols)
                for module, grid in grids.items()}

    def layer_inputs(self, params: dict[str, np.ndarray], layer: int) -> dict[str, np.ndarray]:
        """The layer's parameters; where only some layers slide (Qwen2) the 0/1 ``sliding`` flag of the layer, and
        with layers that skip RoPE its ``rope_on`` flag (1: rotates, 0: does not)."""
        inputs = super().layer_inputs(params, layer)
        if self._mixed_windows():
            inputs["sliding"] = np.full((1, 1, 1, 1), float(self.config.window(layer) is not None), np.float32)
        if self.config.no_rope_layers:
            inputs["rope_on"] = np.full((1, 1, 1, 1), float(self.config.uses_rope(layer)), np.float32)
        return inputs

    def _mixed_windows(self) -> bool:
        return len({self.config.window(i) for i in range(self.n_layers)}) > 1

    def layer_graph(self, seq: int, adapters: Sites | None = None, lora_scale: float = 1.0) -> Graph:
        """The layer (:func:`orion.models.llama.graphs.layer`) with every parameter an input; with ``adapters``
        (site of :meth:`lora_targets` -> rank) plus their LoRA terms. A sliding window shorter than ``seq`` masks
        the scores by a windowed const (picked per layer by a ``sliding`` flag input where only some layers slide)."""
        cfg = self.config
        kv, hd = cfg.n_kv_heads, cfg.head_dim
        g = Graph(f"llama_train_layer_d{self.dim}_s{seq}" + ("_lora" if adapters else ""))
        x = g.input("x", [1, self.dim, 1, seq])
        params = InputParams(g, self.layer_shapes(), {m: t.site for m, t in self.lora_targets().items()}, adapters,
                             lora_scale)
        cos_table, sin_table = rope_tables(cfg, np.arange(seq))
        cos, sin = (g.const(n, t.reshape(1, 1, hd, seq)) for n, t in (("rope_cos", cos_table), ("rope_sin", sin_table)))
        if cfg.no_rope_layers:  # one graph for every layer: "rope_on" (1 or 0) makes the tables RoPE's or identity's
            on = g.input("rope_on", [1, 1, 1, 1])
            off = g.add(g.mul(on, -1.0, name="rope_off_neg"), 1.0, name="rope_off")
            cos = g.add(g.mul(cos, on, name="rope_cos_on"), off, name="rope_cos_gated")
            sin = g.mul(sin, on, name="rope_sin_gated")

        window = next((w for i in range(self.n_layers) if (w := cfg.window(i))), None)
        if window is not None and (window < seq or self._mixed_windows()):
            flag = g.input("sliding", [1, 1, 1, 1]) if self._mixed_windows() else None
            mask = layer_flag_pick(g, "mask", flag, (causal_mask(seq), window_causal_mask(seq, window)), True)
            values: list[Node] = []

            def attend(j: int, qh: Node, kh: Node, k: Node, v: Node) -> Node:
                if not values:
                    values.append(g.reshape(v, [1, kv, hd, seq], name="v_heads"))
                return masked_attention(g, qh, kh, values[0], mask, 1.0 / np.sqrt(hd), None, f"core_g{j}")
        else:
            def attend(j: int, qh: Node, kh: Node, k: Node, v: Node) -> Node:
                q = g.reshape(qh, [1, cfg.kv_dim, 1, seq], name=f"q{j}_flat")
                return g.attention(q, k, v, kv, name=f"core_g{j}")

        g.output(layer(g, x, cfg, params, (cos, sin, rope_partner(g, cfg)), attend)[0], "y")
        return g

    def embed(self, params: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
        return params["embed"][ids]

    def embed_backward(self, params: dict[str, np.ndarray], ids: np.ndarray, dx: np.ndarray,
                       into: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        return {"embed": cpu.scatter_rows(params["embed"].shape, ids, dx, (into or {}).get("embed"))}

    def head(self, params: dict[str, np.ndarray], x: np.ndarray, targets: np.ndarray, frozen: bool = False,
             into: dict[str, np.ndarray] | None = None) -> tuple[float, np.ndarray, dict[str, np.ndarray]]:
        h, saved = cpu.rms_norm(x, params["norm"], self.config.rms_norm_eps)
        loss, dh, d_cls = cpu.cross_entropy(h, params[self.head_param], targets, frozen,
                                            (into or {}).get(self.head_param))
        dx, d_norm = cpu.rms_norm_backward(dh, saved)
        return loss, dx, {} if frozen else {self.head_param: d_cls, "norm": d_norm}


def flat_params(model: TrainableModel, weights: DecoderWeights[Any]) -> dict[str, np.ndarray]:
    """The flat fp32 parameters of a decoder's ``weights`` (``model.config``'s family): embedding, final norm, the
    LM head when untied, and each layer's ``model.layer_params`` (its graph inputs, query groups split)."""
    config = model.config  # type: ignore[attr-defined]
    out = {"embed": weights.embed, "norm": weights.norm}
    if not config.tie_embeddings:
        out["lm_head"] = weights.classifier
    for i in range(len(weights.layers)):
        out.update({model.layer_param(i, k): v for k, v in model.layer_params(weights, i).items()})
    return {k: np.array(v, np.float32) for k, v in out.items()}


def grouped_weights(model: TrainableModel, params: dict[str, np.ndarray], layer_class: type,
                    weights_class: type[Weights]) -> Weights:
    """The inverse of :func:`flat_params`: float32 weights whose layers (``layer_class``, fields named as
    ``model.layer_shapes()``) get ``wq``/``wo`` (and ``bq`` when split) merged back from the query groups."""
    cfg = model.config  # type: ignore[attr-defined]
    layers = []
    for i in range(model.n_layers):
        p = {name: np.asarray(params[model.layer_param(i, name)], np.float32) for name in model.layer_shapes()}
        fields = {k: v for k, v in p.items() if not k.startswith(("wq_g", "wo_g", "bq_g"))}
        fields["wq"] = np.zeros((cfg.q_dim, cfg.dim), np.float32)
        fields["wo"] = np.zeros((cfg.dim, cfg.q_dim), np.float32)
        if "bq_g0" in p:
            fields["bq"] = np.zeros(cfg.q_dim, np.float32)
        for j in range(cfg.group_size):
            rows = group_rows(cfg, j)
            fields["wq"][rows], fields["wo"][:, rows] = p[f"wq_g{j}"], p[f"wo_g{j}"]
            if "bq" in fields:
                fields["bq"][rows] = p[f"bq_g{j}"]
        layers.append(layer_class(**fields))
    lm_head = None if cfg.tie_embeddings else np.asarray(params["lm_head"], np.float32)
    return weights_class(embed=np.asarray(params["embed"], np.float32), norm=np.asarray(params["norm"], np.float32),
                         layers=layers, lm_head=lm_head)
