"""Gemma 2 / Gemma 3 text weights as float32 numpy arrays (projections ``[out, in]``; norm gains as stored, the
``w`` of ``(1 + w)``), and Hugging Face directories (``model.safetensors`` or a sharded index, F32, F16 or BF16)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orion.errors import OrionError
from orion.models.gemma.config import GemmaConfig
from orion.models.hf_checkpoint import Checkpoint, DecoderWeights, attach_source, hf_names, load_hf_dir, save_hf_dir

DIRECTORY_HELP = ("a Gemma directory holds a Hugging Face config.json and model.safetensors "
                  "(or model.safetensors.index.json with its shards)")

# Orion field -> name under "model.layers.N." in a Hugging Face checkpoint.
_LAYER_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight", "wk": "self_attn.k_proj.weight", "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight", "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
    "attn_post_norm": "post_attention_layernorm.weight",
    "mlp_norm": "pre_feedforward_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight", "w_up": "mlp.up_proj.weight", "w_down": "mlp.down_proj.weight",
    "mlp_post_norm": "post_feedforward_layernorm.weight",
}
_QK_NORMS = ("q_norm", "k_norm")


class WeightsError(OrionError):
    """Gemma weights are missing, malformed or do not match their configuration."""


@dataclass
class LayerWeights:
    """One decoder layer; norms hold transformers' ``w`` (the gain is ``1 + w``); q/k norms only in Gemma 3."""

    attn_norm: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    attn_post_norm: np.ndarray
    mlp_norm: np.ndarray
    w_gate: np.ndarray
    w_up: np.ndarray
    w_down: np.ndarray
    mlp_post_norm: np.ndarray
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None


@dataclass
class GemmaWeights(DecoderWeights[LayerWeights]):
    """All weights (float32); ``lm_head`` is None when tied to ``embed`` (every published Gemma)."""

    HASH_TAG = "orion-gemma-weights-v1"
    OPTIONAL = dict.fromkeys(_QK_NORMS, "qk_norm")

    def validate(self, config: GemmaConfig) -> None:
        """Raise :class:`WeightsError` unless every array has the shape ``config`` implies, q/k norms are present
        exactly when ``config.qk_norm`` and the LM head exactly when untied."""
        self.check(config, expected_shapes(config), WeightsError)


def expected_shapes(config: GemmaConfig) -> dict[str, tuple[int, ...]]:
    d, q, kv, h = config.dim, config.q_dim, config.kv_dim, config.hidden_dim
    return {"embed": (config.vocab_size, d), "norm": (d,), "lm_head": (config.vocab_size, d),
            "attn_norm": (d,), "wq": (q, d), "wk": (kv, d), "wv": (kv, d), "wo": (d, q),
            "q_norm": (config.head_dim,), "k_norm": (config.head_dim,), "attn_post_norm": (d,), "mlp_norm": (d,),
            "w_gate": (h, d), "w_up": (h, d), "w_down": (d, h), "mlp_post_norm": (d,)}


def random_weights(config: GemmaConfig, seed: int = 0) -> GemmaWeights:
    """Deterministic weights: matrices normal(0, 0.02), ``wo`` and ``w_down`` scaled by 1/sqrt(2 * n_layers), norm
    ``w`` normal(0, 0.1) (gains near 1, none exactly 1)."""
    rng = np.random.default_rng(seed)
    shapes = expected_shapes(config)
    residual_std = 0.02 / math.sqrt(2 * config.n_layers)

    def normal(name: str, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shapes[name], dtype=np.float32) * np.float32(std)).astype(np.float32)

    layers = []
    for _ in range(config.n_layers):
        parts = {name: normal(name, 0.1 if name.endswith("norm") else residual_std if name in ("wo", "w_down")
                              else 0.02) for name in _LAYER_NAMES if name not in _QK_NORMS or config.qk_norm}
        layers.append(LayerWeights(**parts))
    lm_head = None if config.tie_embeddings else normal("lm_head")
    return GemmaWeights(embed=normal("embed", 1.0 / math.sqrt(config.dim)), norm=normal("norm", 0.1), layers=layers,
                        lm_head=lm_head)


def _hf_names(config: GemmaConfig) -> dict[str, tuple[str, int | None]]:
    """Hugging Face tensor name -> (Orion field, layer index or None) for every tensor the checkpoint stores."""
    return hf_names(config.n_layers, config.tie_embeddings, _LAYER_NAMES,
                    lambda ours: ours not in _QK_NORMS or config.qk_norm)


def load_hf(path: str | os.PathLike[str], progress: bool | None = None) -> tuple[GemmaConfig, GemmaWeights]:
    """Load a Hugging Face Gemma 2 / Gemma 3 text directory as float32 (tensors stored as F32, F16 or BF16). Every
    stored tensor must be one the config implies; a tied checkpoint may store ``lm_head.weight`` only if it equals
    the embedding."""
    directory = Path(path)
    if not directory.is_dir():
        raise WeightsError(f"{directory}: no such directory; {DIRECTORY_HELP}")
    config = GemmaConfig.from_hf_json(directory)
    about = f"{config.model_type} config (n_layers={config.n_layers}, tied: {config.tie_embeddings})"
    spec = Checkpoint(config, _hf_names(config), expected_shapes(config), about, WeightsError, DIRECTORY_HELP,
                      float32=True)
    top, layers, mapped = load_hf_dir(directory, spec, progress)
    weights = GemmaWeights(**top, layers=[LayerWeights(**fields) for fields in layers])
    attach_source(weights, mapped)
    return config, weights


def save_hf(path: str | os.PathLike[str], config: GemmaConfig, weights: GemmaWeights, dtype: str = "float32") -> None:
    """Write a Hugging Face directory transformers reads: ``config.json`` and ``model.safetensors`` (a tied LM
    head is not stored)."""
    weights.validate(config)
    save_hf_dir(path, config.to_hf_json(), weights.by_hf_name(_hf_names(config)), dtype, WeightsError)
