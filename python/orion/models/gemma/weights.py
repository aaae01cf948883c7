"""Gemma 2 / Gemma 3 text weights as float32 numpy arrays (projections ``[out, in]``; norm gains as stored, the
``w`` of ``(1 + w)``), and Hugging Face directories (``model.safetensors`` or a sharded index, F32, F16 or BF16)."""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from orion.errors import OrionError
from orion.generation.hf_files import CONFIG_FILE
from orion.models.gemma.config import GemmaConfig
from orion.models.weights_io import (
    INDEX_FILE,
    PROGRESS_EVERY,
    PROGRESS_MIN_BYTES,
    WEIGHTS_FILE,
    MappedSafetensors,
    WeightsSource,
    check_weight_shapes,
    content_hash,
    safetensors_files,
    write_safetensors,
)

DIRECTORY_HELP = ("a Gemma directory holds a Hugging Face config.json and model.safetensors "
                  "(or model.safetensors.index.json with its shards)")
SAVE_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_READ_DTYPES = {"F16", "BF16", "F32", "F64"}

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
_TOP_NAMES: dict[str, str] = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight",
                              "lm_head": "lm_head.weight"}


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
class GemmaWeights:
    """All weights (float32); ``lm_head`` is None when tied to ``embed`` (every published Gemma)."""

    embed: np.ndarray
    norm: np.ndarray
    layers: list[LayerWeights]
    lm_head: np.ndarray | None = None
    source: WeightsSource | None = field(default=None, repr=False, compare=False)

    @property
    def classifier(self) -> np.ndarray:
        return self.embed if self.lm_head is None else self.lm_head

    def arrays(self) -> Iterator[tuple[str, np.ndarray]]:
        """Every stored array with its Orion name, in a fixed order."""
        yield "embed", self.embed
        yield "norm", self.norm
        if self.lm_head is not None:
            yield "lm_head", self.lm_head
        for i, layer in enumerate(self.layers):
            for f in fields(LayerWeights):
                array = getattr(layer, f.name)
                if array is not None:
                    yield f"layers.{i}.{f.name}", array

    def validate(self, config: GemmaConfig) -> None:
        if len(self.layers) != config.n_layers:
            raise WeightsError(f"GemmaWeights has {len(self.layers)} layers, config.n_layers is {config.n_layers}")
        if (self.lm_head is None) != config.tie_embeddings:
            raise WeightsError(f"GemmaWeights.lm_head is {'absent' if self.lm_head is None else 'present'} but "
                               f"config.tie_embeddings is {config.tie_embeddings}")
        for i, layer in enumerate(self.layers):
            for name in _QK_NORMS:
                if (getattr(layer, name) is None) == config.qk_norm:
                    raise WeightsError(f"GemmaWeights.layers.{i}.{name} is {'absent' if config.qk_norm else 'present'}"
                                       f" but config.qk_norm is {config.qk_norm}")
        check_weight_shapes("GemmaWeights", self.arrays(), expected_shapes(config), WeightsError)

    def content_hash(self, config: GemmaConfig) -> str:
        self.validate(config)
        return content_hash("orion-gemma-weights-v1", repr(config), self.arrays(), self.source)


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
    names: dict[str, tuple[str, int | None]] = {hf: (ours, None) for ours, hf in _TOP_NAMES.items()
                                                if ours != "lm_head" or not config.tie_embeddings}
    for i in range(config.n_layers):
        for ours, hf in _LAYER_NAMES.items():
            if ours not in _QK_NORMS or config.qk_norm:
                names[f"model.layers.{i}.{hf}"] = (ours, i)
    return names


def load_hf(path: str | os.PathLike[str], progress: bool | None = None) -> tuple[GemmaConfig, GemmaWeights]:
    """Load a Hugging Face Gemma 2 / Gemma 3 text directory as float32 (tensors stored as F32, F16 or BF16). Every
    stored tensor must be one the config implies; a tied checkpoint may store ``lm_head.weight`` only if it equals
    the embedding."""
    directory = Path(path)
    if not directory.is_dir():
        raise WeightsError(f"{directory}: no such directory; {DIRECTORY_HELP}")
    config = GemmaConfig.from_hf_json(directory)
    shards = safetensors_files(directory, WeightsError, DIRECTORY_HELP)
    if progress is None:
        progress = sum(f.stat().st_size for f in shards) >= PROGRESS_MIN_BYTES
    expected, shapes = _hf_names(config), expected_shapes(config)
    found: dict[str, np.ndarray] = {}
    where: dict[str, Path] = {}
    mapped: list[MappedSafetensors] = []
    for file, listed in shards.items():
        try:
            handle = safe_open(str(file), framework="np")
            mapped.append(MappedSafetensors(file))
        except (SafetensorError, OSError, ValueError, struct.error) as exc:
            raise WeightsError(f"{file}: not a readable safetensors file ({exc})") from exc
        with handle as f:
            keys = sorted(f.keys())
            absent = sorted((listed or set()) - set(keys))
            if absent:
                raise WeightsError(f"{directory / INDEX_FILE}: lists tensor {absent[0]!r} in {file.name}, which lacks it")
            for key in keys:
                if listed is not None and key not in listed:
                    raise WeightsError(f"{file}: tensor {key!r} is not listed for this shard in {INDEX_FILE}")
                tied_head = key == _TOP_NAMES["lm_head"] and config.tie_embeddings
                if key not in expected and not tied_head:
                    raise WeightsError(f"{file}: unexpected tensor {key!r}: not a weight of this {config.model_type} "
                                       f"config (n_layers={config.n_layers}, tied: {config.tie_embeddings}); is "
                                       f"{CONFIG_FILE} the checkpoint's own?")
                if key in where:
                    raise WeightsError(f"{file}: tensor {key!r} is stored twice (also in {where[key]})")
                where[key] = file
                ours = "lm_head" if tied_head else expected[key][0]
                stored = f.get_slice(key)
                dtype, shape = stored.get_dtype(), tuple(stored.get_shape())
                if dtype not in _READ_DTYPES:
                    raise WeightsError(f"{file}: tensor {key!r} has dtype {dtype}; expected F32, F16 or BF16")
                if shape != shapes[ours]:
                    raise WeightsError(f"{file}: tensor {key!r} has shape {shape}, expected {shapes[ours]} "
                                       f"(from {CONFIG_FILE})")
                found[key] = mapped[-1].float32(key)
                if progress and len(found) % PROGRESS_EVERY == 0:
                    print(f"orion: loading {directory.name}: {len(found)} tensors", file=sys.stderr, flush=True)
    missing = [name for name in expected if name not in found]
    if missing:
        raise WeightsError(f"{directory}: missing tensor {missing[0]!r}"
                           + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
                           + f" that {CONFIG_FILE} implies ({config.model_type}, tied: {config.tie_embeddings})")
    if config.tie_embeddings and _TOP_NAMES["lm_head"] in found and \
            not np.array_equal(found.pop(_TOP_NAMES["lm_head"]), found[_TOP_NAMES["embed"]]):
        raise WeightsError(f"{where[_TOP_NAMES['lm_head']]}: 'lm_head.weight' differs from 'model.embed_tokens.weight' "
                           f"but {CONFIG_FILE} has tie_word_embeddings=true. Fix: set it to false")
    top = {ours: found[hf] for ours, hf in _TOP_NAMES.items() if hf in found}
    layers = [LayerWeights(**{ours: found[f"model.layers.{i}.{hf}"] for ours, hf in _LAYER_NAMES.items()
                              if f"model.layers.{i}.{hf}" in found}) for i in range(config.n_layers)]
    if progress:
        print(f"orion: loaded {directory.name}: {len(found)} tensors", file=sys.stderr, flush=True)
    weights = GemmaWeights(**top, layers=layers)
    weights.source = WeightsSource(mapped, dict(weights.arrays()))
    weights.source.release_pages()
    return config, weights


def save_hf(path: str | os.PathLike[str], config: GemmaConfig, weights: GemmaWeights, dtype: str = "float32") -> None:
    """Write a Hugging Face directory transformers reads: ``config.json`` and ``model.safetensors`` (a tied LM
    head is not stored)."""
    if dtype not in SAVE_DTYPES:
        raise WeightsError(f"save_hf: dtype {dtype!r} is not one of {', '.join(SAVE_DTYPES)}")
    weights.validate(config)
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {hf: getattr(weights if layer is None else weights.layers[layer], ours)
               for hf, (ours, layer) in _hf_names(config).items()}
    (directory / CONFIG_FILE).write_text(json.dumps(config.to_hf_json() | {"dtype": dtype}, indent=2) + "\n")
    write_safetensors(directory / WEIGHTS_FILE, tensors, SAVE_DTYPES[dtype])
