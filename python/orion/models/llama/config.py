"""Llama-family hyperparameters (Llama, Qwen2, Mistral, llama2.c), validated, and their Hugging Face
``config.json`` form.

The fields that change a model of each ``model_type`` are listed in :data:`MODEL_FIELDS`; each is
mapped to a :class:`LlamaConfig` field or checked to hold a value Orion implements (else a
:class:`ConfigError` naming the field). Every other field cannot change the model and is accepted
(:mod:`orion.models.config_fields`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orion.errors import OrionError
from orion.generation.hf_files import ModelFileError, read_json_object
from orion.models.config_fields import COMMON_MODEL_FIELDS, note_unread_fields

ROPE_CONVENTIONS = ("interleaved", "half")  # llama2.c/Meta pairs (2i, 2i+1); Hugging Face rotate-half
MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}


class ConfigError(OrionError, ValueError):
    """A Llama configuration is invalid, or a ``config.json`` holds something Orion does not implement."""


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-family shape. ``head_dim`` may differ from ``dim // n_heads``; ``n_kv_heads < n_heads`` is
    grouped-query attention. ``rope_convention`` says how the q/k weights pair rotated channels."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_convention: str = "half"
    tie_embeddings: bool = False
    qkv_bias: bool = False
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    sliding_window: int | None = None  # Mistral's and Qwen2's sliding-window attention (orion.models.blocks)
    sliding_layers: tuple[int, ...] | None = None  # the layers it applies to (None: every layer)

    def __post_init__(self) -> None:
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim", "vocab_size",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"LlamaConfig.{name} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"LlamaConfig: n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                              f"({self.n_kv_heads}); each KV head serves a whole group of query heads")
        if self.head_dim % 2:
            raise ConfigError(f"LlamaConfig.head_dim ({self.head_dim}) must be even: RoPE rotates channel pairs")
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"LlamaConfig.{name} must be a positive number, got {value!r}")
        if self.rope_convention not in ROPE_CONVENTIONS:
            raise ConfigError(f"LlamaConfig.rope_convention is {self.rope_convention!r}; "
                              f"use one of {', '.join(map(repr, ROPE_CONVENTIONS))}")
        if self.model_type not in MODEL_TYPES:
            raise ConfigError(f"LlamaConfig.model_type is {self.model_type!r}; use one of {sorted(MODEL_TYPES)}")
        if self.sliding_window is not None and (isinstance(self.sliding_window, bool) or
                                                not isinstance(self.sliding_window, int) or self.sliding_window <= 0):
            raise ConfigError(f"LlamaConfig.sliding_window must be a positive integer or None, got {self.sliding_window!r}")
        if self.sliding_window is not None and self.model_type == "llama":
            raise ConfigError("LlamaConfig.sliding_window: Llama has no sliding-window attention; use "
                              "model_type='mistral' or 'qwen2'")
        if self.sliding_layers is not None and not set(self.sliding_layers) <= set(range(self.n_layers)):
            raise ConfigError(f"LlamaConfig.sliding_layers {self.sliding_layers} names layers outside "
                              f"0..{self.n_layers - 1}")
        for token in (self.bos_token_id, *self.eos_token_ids):
            if token is not None and not 0 <= token < self.vocab_size:
                raise ConfigError(f"LlamaConfig: special token id {token} is outside the vocabulary "
                                  f"(vocab_size {self.vocab_size})")

    def window(self, layer: int) -> int | None:
        """The sliding window of layer ``layer`` (None: it attends to every earlier position, as it does when
        the window holds the whole context)."""
        if self.sliding_window is None or self.sliding_window >= self.max_position_embeddings or \
                (self.sliding_layers is not None and layer not in self.sliding_layers):
            return None
        return self.sliding_window

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    @property
    def q_dim(self) -> int:
        """Channels of all query heads."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Channels of all KV heads (one cache row per token and layer)."""
        return self.n_kv_heads * self.head_dim

    def param_count(self) -> int:
        """Number of parameters, counting a tied LM head once (109,529,856 for Stories110M)."""
        heads = 1 if self.tie_embeddings else 2
        return heads * self.vocab_size * self.dim + self.n_layers * self.layer_param_count() + self.dim

    def layer_param_count(self) -> int:
        """Parameters of one decoder layer (norm gains, projections, q/k/v biases if any)."""
        d, q, kv = self.dim, self.q_dim, self.kv_dim
        per_layer = 2 * d + d * q + 2 * d * kv + q * d + 3 * d * self.hidden_dim
        return per_layer + (q + 2 * kv if self.qkv_bias else 0)

    @classmethod
    def stories110m(cls) -> LlamaConfig:
        """llama2.c's Stories110M: dim 768, 12 layers, 12 heads (MHA), SwiGLU hidden 2048, vocab 32,000,
        context 1024, interleaved RoPE with theta 10000, tied embeddings, BOS 1 / EOS 2."""
        return cls(dim=768, n_layers=12, n_heads=12, n_kv_heads=12, head_dim=64, hidden_dim=2048,
                   vocab_size=32000, max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=10000.0,
                   rope_convention="interleaved", tie_embeddings=True, bos_token_id=1, eos_token_ids=(2,))

    @classmethod
    def from_hf_json(cls, source: dict[str, Any] | str | os.PathLike[str]) -> LlamaConfig:
        """Read a Hugging Face Llama / Qwen2 / Mistral ``config.json`` (a dict, the file or its directory)."""
        data, where = _read_json(source)
        try:
            return cls(**_map_hf(data, where))
        except ConfigError as exc:
            if str(exc).startswith(where):
                raise
            raise ConfigError(f"{where}: {exc}") from None

    def to_hf_json(self) -> dict[str, Any]:
        """The ``config.json`` transformers reads for this shape. Hugging Face checkpoints use rotate-half
        RoPE, so this needs ``rope_convention == "half"`` (``weights.to_rope_convention`` converts)."""
        if self.rope_convention != "half":
            raise ConfigError("LlamaConfig.to_hf_json: Hugging Face checkpoints use rotate-half RoPE, this config is "
                              f"{self.rope_convention!r}. Fix: convert with orion.models.llama.weights.to_rope_convention")
        if self.qkv_bias and self.model_type != "qwen2":
            raise ConfigError(f"LlamaConfig.to_hf_json: q/k/v biases exist only in Qwen2 checkpoints, model_type is "
                              f"{self.model_type!r}. Fix: use model_type='qwen2'")
        if self.model_type == "qwen2" and not self.qkv_bias:
            raise ConfigError("LlamaConfig.to_hf_json: Qwen2 checkpoints always have q/k/v biases, qkv_bias is False. "
                              "Fix: set qkv_bias=True or use model_type='llama'")
        eos: Any = list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else \
            (self.eos_token_ids[0] if self.eos_token_ids else None)
        out: dict[str, Any] = {
            "model_type": self.model_type, "architectures": [MODEL_TYPES[self.model_type]],
            "hidden_size": self.dim, "num_hidden_layers": self.n_layers, "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads, "head_dim": self.head_dim,
            "intermediate_size": self.hidden_dim, "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings, "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "hidden_act": "silu", "tie_word_embeddings": self.tie_embeddings,
            "bos_token_id": self.bos_token_id, "eos_token_id": eos,
        }
        if self.model_type == "llama":
            out.update(attention_bias=False, mlp_bias=False)
        elif self.model_type == "qwen2":
            layers = range(self.n_layers) if self.sliding_layers is None else self.sliding_layers
            out.update(use_sliding_window=self.sliding_window is not None, sliding_window=self.sliding_window,
                       max_window_layers=self.n_layers, layer_types=[
                           "sliding_attention" if self.sliding_window and i in layers else "full_attention"
                           for i in range(self.n_layers)])
        else:
            if self.sliding_layers is not None:
                raise ConfigError("LlamaConfig.to_hf_json: Mistral slides the window in every layer; "
                                  "sliding_layers must be None")
            out.update(sliding_window=self.sliding_window)
        return out


# The fields that change a model of each model_type (orion.models.config_fields): each is implemented
# below or refused by name; every other field is accepted (bookkeeping), with at most one note.
_LLAMA_FIELDS = COMMON_MODEL_FIELDS | {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "max_position_embeddings", "rms_norm_eps", "hidden_act", "rope_theta", "rope_parameters",
    "rope_scaling", "partial_rotary_factor", "attention_bias", "mlp_bias", "sliding_window"}
MODEL_FIELDS: dict[str, frozenset[str]] = {
    "llama": frozenset(_LLAMA_FIELDS),
    "mistral": frozenset(_LLAMA_FIELDS - {"attention_bias", "mlp_bias"}),
    "qwen2": frozenset(_LLAMA_FIELDS - {"attention_bias", "mlp_bias"}
                       | {"use_sliding_window", "max_window_layers", "layer_types", "use_mrope"}),
}
_REQUIRED = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
             "hidden_dim": "intermediate_size", "vocab_size": "vocab_size",
             "max_position_embeddings": "max_position_embeddings"}


# Fields that change the model, implemented only at the value that changes nothing.
_NEUTRAL_VALUES: dict[str, Any] = {"partial_rotary_factor": 1.0, "quantization_config": None}
_NEUTRAL_WHAT = {"partial_rotary_factor": "RoPE on part of each head",
                 "quantization_config": "a quantized checkpoint (load the unquantized one, or a GGUF file)"}
DISPLAY_NAMES = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}


def _read_json(source: dict[str, Any] | str | os.PathLike[str]) -> tuple[dict[str, Any], str]:
    if isinstance(source, dict):
        return source, "config dict"
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        return read_json_object(path), str(path)
    except ModelFileError as err:
        raise ConfigError(f"{err}; a Llama-family directory needs a Hugging Face config.json") from None


def _unsupported(where: str, field: str, value: Any, what: str) -> ConfigError:
    return ConfigError(f"{where}: field {field!r} is {json.dumps(value)}: {what} is not implemented by Orion. "
                       "Fix: use a checkpoint without it (Orion never ignores a field that changes the model)")


def _rope_theta(data: dict[str, Any], where: str) -> float:
    """RoPE's base from transformers 5's ``rope_parameters`` or the older ``rope_scaling`` and top-level
    ``rope_theta`` (any of them may hold it; values that disagree are an error); RoPE scaling other
    than ``default`` is refused by name."""
    thetas: dict[str, Any] = {}
    if "rope_theta" in data:
        thetas["rope_theta"] = data["rope_theta"]
    for name in ("rope_parameters", "rope_scaling"):
        params = data.get(name)
        if params is None:
            continue
        if not isinstance(params, dict):
            raise ConfigError(f"{where}: field {name!r} must be an object, got {json.dumps(params)}")
        for key, value in params.items():
            if key == "rope_theta":
                thetas[f"{name}.rope_theta"] = value
            elif key in ("rope_type", "type"):
                if value != "default":
                    raise _unsupported(where, f"{name}.{key}", value, f"RoPE scaling {value!r}")
            elif not (key == "partial_rotary_factor" and value == 1.0):
                raise _unsupported(where, f"{name}.{key}", value, "this RoPE parameter")
    if len(set(map(repr, thetas.values()))) > 1:
        raise ConfigError(f"{where}: RoPE's base is given twice with different values "
                          f"({', '.join(f'{k}={v}' for k, v in thetas.items())}). Fix: keep one")
    return next(iter(thetas.values()), 10000.0)


def _sliding_window(data: dict[str, Any], where: str, model_type: str, n_layers: int
                    ) -> tuple[int | None, tuple[int, ...] | None]:
    """The sliding window and the layers it applies to, as transformers reads them: Mistral's
    ``sliding_window`` in every layer; Qwen2's only with ``use_sliding_window``, in the ``layer_types``
    layers marked ``sliding_attention`` (by default the layers from ``max_window_layers`` on)."""
    window = data.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        raise ConfigError(f"{where}: field 'sliding_window' is {json.dumps(window)}; use a positive integer or null")
    if model_type == "llama":
        if window is not None:
            raise _unsupported(where, "sliding_window", window, "sliding-window attention in a Llama config")
        return None, None
    if model_type == "mistral":
        return window, None
    if not data.get("use_sliding_window", False):
        return None, None
    layer_types = data.get("layer_types")
    if layer_types is None:
        start = data.get("max_window_layers", 28)
        if isinstance(start, bool) or not isinstance(start, int):
            raise ConfigError(f"{where}: field 'max_window_layers' is {json.dumps(start)}; use an integer")
        layer_types = ["sliding_attention" if i >= start else "full_attention" for i in range(n_layers)]
    if not isinstance(layer_types, list) or len(layer_types) != n_layers or \
            not set(layer_types) <= {"full_attention", "sliding_attention"}:
        raise _unsupported(where, "layer_types", layer_types,
                           f"anything but {n_layers} entries of 'full_attention' or 'sliding_attention'")
    layers = tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")
    return (window, layers) if window is not None and layers else (None, None)


def _map_hf(data: dict[str, Any], where: str) -> dict[str, Any]:
    model_type = data.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"{where}: model_type is {model_type!r}; Orion's Llama family reads "
                          f"{', '.join(map(repr, MODEL_TYPES))}")
    arch = data.get("architectures")
    if arch is not None and arch != [MODEL_TYPES[model_type]]:
        raise ConfigError(f"{where}: field 'architectures' is {json.dumps(arch)}; Orion runs "
                          f"{MODEL_TYPES[model_type]} only (a causal LM with an LM head)")
    values: dict[str, Any] = {"model_type": model_type, "rope_convention": "half"}
    for ours, key in _REQUIRED.items():
        if key not in data:
            raise ConfigError(f"{where}: missing key {key!r} (LlamaConfig.{ours})")
        values[ours] = data[key]
    kv = data.get("num_key_value_heads")
    values["n_kv_heads"] = values["n_heads"] if kv is None else kv
    head_dim = data.get("head_dim")
    if head_dim is None:
        if not isinstance(values["n_heads"], int) or not values["n_heads"] or values["dim"] % values["n_heads"]:
            raise ConfigError(f"{where}: no 'head_dim', and hidden_size {values['dim']} is not a multiple of "
                              f"num_attention_heads {values['n_heads']}. Fix: give head_dim")
        head_dim = values["dim"] // values["n_heads"]
    values["head_dim"] = head_dim
    values["rms_norm_eps"] = data.get("rms_norm_eps", 1e-6)
    values["tie_embeddings"] = bool(data.get("tie_word_embeddings", False))
    values["rope_theta"] = _rope_theta(data, where)

    act = data.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise _unsupported(where, "hidden_act", act, "an MLP activation other than SiLU")
    if model_type == "llama":
        for key in ("attention_bias", "mlp_bias"):
            if data.get(key, False):
                raise _unsupported(where, key, data[key], "Llama with projection biases")
    values["qkv_bias"] = model_type == "qwen2"
    if model_type == "qwen2":
        if data.get("use_mrope", False):
            raise _unsupported(where, "use_mrope", data["use_mrope"], "multimodal RoPE")
    values["sliding_window"], values["sliding_layers"] = _sliding_window(data, where, model_type, values["n_layers"])

    values["bos_token_id"] = data.get("bos_token_id")
    eos = data.get("eos_token_id")
    values["eos_token_ids"] = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))

    for key, neutral in _NEUTRAL_VALUES.items():
        if data.get(key, neutral) not in (neutral, None):
            raise _unsupported(where, key, data[key], _NEUTRAL_WHAT[key])
    note_unread_fields(data, where, DISPLAY_NAMES[model_type], MODEL_FIELDS[model_type])
    return values
