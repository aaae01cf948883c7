"""GPT-2 for training: the parameter map, the layer graph (:func:`orion.models.gpt2.graphs.block` with its
weights as inputs) and the fp32 CPU embedding and head."""

from __future__ import annotations

import numpy as np

from orion.autodiff import cpu
from orion.autodiff.trainable import TrainableModel
from orion.graph.builder import Graph
from orion.graph.ir import Node
from orion.lora.adapter import LayerTarget
from orion.lora.graph import Sites
from orion.models.blocks import InputParams
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.graphs import block, layer_arrays, prefill_attention
from orion.models.gpt2.weights import BlockWeights, GPT2Weights


class GPT2Trainable(TrainableModel):
    """GPT-2 (tied LM head): q, k and v are separate inputs so no gradient is placed back into a fused qkv.
    With ``scale_attn_by_inverse_layer_idx`` the layer graph (one for all layers) takes the layer's attention
    factor as the input ``attn_scale`` ``[1, C, 1, 1]``."""

    layer_prefix = "h"
    hf_layer_prefix, peft_fan_in_fan_out = "transformer.h.", True  # PEFT module paths; Conv1D weights
    lora_aliases = {"q": "c_attn", "k": "c_attn", "v": "c_attn", "qkv": "c_attn", "o": "attn.c_proj",
                    "fc": "mlp.c_fc", "up": "mlp.c_fc", "down": "mlp.c_proj"}  # command-line short target names

    def __init__(self, config: GPT2Config) -> None:
        self.config = config
        self.name, self.n_layers, self.dim, self.vocab_size = "gpt2", config.n_layer, config.n_embd, config.vocab_size
        self.context = config.n_positions

    def params(self, weights: GPT2Weights) -> dict[str, np.ndarray]:
        """The flat fp32 parameters of ``weights`` (``w_qkv`` split into ``w_q``, ``w_k``, ``w_v``)."""
        out = {"wte": weights.wte, "wpe": weights.wpe, "ln_f_g": weights.ln_f_g, "ln_f_b": weights.ln_f_b}
        for i in range(len(weights.blocks)):
            out.update({self.layer_param(i, k): v for k, v in self.layer_params(weights, i).items()})
        return {k: np.array(v, np.float32) for k, v in out.items()}

    def layer_params(self, weights: GPT2Weights, layer: int) -> dict[str, np.ndarray]:
        return layer_arrays(weights.blocks[layer])

    def weights(self, params: dict[str, np.ndarray]) -> GPT2Weights:
        """The inverse of :meth:`params`: float32 :class:`GPT2Weights` (``w_q``, ``w_k``, ``w_v`` fused again)."""
        def f32(a: np.ndarray) -> np.ndarray:
            return np.asarray(a, np.float32)

        blocks = []
        for i in range(self.n_layers):
            p = {name: f32(params[self.layer_param(i, name)]) for name in self.layer_shapes()}
            blocks.append(BlockWeights(
                p["ln1_g"], p["ln1_b"], np.concatenate([p["w_q"], p["w_k"], p["w_v"]]),
                np.concatenate([p["b_q"], p["b_k"], p["b_v"]]), p["w_attn_out"], p["b_attn_out"], p["ln2_g"],
                p["ln2_b"], p["w_fc"], p["b_fc"], p["w_proj"], p["b_proj"]))
        return GPT2Weights(f32(params["wte"]), f32(params["wpe"]), f32(params["ln_f_g"]), f32(params["ln_f_b"]), blocks)

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        c, f = self.dim, self.config.inner
        shapes = {"ln1_g": (c,), "ln1_b": (c,)}
        for t in "qkv":
            shapes.update({f"w_{t}": (c, c), f"b_{t}": (c,)})
        shapes.update({"w_attn_out": (c, c), "b_attn_out": (c,), "ln2_g": (c,), "ln2_b": (c,),
                       "w_fc": (f, c), "b_fc": (f,), "w_proj": (c, f), "b_proj": (c,)})
        return shapes

    def lora_targets(self) -> dict[str, LayerTarget]:
        """PEFT's modules of a block (``c_attn`` is q, k and v here, its rows split among them)."""
        return {"attn.c_attn": LayerTarget("attn_c_attn", (("w_q",), ("w_k",), ("w_v",))),
                "attn.c_proj": LayerTarget("attn_c_proj", (("w_attn_out",),)),
                "mlp.c_fc": LayerTarget("mlp_c_fc", (("w_fc",),)),
                "mlp.c_proj": LayerTarget("mlp_c_proj", (("w_proj",),))}

    def layer_graph(self, seq: int, adapters: Sites | None = None, lora_scale: float = 1.0) -> Graph:
        """The block (:func:`orion.models.gpt2.graphs.block`) with every parameter an input; with ``adapters``
        (site of :meth:`lora_targets` -> rank) plus their LoRA terms."""
        cfg = self.config
        g = Graph(f"gpt2_train_layer_c{self.dim}_s{seq}" + ("_lora" if adapters else ""))
        x = g.input("x", [1, self.dim, 1, seq])
        params = InputParams(g, self.layer_shapes(), {m: t.site for m, t in self.lora_targets().items()}, adapters,
                             lora_scale)
        scale = g.input("attn_scale", [1, self.dim, 1, 1]) if cfg.scale_attn_by_inverse_layer_idx else None

        def attend(layer: int, q: Node, k: Node, v: Node) -> Node:
            return prefill_attention(g, cfg, layer, q, k, v, scale)

        g.output(block(g, x, cfg, params, 0, attend)[0], "y")
        return g

    def layer_inputs(self, params: dict[str, np.ndarray], layer: int) -> dict[str, np.ndarray]:
        """The layer's parameters, and its ``attn_scale`` when the scale depends on the layer."""
        inputs = super().layer_inputs(params, layer)
        if self.config.scale_attn_by_inverse_layer_idx:
            factor = self.config.attention_scale(layer) * self.config.head_dim ** 0.5
            inputs["attn_scale"] = np.full((1, self.dim, 1, 1), factor, np.float32)
        return inputs

    def embed(self, params: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
        return params["wte"][ids] + params["wpe"][: len(ids)]

    def embed_backward(self, params: dict[str, np.ndarray], ids: np.ndarray, dx: np.ndarray,
                       into: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        d_wpe = np.zeros_like(params["wpe"])
        d_wpe[: len(ids)] = dx
        return {"wte": cpu.scatter_rows(params["wte"].shape, ids, dx, (into or {}).get("wte")), "wpe": d_wpe}

    def head(self, params: dict[str, np.ndarray], x: np.ndarray, targets: np.ndarray, frozen: bool = False,
             into: dict[str, np.ndarray] | None = None) -> tuple[float, np.ndarray, dict[str, np.ndarray]]:
        h, saved = cpu.layer_norm(x, params["ln_f_g"], params["ln_f_b"], self.config.layer_norm_epsilon)
        loss, dh, d_wte = cpu.cross_entropy(h, params["wte"], targets, frozen, (into or {}).get("wte"))
        dx, d_g, d_b = cpu.layer_norm_backward(dh, saved)
        return loss, dx, {} if frozen else {"wte": d_wte, "ln_f_g": d_g, "ln_f_b": d_b}
