"""Gemma 2 / Gemma 3 text for training: the parameter map, the layer graph (:func:`orion.models.gemma.graphs.layer`
with its weights as inputs) and the fp32 CPU embedding (times sqrt(dim)) and head (``(1 + w)`` norm, soft-capping)."""

from __future__ import annotations

import numpy as np

from orion.autodiff import cpu
from orion.autodiff.trainable import TrainableModel
from orion.graph.builder import Graph
from orion.graph.ir import Node
from orion.lora.adapter import LayerTarget
from orion.lora.graph import Sites
from orion.models.blocks import InputParams, layer_flag_pick, window_causal_mask
from orion.models.gemma import graphs
from orion.models.gemma.config import GemmaConfig
from orion.models.gemma.weights import GemmaWeights, LayerWeights
from orion.models.llama.graphs import rope_partner
from orion.models.llama.lora import lora_placements
from orion.models.llama.trainable import flat_params, grouped_weights
from orion.ops import causal_mask


class GemmaTrainable(TrainableModel):
    """Each query group's rows of ``wq`` (columns of ``wo``) are their own inputs ``wq_g<j>`` / ``wo_g<j>``, as in
    Llama's; norm parameters are transformers' ``w`` (the graph adds the one)."""

    layer_prefix = "l"
    hf_layer_prefix, peft_fan_in_fan_out = "model.layers.", False
    lora_aliases = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
                    "down": "down_proj"}

    def __init__(self, config: GemmaConfig) -> None:
        self.config = config
        self.name, self.n_layers, self.dim, self.vocab_size = config.model_type, config.n_layers, config.dim, \
            config.vocab_size
        self.context = config.max_position_embeddings
        self.attention_per_layer = config.group_size

    @property
    def head_param(self) -> str:
        return "embed" if self.config.tie_embeddings else "lm_head"

    def params(self, weights: GemmaWeights) -> dict[str, np.ndarray]:
        """The flat fp32 parameters of ``weights`` (``wq``/``wo`` split by query group, as Llama's)."""
        return flat_params(self, weights)

    def layer_params(self, weights: GemmaWeights, layer: int) -> dict[str, np.ndarray]:
        return graphs.layer_arrays(self.config, weights.layers[layer])

    def weights(self, params: dict[str, np.ndarray]) -> GemmaWeights:
        """The inverse of :meth:`params`: float32 :class:`GemmaWeights`."""
        return grouped_weights(self, params, LayerWeights, GemmaWeights)

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        d, kv, h, hd = self.dim, self.config.kv_dim, self.config.hidden_dim, self.config.head_dim
        shapes: dict[str, tuple[int, ...]] = {"attn_norm": (d,), "wk": (kv, d), "wv": (kv, d)}
        for j in range(self.config.group_size):
            shapes.update({f"wq_g{j}": (kv, d), f"wo_g{j}": (d, kv)})
        if self.config.qk_norm:
            shapes.update(q_norm=(hd,), k_norm=(hd,))
        shapes.update({"attn_post_norm": (d,), "mlp_norm": (d,), "w_gate": (h, d), "w_up": (h, d), "w_down": (d, h),
                       "mlp_post_norm": (d,)})
        return shapes

    def lora_targets(self) -> dict[str, LayerTarget]:
        groups = range(self.config.group_size)
        placed = {path.split(".", 3)[3]: p for path, p in lora_placements(self.config).items()
                  if path.startswith("model.layers.0.")}
        grids = {"self_attn.q_proj": tuple((f"wq_g{j}",) for j in groups), "self_attn.k_proj": (("wk",),),
                 "self_attn.v_proj": (("wv",),), "self_attn.o_proj": (tuple(f"wo_g{j}" for j in groups),),
                 "mlp.gate_proj": (("w_gate",),), "mlp.up_proj": (("w_up",),), "mlp.down_proj": (("w_down",),)}
        return {module: LayerTarget(module.split(".")[1], grid, placed[module].src_rows, placed[module].cols)
                for module, grid in grids.items()}

    def _layer_flags(self) -> dict[str, list[bool]]:
        """Per-layer 0/1 inputs of the one layer graph, where the layers differ: ``sliding`` (a sliding window) and
        ``local_rope`` (Gemma 3's local RoPE table)."""
        cfg = self.config
        flags = {"sliding": [cfg.window(i) is not None for i in range(self.n_layers)],
                 "local_rope": [graphs.local_rope(cfg, i) for i in range(self.n_layers)]}
        return {name: values for name, values in flags.items() if len(set(values)) > 1}

    def layer_inputs(self, params: dict[str, np.ndarray], layer: int) -> dict[str, np.ndarray]:
        """The parameters, and the layer's flags (:meth:`_layer_flags`) as ``[1, 1, 1, 1]`` inputs of 0 or 1."""
        flags = {name: np.full((1, 1, 1, 1), float(values[layer]), np.float32)
                 for name, values in self._layer_flags().items()}
        return super().layer_inputs(params, layer) | flags

    def layer_graph(self, seq: int, adapters: Sites | None = None, lora_scale: float = 1.0) -> Graph:
        """The layer (:func:`orion.models.gemma.graphs.layer`) with every parameter an input; with ``adapters`` (site
        of :meth:`lora_targets` -> rank) plus their LoRA terms. The layers share it: where they differ in their
        mask or RoPE table, a 0/1 flag input picks each (``(1 - f) a + f b``, exact for f in {0, 1})."""
        cfg = self.config
        kv, hd = cfg.n_kv_heads, cfg.head_dim
        g = Graph(f"gemma_train_layer_d{self.dim}_s{seq}" + ("_lora" if adapters else ""))
        x = g.input("x", [1, self.dim, 1, seq])
        params = InputParams(g, self.layer_shapes(), {m: t.site for m, t in self.lora_targets().items()}, adapters,
                             lora_scale)
        flags = {name: g.input(name, [1, 1, 1, 1]) for name in self._layer_flags()}

        def pick(name: str, flag: str, arrays: tuple[np.ndarray, np.ndarray]) -> Node:
            return layer_flag_pick(g, name, flags.get(flag), arrays, self._uniform(flag))

        window = next((w for i in range(self.n_layers) if (w := cfg.window(i))), None)
        masks = (causal_mask(seq), window_causal_mask(seq, window) if window and window < seq else causal_mask(seq))
        mask = pick("mask", "sliding", masks)
        tables = [graphs.rope_tables(cfg, np.arange(seq), local) for local in (False, True)]
        cos, sin = (pick(f"rope_{n}", "local_rope", tuple(t[k].reshape(1, 1, hd, seq) for t in tables))
                    for k, n in enumerate(("cos", "sin")))
        values: list[Node] = []

        def attend(j: int, qh: Node, kh: Node, k: Node, v: Node) -> Node:
            if not values:
                values.append(g.reshape(v, [1, kv, hd, seq], name="v_heads"))
            return graphs.group_attention(g, qh, kh, values[0], mask, cfg, f"core_g{j}")

        g.output(graphs.layer(g, x, cfg, params, (cos, sin, rope_partner(g, cfg)), attend)[0], "y")
        return g

    def _uniform(self, flag: str) -> bool:
        """The value every layer shares of a flag that does not differ between layers."""
        cfg = self.config
        return cfg.window(0) is not None if flag == "sliding" else graphs.local_rope(cfg, 0)

    def embed(self, params: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
        return params["embed"][ids] * np.float32(self.config.embed_scale)

    def embed_backward(self, params: dict[str, np.ndarray], ids: np.ndarray, dx: np.ndarray,
                       into: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        return {"embed": cpu.scatter_rows(params["embed"].shape, ids, dx * np.float32(self.config.embed_scale),
                                          (into or {}).get("embed"))}

    def head(self, params: dict[str, np.ndarray], x: np.ndarray, targets: np.ndarray, frozen: bool = False,
             into: dict[str, np.ndarray] | None = None) -> tuple[float, np.ndarray, dict[str, np.ndarray]]:
        """The ``(1 + w)`` final norm, the classifier, Gemma 2's final soft-capping and the mean cross-entropy."""
        h, saved = cpu.rms_norm(x, np.float32(1.0) + params["norm"], self.config.rms_norm_eps)
        classifier = params[self.head_param]
        logits = cpu.matmul(h, classifier, transpose_b=True)
        cap = self.config.final_softcap
        tanh = np.tanh(logits / cap) if cap else None
        loss, d_logits = cpu.cross_entropy_of_logits(logits if cap is None else cap * tanh, targets)
        if cap:
            d_logits = d_logits * (1.0 - tanh * tanh)
        dh, d_classifier = cpu.head_backward(h, classifier, d_logits, frozen,
                                             (into or {}).get(self.head_param))
        dx, d_norm = cpu.rms_norm_backward(dh, saved)
        return loss, dx, {} if frozen else {self.head_param: d_classifier, "norm": d_norm}

