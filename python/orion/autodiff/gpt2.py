"""GPT-2 for training: the layer graph with its weights as inputs, and the fp32 CPU embedding and head."""

from __future__ import annotations

import numpy as np

from orion.autodiff import cpu
from orion.autodiff.trainable import TrainableModel, input_shape
from orion.graph.builder import Graph
from orion.lora.adapter import LayerTarget
from orion.lora.graph import Sites, adapted, adapted_parts
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.weights import BlockWeights, GPT2Weights


class GPT2Trainable(TrainableModel):
    """GPT-2 (tied LM head): q, k and v are separate inputs so no gradient is placed back into a fused qkv."""

    layer_prefix = "h"
    hf_layer_prefix, peft_fan_in_fan_out = "transformer.h.", True  # PEFT module paths; Conv1D weights

    def __init__(self, config: GPT2Config) -> None:
        self.config = config
        self.name, self.n_layers, self.dim, self.vocab_size = "gpt2", config.n_layer, config.n_embd, config.vocab_size

    def params(self, weights: GPT2Weights) -> dict[str, np.ndarray]:
        """The flat fp32 parameters of ``weights`` (``w_qkv`` split into ``w_q``, ``w_k``, ``w_v``)."""
        c = self.dim
        out = {"wte": weights.wte, "wpe": weights.wpe, "ln_f_g": weights.ln_f_g, "ln_f_b": weights.ln_f_b}
        for i, b in enumerate(weights.blocks):
            layer = {"ln1_g": b.ln1_g, "ln1_b": b.ln1_b, "w_attn_out": b.w_attn_out, "b_attn_out": b.b_attn_out,
                     "ln2_g": b.ln2_g, "ln2_b": b.ln2_b, "w_fc": b.w_fc, "b_fc": b.b_fc, "w_proj": b.w_proj,
                     "b_proj": b.b_proj}
            for j, t in enumerate("qkv"):
                layer[f"w_{t}"], layer[f"b_{t}"] = b.w_qkv[j * c:(j + 1) * c], b.b_qkv[j * c:(j + 1) * c]
            out.update({self.layer_param(i, k): v for k, v in layer.items()})
        return {k: np.array(v, np.float32) for k, v in out.items()}

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
        c = self.dim
        shapes = {"ln1_g": (c,), "ln1_b": (c,)}
        for t in "qkv":
            shapes.update({f"w_{t}": (c, c), f"b_{t}": (c,)})
        shapes.update({"w_attn_out": (c, c), "b_attn_out": (c,), "ln2_g": (c,), "ln2_b": (c,),
                       "w_fc": (4 * c, c), "b_fc": (4 * c,), "w_proj": (c, 4 * c), "b_proj": (c,)})
        return shapes

    def lora_targets(self) -> dict[str, LayerTarget]:
        """PEFT's modules of a block (``c_attn`` is q, k and v here, its rows split among them)."""
        return {"attn.c_attn": LayerTarget("attn_c_attn", (("w_q",), ("w_k",), ("w_v",))),
                "attn.c_proj": LayerTarget("attn_c_proj", (("w_attn_out",),)),
                "mlp.c_fc": LayerTarget("mlp_c_fc", (("w_fc",),)),
                "mlp.c_proj": LayerTarget("mlp_c_proj", (("w_proj",),))}

    def layer_graph(self, seq: int, adapters: Sites | None = None, lora_scale: float = 1.0) -> Graph:
        """The layer; with ``adapters`` (site of :meth:`lora_targets` -> rank) plus their LoRA terms."""
        c, eps = self.dim, self.config.layer_norm_epsilon
        g = Graph(f"gpt2_train_layer_c{c}_s{seq}" + ("_lora" if adapters else ""))
        x = g.input("x", [1, c, 1, seq])
        p = {name: g.input(name, input_shape(shape)) for name, shape in self.layer_shapes().items()}
        site = {module: t.site for module, t in self.lora_targets().items()}
        with g.scope("attn"):
            h = g.layer_norm(x, p["ln1_g"], p["ln1_b"], eps, name="ln")
            q, k, v = adapted_parts(g, [g.linear(h, p[f"w_{t}"], p[f"b_{t}"], name=t) for t in "qkv"], [h],
                                    site["attn.c_attn"], adapters, lora_scale)
            a = g.attention(q, k, v, self.config.n_head, name="core")
            proj = adapted(g, g.linear(a, p["w_attn_out"], p["b_attn_out"], name="proj"), [a], site["attn.c_proj"],
                           adapters, lora_scale)
            x = g.add(x, proj, name="res")
        with g.scope("mlp"):
            h = g.layer_norm(x, p["ln2_g"], p["ln2_b"], eps, name="ln")
            fc = adapted(g, g.linear(h, p["w_fc"], p["b_fc"], name="fc"), [h], site["mlp.c_fc"], adapters, lora_scale)
            up = g.gelu(fc, name="gelu")
            down = adapted(g, g.linear(up, p["w_proj"], p["b_proj"], name="proj"), [up], site["mlp.c_proj"], adapters,
                           lora_scale)
            x = g.add(x, down, name="res")
        g.output(x, "y")
        return g

    def embed(self, params: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
        return params["wte"][ids] + params["wpe"][: len(ids)]

    def embed_backward(self, params: dict[str, np.ndarray], ids: np.ndarray, dx: np.ndarray) -> dict[str, np.ndarray]:
        d_wpe = np.zeros_like(params["wpe"])
        d_wpe[: len(ids)] = dx
        return {"wte": cpu.scatter_rows(params["wte"].shape, ids, dx), "wpe": d_wpe}

    def head(self, params: dict[str, np.ndarray], x: np.ndarray, targets: np.ndarray
             ) -> tuple[float, np.ndarray, dict[str, np.ndarray]]:
        h, saved = cpu.layer_norm(x, params["ln_f_g"], params["ln_f_b"], self.config.layer_norm_epsilon)
        loss, dh, d_wte = cpu.cross_entropy(h, params["wte"], targets)
        dx, d_g, d_b = cpu.layer_norm_backward(dh, saved)
        return loss, dx, {"wte": d_wte, "ln_f_g": d_g, "ln_f_b": d_b}
