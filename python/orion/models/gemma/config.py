"""Gemma 2 and Gemma 3 (text) hyperparameters, validated, and their Hugging Face ``config.json`` form.

The fields that change a model of each ``model_type`` are listed in :data:`MODEL_FIELDS`; each is mapped to
a :class:`GemmaConfig` field or checked to hold a value Orion implements (else a :class:`ConfigError` naming
the field). Every other field cannot change the model and is accepted (:mod:`orion.models.config_fields`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from orion.errors import OrionError
from orion.models.config_fields import COMMON_MODEL_FIELDS, note_unread_fields
from orion.models.llama.config import layer_types_slide, read_json, sliding_window, unsupported

MODEL_TYPES = {"gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
DISPLAY_NAMES = {"gemma2": "Gemma 2", "gemma3_text": "Gemma 3"}
ACTIVATIONS = ("gelu_pytorch_tanh",)  # transformers' tanh-approximated GELU (the registry's gelu)
LAYER_TYPES = ("full_attention", "sliding_attention")


class ConfigError(OrionError, ValueError):
    """A Gemma configuration is invalid, or a ``config.json`` holds something Orion does not implement."""


@dataclass(frozen=True)
class GemmaConfig:
    """A Gemma 2 / Gemma 3 text shape: GeGLU MLP, ``(1 + w)`` RMSNorms before and after attention and the MLP,
    the embedding scaled by sqrt(dim), attention scaled by ``query_pre_attn_scalar ** -0.5``, sliding-window
    attention in ``sliding_layers``. Gemma 2 soft-caps attention and final logits (``attn_softcap``,
    ``final_softcap``); Gemma 3 normalizes q and k per head (``qk_norm``) and rotates its sliding layers with
    ``rope_local_theta``, its global ones with ``rope_theta`` at positions divided by ``rope_linear_factor``.
    RoPE pairs are rotate-half (``rope_convention``, as Hugging Face stores q/k)."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    vocab_size: int
    max_position_embeddings: int
    sliding_window: int | None
    sliding_layers: tuple[int, ...]
    model_type: str = "gemma2"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_local_theta: float = 10000.0
    rope_linear_factor: float = 1.0
    query_pre_attn_scalar: float = 256.0
    attn_softcap: float | None = None
    final_softcap: float | None = None
    qk_norm: bool = False
    tie_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    rope_convention: str = "half"

    def __post_init__(self) -> None:
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim", "vocab_size",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"GemmaConfig.{name} must be a positive integer, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"GemmaConfig: n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                              f"({self.n_kv_heads}); each KV head serves a whole group of query heads")
        if self.head_dim % 2:
            raise ConfigError(f"GemmaConfig.head_dim ({self.head_dim}) must be even: RoPE rotates channel pairs")
        for name in ("rms_norm_eps", "rope_theta", "rope_local_theta", "rope_linear_factor", "query_pre_attn_scalar"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"GemmaConfig.{name} must be a positive number, got {value!r}")
        for name in ("attn_softcap", "final_softcap"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
                raise ConfigError(f"GemmaConfig.{name} must be a positive number or None, got {value!r}")
        window = self.sliding_window
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
            raise ConfigError(f"GemmaConfig.sliding_window must be a positive integer or None, got {window!r}")
        if not set(self.sliding_layers) <= set(range(self.n_layers)):
            raise ConfigError(f"GemmaConfig.sliding_layers {self.sliding_layers} names layers outside "
                              f"0..{self.n_layers - 1}")
        if self.sliding_layers and window is None:
            raise ConfigError("GemmaConfig: sliding_layers without a sliding_window")
        if self.model_type not in MODEL_TYPES:
            raise ConfigError(f"GemmaConfig.model_type is {self.model_type!r}; use one of {sorted(MODEL_TYPES)}")
        if self.rope_convention != "half":
            raise ConfigError("GemmaConfig.rope_convention must be 'half' (Hugging Face's rotate-half pairs)")
        for token in (self.bos_token_id, *self.eos_token_ids):
            if token is not None and not 0 <= token < self.vocab_size:
                raise ConfigError(f"GemmaConfig: special token id {token} is outside the vocabulary "
                                  f"(vocab_size {self.vocab_size})")

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def attention_scale(self) -> float:
        """The factor of the attention scores: ``query_pre_attn_scalar ** -0.5``."""
        return self.query_pre_attn_scalar ** -0.5

    @property
    def embed_scale(self) -> float:
        """sqrt(dim), the embedding's factor, rounded to float32 as transformers rounds it to the embedding's dtype."""
        return float(np.float32(math.sqrt(self.dim)))

    @property
    def rotary_dim(self) -> int:
        """Channels of each head RoPE rotates: all (read by the Llama RoPE helpers Gemma shares)."""
        return self.head_dim

    @property
    def qkv_bias(self) -> bool:
        """Gemma's projections have no biases (read by the Llama layout helpers Gemma shares)."""
        return False

    @property
    def fused_checkpoint(self) -> bool:
        """Gemma stores q/k/v and gate/up as separate modules (read by the Llama LoRA placements Gemma shares)."""
        return False

    def window(self, layer: int) -> int | None:
        """The sliding window of layer ``layer`` (None: a global layer, or a window that holds the whole context)."""
        if layer not in self.sliding_layers or self.sliding_window >= self.max_position_embeddings:
            return None
        return self.sliding_window

    def rope(self, layer: int) -> tuple[float, float]:
        """RoPE's base and linear position divisor in layer ``layer``: Gemma 3's sliding layers use the local base
        unscaled; every other layer ``rope_theta`` and ``rope_linear_factor``."""
        if self.model_type == "gemma3_text" and layer in self.sliding_layers:
            return self.rope_local_theta, 1.0
        return self.rope_theta, self.rope_linear_factor

    def param_count(self) -> int:
        """Number of parameters, counting a tied LM head once."""
        heads = 1 if self.tie_embeddings else 2
        return heads * self.vocab_size * self.dim + self.n_layers * self.layer_param_count() + self.dim

    def layer_param_count(self) -> int:
        """Parameters of one decoder layer: four norms, q/k norms (Gemma 3), the projections."""
        d, q, kv = self.dim, self.q_dim, self.kv_dim
        return 4 * d + (2 * self.head_dim if self.qk_norm else 0) + d * q + 2 * d * kv + q * d + 3 * d * self.hidden_dim

    @classmethod
    def from_hf_json(cls, source: dict[str, Any] | str | os.PathLike[str]) -> GemmaConfig:
        """Read a Hugging Face Gemma 2 / Gemma 3 text ``config.json`` (a dict, the file or its directory)."""
        data, where = read_json(source, "a Gemma", ConfigError)
        try:
            return cls(**_map_hf(data, where))
        except ConfigError as exc:
            if str(exc).startswith(where):
                raise
            raise ConfigError(f"{where}: {exc}") from None

    def to_hf_json(self) -> dict[str, Any]:
        """The ``config.json`` transformers reads for this shape."""
        eos: Any = list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else \
            (self.eos_token_ids[0] if self.eos_token_ids else None)
        out: dict[str, Any] = {
            "model_type": self.model_type, "architectures": [MODEL_TYPES[self.model_type]],
            "hidden_size": self.dim, "num_hidden_layers": self.n_layers, "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads, "head_dim": self.head_dim, "intermediate_size": self.hidden_dim,
            "vocab_size": self.vocab_size, "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps, "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": self.query_pre_attn_scalar, "sliding_window": self.sliding_window,
            "layer_types": [LAYER_TYPES[i in self.sliding_layers] for i in range(self.n_layers)],
            "attn_logit_softcapping": self.attn_softcap, "final_logit_softcapping": self.final_softcap,
            "attention_bias": False, "tie_word_embeddings": self.tie_embeddings,
            "bos_token_id": self.bos_token_id, "eos_token_id": eos, "pad_token_id": None,
        }
        if self.model_type == "gemma2":
            out["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta}
        else:
            full: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
            if self.rope_linear_factor != 1.0:
                full = {"rope_type": "linear", "factor": self.rope_linear_factor, "rope_theta": self.rope_theta}
            out["rope_parameters"] = {"full_attention": full,
                                      "sliding_attention": {"rope_type": "default", "rope_theta": self.rope_local_theta}}
        return out


# The fields that change a model of each model_type (orion.models.config_fields): each is implemented below or
# refused by name; every other field is accepted (bookkeeping), with at most one note. ``hidden_act`` is the
# older name of the activation: transformers' Gemma 2 and 3 read ``hidden_activation`` and ignore it, but a value
# other than GeGLU's is refused all the same (a checkpoint that says so is not one Orion should guess about).
_GEMMA_FIELDS = COMMON_MODEL_FIELDS | {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
    "max_position_embeddings", "rms_norm_eps", "hidden_activation", "hidden_act", "rope_theta", "rope_parameters",
    "rope_scaling", "query_pre_attn_scalar", "sliding_window", "layer_types", "attn_logit_softcapping",
    "final_logit_softcapping", "attention_bias", "use_bidirectional_attention"}
MODEL_FIELDS: dict[str, frozenset[str]] = {
    "gemma2": frozenset(_GEMMA_FIELDS),
    "gemma3_text": frozenset(_GEMMA_FIELDS | {"rope_local_base_freq", "sliding_window_pattern",
                                              "_sliding_window_pattern"}),  # transformers 5 saves the latter
}
_REQUIRED = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
             "hidden_dim": "intermediate_size", "vocab_size": "vocab_size",
             "max_position_embeddings": "max_position_embeddings"}
_DEFAULT_PATTERN = {"gemma2": 2, "gemma3_text": 6}  # every n-th layer global (transformers' defaults)


def _unsupported(where: str, field: str, value: Any, what: str) -> OrionError:
    """Llama's ``unsupported`` raising Gemma's :class:`ConfigError`."""
    return unsupported(where, field, value, what, ConfigError)


def _rope_block(params: Any, field: str, where: str) -> tuple[float | None, float]:
    """(base or None, linear factor) of one RoPE parameter block; scaling other than ``linear`` refused by name."""
    if params is None:
        return None, 1.0
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: field {field!r} must be an object, got {json.dumps(params)}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "linear"):
        raise _unsupported(where, f"{field}.rope_type", kind, f"RoPE scaling {kind!r}")
    factor = params.get("factor", 1.0) if kind == "linear" else 1.0
    for key, value in params.items():
        if key not in ("rope_type", "type", "rope_theta", "factor") and not (key == "partial_rotary_factor"
                                                                              and value == 1.0):
            raise _unsupported(where, f"{field}.{key}", value, "this RoPE parameter")
    return params.get("rope_theta"), factor


def _rope(data: dict[str, Any], where: str, model_type: str) -> dict[str, float]:
    """Global and local RoPE bases and the global linear factor, from transformers 5's ``rope_parameters`` (Gemma 3:
    one block per layer type) or the older ``rope_theta``, ``rope_local_base_freq`` and ``rope_scaling``."""
    params = data.get("rope_parameters")
    per_type = isinstance(params, dict) and set(params) <= set(LAYER_TYPES) and params
    global_theta, factor = _rope_block(params.get("full_attention") if per_type else params, "rope_parameters", where)
    local_theta, local_factor = _rope_block(params.get("sliding_attention") if per_type else None,
                                            "rope_parameters.sliding_attention", where)
    scaled_theta, scaled_factor = _rope_block(data.get("rope_scaling"), "rope_scaling", where)
    if model_type == "gemma2" and (factor, scaled_factor) != (1.0, 1.0):
        raise _unsupported(where, "rope_scaling", data.get("rope_scaling") or params, "RoPE scaling in Gemma 2")
    if local_factor != 1.0:
        raise _unsupported(where, "rope_parameters.sliding_attention", params["sliding_attention"],
                           "RoPE scaling of the sliding layers")
    if factor != 1.0 and scaled_factor != 1.0 and factor != scaled_factor:
        raise ConfigError(f"{where}: RoPE's linear factor is given twice with different values ({factor}, "
                          f"{scaled_factor}). Fix: keep one")
    top = data.get("rope_theta")
    thetas = [t for t in (global_theta, scaled_theta, top) if t is not None]
    if len(set(thetas)) > 1:
        raise ConfigError(f"{where}: RoPE's base is given more than once with different values {thetas}. Fix: keep one")
    default_global = 1_000_000.0 if model_type == "gemma3_text" else 10000.0
    local = data.get("rope_local_base_freq")
    if local is not None and local_theta is not None and local != local_theta:
        raise ConfigError(f"{where}: the local RoPE base is given twice ({local}, {local_theta}). Fix: keep one")
    global_value = float(thetas[0]) if thetas else default_global
    local_value = local_theta if local_theta is not None else local
    return {"rope_theta": global_value,
            "rope_local_theta": float(local_value if local_value is not None else
                                      (10000.0 if model_type == "gemma3_text" else global_value)),
            "rope_linear_factor": float(factor if factor != 1.0 else scaled_factor)}


def _sliding(data: dict[str, Any], where: str, model_type: str, n_layers: int) -> tuple[int | None, tuple[int, ...]]:
    """The window and its layers: those ``layer_types`` marks, else every layer but each ``sliding_window_pattern``-th."""
    window = sliding_window(data, where, ConfigError)
    layers = layer_types_slide(data, where, n_layers, ConfigError)
    if layers is None:
        pattern = data.get("sliding_window_pattern", data.get("_sliding_window_pattern", _DEFAULT_PATTERN[model_type]))
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern <= 0:
            raise ConfigError(f"{where}: field 'sliding_window_pattern' is {json.dumps(pattern)}; use a positive integer")
        layers = tuple(i for i in range(n_layers) if (i + 1) % pattern)
    return (window, layers) if window is not None else (None, ())


def _map_hf(data: dict[str, Any], where: str) -> dict[str, Any]:
    model_type = data.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"{where}: model_type is {model_type!r}; Orion's Gemma family reads "
                          f"{', '.join(map(repr, MODEL_TYPES))}")
    arch = data.get("architectures")
    if arch is not None and arch != [MODEL_TYPES[model_type]]:
        raise ConfigError(f"{where}: field 'architectures' is {json.dumps(arch)}; Orion runs "
                          f"{MODEL_TYPES[model_type]} only (a causal LM with an LM head)")
    values: dict[str, Any] = {"model_type": model_type}
    for ours, key in _REQUIRED.items():
        if key not in data:
            raise ConfigError(f"{where}: missing key {key!r} (GemmaConfig.{ours})")
        values[ours] = data[key]
    kv = data.get("num_key_value_heads")
    values["n_kv_heads"] = values["n_heads"] if kv is None else kv
    values["head_dim"] = data.get("head_dim", 256)
    values["rms_norm_eps"] = data.get("rms_norm_eps", 1e-6)
    values["tie_embeddings"] = bool(data.get("tie_word_embeddings", True))
    values["query_pre_attn_scalar"] = data.get("query_pre_attn_scalar", 256)
    values.update(_rope(data, where, model_type))
    values["sliding_window"], values["sliding_layers"] = _sliding(data, where, model_type, values["n_layers"])
    for key in ("hidden_activation", "hidden_act"):
        act = data.get(key)
        if act is not None and act not in ACTIVATIONS:
            raise _unsupported(where, key, act, "an MLP activation other than gelu_pytorch_tanh")
    defaults = {"gemma2": (50.0, 30.0), "gemma3_text": (None, None)}[model_type]
    values["attn_softcap"] = data.get("attn_logit_softcapping", defaults[0])
    values["final_softcap"] = data.get("final_logit_softcapping", defaults[1])
    values["qk_norm"] = model_type == "gemma3_text"
    for key, what in (("attention_bias", "projection biases"),
                      ("use_bidirectional_attention", "bidirectional attention (an encoder)")):
        if data.get(key):
            raise _unsupported(where, key, data[key], what)
    if data.get("quantization_config") is not None:
        raise _unsupported(where, "quantization_config", data["quantization_config"],
                           "a quantized checkpoint (load the unquantized one)")
    values["bos_token_id"] = data.get("bos_token_id")
    eos = data.get("eos_token_id")
    values["eos_token_ids"] = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    note_unread_fields(data, where, DISPLAY_NAMES[model_type], MODEL_FIELDS[model_type])
    return values
