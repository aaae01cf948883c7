"""Llama-family hyperparameters (Llama, Qwen2, Mistral, llama2.c, and the families that reuse the Llama
layer: Qwen3, SmolLM3, Phi-3), validated, and their Hugging Face ``config.json`` form.

Each ``model_type`` is a :class:`Variant` (:data:`VARIANTS`; a family in its own folder adds one with
:func:`register_variant`): its architecture name, the fields that change its model (:data:`MODEL_FIELDS`)
and its reader of the family's own fields. Each field is mapped to a :class:`LlamaConfig` field or checked
to hold a value Orion implements (else a :class:`ConfigError` naming the field). Every other field cannot
change the model and is accepted (:mod:`orion.models.config_fields`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orion.errors import OrionError
from orion.generation.hf_files import ModelFileError, read_json_object
from orion.models.config_fields import COMMON_MODEL_FIELDS, note_unread_fields
from orion.models.llama.rope import REQUIRED_KEYS, ROPE_KEYS, ROPE_TYPES, RopeScaling

ROPE_CONVENTIONS = ("interleaved", "half")  # llama2.c/Meta pairs (2i, 2i+1); Hugging Face rotate-half


class ConfigError(OrionError, ValueError):
    """A Llama configuration is invalid, or a ``config.json`` holds something Orion does not implement."""


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-family shape. ``head_dim`` may differ from ``dim // n_heads``; ``n_kv_heads < n_heads`` is
    grouped-query attention. ``rope_convention`` says how the q/k weights pair rotated channels;
    ``rope_scaling`` rescales RoPE's frequencies (:mod:`orion.models.llama.rope`), which rotate the first
    ``partial_rotary_factor`` of each head's channels, in every layer but ``no_rope_layers``. ``qk_norm``:
    RMSNorm of each query and key head before RoPE (Qwen3)."""

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
    rope_scaling: RopeScaling | None = None
    partial_rotary_factor: float = 1.0
    no_rope_layers: tuple[int, ...] = ()
    qk_norm: bool = False
    sliding_window: int | None = None  # sliding-window attention (orion.models.blocks)
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
        if self.model_type not in VARIANTS:
            raise ConfigError(f"LlamaConfig.model_type is {self.model_type!r}; use one of {sorted(VARIANTS)}")
        factor = self.partial_rotary_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1 or \
                self.rotary_dim < 2 or self.rotary_dim % 2:
            raise ConfigError(f"LlamaConfig.partial_rotary_factor is {factor!r}: RoPE must rotate an even number of "
                              f"channels of each head (int(head_dim * factor), head_dim {self.head_dim}), at least 2")
        if self.rope_scaling is not None and self.rope_scaling.rope_type not in ROPE_TYPES:
            raise ConfigError(f"LlamaConfig.rope_scaling.rope_type is {self.rope_scaling.rope_type!r}; use one of "
                              f"{ROPE_TYPES}")
        if any(not 0 <= i < self.n_layers for i in self.no_rope_layers):
            raise ConfigError(f"LlamaConfig.no_rope_layers {self.no_rope_layers} names layers outside 0..{self.n_layers - 1}")
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

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    @property
    def rotary_dim(self) -> int:
        """Channels of each head that RoPE rotates (the first ones; transformers' ``int(head_dim * factor)``)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def window(self, layer: int) -> int | None:
        """The sliding window of layer ``layer`` (None: it attends to every earlier position, as it does when
        the window holds the whole context)."""
        if self.sliding_window is None or self.sliding_window >= self.max_position_embeddings or \
                (self.sliding_layers is not None and layer not in self.sliding_layers):
            return None
        return self.sliding_window

    def uses_rope(self, layer: int) -> bool:
        """Whether layer ``layer`` rotates its queries and keys (SmolLM3 skips every fourth)."""
        return layer not in self.no_rope_layers

    @property
    def fused_checkpoint(self) -> bool:
        """Whether the checkpoint stores q/k/v and gate/up as one module each (Phi-3): the Llama layer's LoRA sites
        and placements (also Gemma's, whose config says False) follow it."""
        return self.variant.fused_checkpoint

    @property
    def variant(self) -> Variant:
        """The :class:`Variant` of this config's ``model_type``."""
        return VARIANTS[self.model_type]

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
        return per_layer + (q + 2 * kv if self.qkv_bias else 0) + (2 * self.head_dim if self.qk_norm else 0)

    @classmethod
    def stories110m(cls) -> LlamaConfig:
        """llama2.c's Stories110M: dim 768, 12 layers, 12 heads (MHA), SwiGLU hidden 2048, vocab 32,000,
        context 1024, interleaved RoPE with theta 10000, tied embeddings, BOS 1 / EOS 2."""
        return cls(dim=768, n_layers=12, n_heads=12, n_kv_heads=12, head_dim=64, hidden_dim=2048,
                   vocab_size=32000, max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=10000.0,
                   rope_convention="interleaved", tie_embeddings=True, bos_token_id=1, eos_token_ids=(2,))

    @classmethod
    def from_hf_json(cls, source: dict[str, Any] | str | os.PathLike[str]) -> LlamaConfig:
        """Read the Hugging Face ``config.json`` of any :data:`VARIANTS` ``model_type`` (Llama, Qwen2, Mistral,
        Qwen3, SmolLM3, Phi-3; a dict, the file or its directory)."""
        data, where = read_json(source)
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
        eos: Any = list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else \
            (self.eos_token_ids[0] if self.eos_token_ids else None)
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            rope |= {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.rope_scaling).items()
                     if v is not None}
        if self.partial_rotary_factor != 1.0:
            rope["partial_rotary_factor"] = self.partial_rotary_factor
        out: dict[str, Any] = {
            "model_type": self.model_type, "architectures": [self.variant.architecture],
            "hidden_size": self.dim, "num_hidden_layers": self.n_layers, "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads, "head_dim": self.head_dim,
            "intermediate_size": self.hidden_dim, "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings, "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope, "hidden_act": "silu", "tie_word_embeddings": self.tie_embeddings,
            "bos_token_id": self.bos_token_id, "eos_token_id": eos,
            "pad_token_id": None,  # not the class default (Phi-3's 32000, SmolLM3's 128004 may be past the vocabulary)
        }
        return out | self.variant.write(self)


HfValues = dict[str, Any]  # LlamaConfig keyword arguments read from a config.json


@dataclass(frozen=True)
class Variant:
    """A ``model_type`` that the Llama layer runs: its transformers class, the ``config.json`` fields that change
    its model (besides the ones every variant reads, :data:`SHARED_FIELDS`), ``read(data, where, values)`` for
    those fields (sets or checks ``values``, refuses what Orion does not implement by name) and
    ``write(config)`` for :meth:`LlamaConfig.to_hf_json` (checks the config is one the family can hold)."""

    architecture: str
    display_name: str
    fields: frozenset[str]
    read: Callable[[dict[str, Any], str, HfValues], None]
    write: Callable[[LlamaConfig], dict[str, Any]]
    default_theta: float = 10000.0  # transformers' default_theta for the class
    default_head_dim: int | None = None  # head_dim when config.json has none (None: hidden_size / heads)
    tied_by_default: bool = False  # tie_word_embeddings when config.json has none
    rope_types: tuple[str, ...] = ROPE_TYPES  # what transformers' class accepts
    rope_aliases: dict[str, str] = field(default_factory=dict)  # older rope_type names the class renames
    fused_checkpoint: bool = False  # q/k/v and gate/up stored as one tensor each (qkv_proj, gate_up_proj)
    original_context: int | None = None  # the class's own original_max_position_embeddings (Phi-3: 4096)


VARIANTS: dict[str, Variant] = {}


def register_variant(model_type: str, variant: Variant) -> None:
    """Make ``model_type``'s ``config.json`` readable as a :class:`LlamaConfig` (a family folder's one line)."""
    VARIANTS[model_type] = variant


# Fields every variant reads (orion.models.config_fields): each is implemented below or refused by name.
SHARED_FIELDS = COMMON_MODEL_FIELDS | {
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "max_position_embeddings", "rms_norm_eps", "hidden_act", "rope_theta", "rope_parameters",
    "rope_scaling", "partial_rotary_factor", "original_max_position_embeddings"}
_REQUIRED = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
             "hidden_dim": "intermediate_size", "vocab_size": "vocab_size",
             "max_position_embeddings": "max_position_embeddings"}


def model_fields(model_type: str) -> frozenset[str]:
    """Every ``config.json`` field that changes a model of ``model_type`` (orion.models.config_fields)."""
    return frozenset(SHARED_FIELDS | VARIANTS[model_type].fields)


def display_name(model_type: str) -> str:
    """The family's name in messages ("Qwen3")."""
    return VARIANTS[model_type].display_name


def read_json(source: dict[str, Any] | str | os.PathLike[str], family: str = "a Llama-family",
              error: type[OrionError] = ConfigError) -> tuple[dict[str, Any], str]:
    """A ``config.json`` (or a directory holding one, or the dict itself) and where it came from, for messages;
    an unreadable file raises ``error`` saying that ``family`` directory needs one."""
    if isinstance(source, dict):
        return source, "config dict"
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        return read_json_object(path), str(path)
    except ModelFileError as err:
        raise error(f"{err}; {family} directory needs a Hugging Face config.json") from None


def unsupported(where: str, field: str, value: Any, what: str, error: type[OrionError] = ConfigError) -> OrionError:
    """The ``error`` for ``field`` holding ``value``, which asks for ``what`` (not implemented)."""
    return error(f"{where}: field {field!r} is {json.dumps(value)}: {what} is not implemented by Orion. "
                 "Fix: use a checkpoint without it (Orion never ignores a field that changes the model)")


def refuse_true(data: dict[str, Any], where: str, fields: dict[str, str]) -> None:
    """Refuse each of ``fields`` (name -> what it asks for) that ``data`` sets to a true value."""
    for key, what in fields.items():
        if data.get(key, False):
            raise unsupported(where, key, data[key], what)


def _number(where: str, key: str, value: Any, kind: type = float) -> Any:
    ok = isinstance(value, int) if kind is int else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not value > 0:
        raise ConfigError(f"{where}: field {key!r} is {json.dumps(value)}; it must be a positive "
                          f"{'integer' if kind is int else 'number'}")
    return value


def _rope(data: dict[str, Any], where: str, variant: Variant, values: HfValues) -> None:
    """RoPE's base, scaling and rotated fraction, as transformers' ``convert_rope_params_to_dict`` and
    ``standardize_rope_params`` read them: ``rope_scaling`` (older) or ``rope_parameters``, with the top-level
    ``rope_theta`` and ``partial_rotary_factor`` as defaults (values given twice must agree), and a top-level
    ``original_max_position_embeddings`` taking precedence for llama3/yarn/longrope (Phi-3's class always has
    one, 4096 by default). Keys a rope type does not read are refused by name."""
    params: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name in ("rope_parameters", "rope_scaling"):
        given = data.get(name)
        if given is None:
            continue
        if not isinstance(given, dict):
            raise ConfigError(f"{where}: field {name!r} must be an object, got {json.dumps(given)}")
        for key, value in given.items():
            key = "rope_type" if key == "type" else key
            if key in params and json.dumps(params[key]) != json.dumps(value):
                raise ConfigError(f"{where}: {sources[key]}.{key} is {json.dumps(params[key])} but {name}.{key} is "
                                  f"{json.dumps(value)}: RoPE's {key} is given twice with different values. Fix: keep one")
            params[key], sources[key] = value, name
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in data and data[key] is not None:
            if key in params and json.dumps(params[key]) != json.dumps(data[key]):
                raise ConfigError(f"{where}: RoPE's {key.replace('rope_theta', 'base')} is given twice with different "
                                  f"values ({key}={data[key]}, {sources[key]}.{key}={params[key]}). Fix: keep one")
            params.setdefault(key, data[key])
            sources.setdefault(key, "")
    kind = params.pop("rope_type", "default")
    kind = variant.rope_aliases.get(kind, kind)
    where_type = f"{sources.get('rope_type', 'rope_parameters')}.rope_type"
    if kind not in variant.rope_types:
        raise unsupported(where, where_type, kind, f"RoPE scaling {kind!r} in a {variant.display_name} model")
    values["rope_theta"] = _number(where, "rope_theta", params.pop("rope_theta", variant.default_theta))
    values["partial_rotary_factor"] = _number(where, "partial_rotary_factor", params.pop("partial_rotary_factor", 1.0))
    top = data.get("original_max_position_embeddings", variant.original_context)
    if kind in ("llama3", "yarn", "longrope") and top is not None:  # an attribute of the config: it wins
        params["original_max_position_embeddings"] = top
    for key in params:
        if key not in ROPE_KEYS[kind]:
            raise unsupported(where, f"{sources.get(key, 'rope_parameters')}.{key}", params[key],
                              f"RoPE parameter {key!r} with rope_type {kind!r}")
    if kind == "default":
        return
    if "truncate" in params and params["truncate"] is None:  # transformers: rope_parameters.get("truncate", True)
        params["truncate"] = False
    if kind in ("llama3", "yarn", "longrope"):
        params.setdefault("original_max_position_embeddings", values["max_position_embeddings"])
    for key in REQUIRED_KEYS[kind]:
        if params.get(key) is None:
            raise ConfigError(f"{where}: RoPE scaling {kind!r} needs {key!r} in rope_parameters")
    for key in ("factor", "low_freq_factor", "high_freq_factor", "attention_factor", "beta_fast", "beta_slow"):
        if params.get(key) is not None:
            _number(where, f"rope_parameters.{key}", params[key])
    if "original_max_position_embeddings" in params:
        _number(where, "original_max_position_embeddings", params["original_max_position_embeddings"], int)
    if kind == "llama3" and params["high_freq_factor"] <= params["low_freq_factor"]:
        raise ConfigError(f"{where}: llama3 RoPE needs high_freq_factor > low_freq_factor, got "
                          f"{params['high_freq_factor']} and {params['low_freq_factor']}")
    for key in ("short_factor", "long_factor"):
        if key in params:
            factors = params[key]
            pairs = int(values["head_dim"] * values["partial_rotary_factor"]) // 2
            if not isinstance(factors, list) or len(factors) != pairs or \
                    not all(isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in factors):
                raise ConfigError(f"{where}: rope_parameters.{key} must be {pairs} positive numbers (one per rotated "
                                  f"channel pair), got {json.dumps(factors)[:80]}")
            params[key] = tuple(float(f) for f in factors)
    values["rope_scaling"] = RopeScaling(rope_type=kind, **params)


def read_sliding_window(data: dict[str, Any], where: str, values: HfValues, layers: tuple[int, ...] | None) -> None:
    """``sliding_window`` on ``layers`` (None: every layer; empty: none) into ``values``, as transformers applies it."""
    window = sliding_window(data, where)
    if window is not None and layers != ():
        values["sliding_window"], values["sliding_layers"] = window, layers


def sliding_window(data: dict[str, Any], where: str, error: type[OrionError] = ConfigError) -> int | None:
    """The ``sliding_window`` field: a positive integer or None (else ``error``)."""
    window = data.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        raise error(f"{where}: field 'sliding_window' is {json.dumps(window)}; use a positive integer or null")
    return window


def layer_types_slide(data: dict[str, Any], where: str, n_layers: int,
                      error: type[OrionError] = ConfigError) -> tuple[int, ...] | None:
    """The layers ``layer_types`` marks ``sliding_attention`` (None: no ``layer_types``); malformed lists are
    refused (``error``)."""
    layer_types = data.get("layer_types")
    if layer_types is None:
        return None
    if not isinstance(layer_types, list) or len(layer_types) != n_layers or \
            not set(layer_types) <= {"full_attention", "sliding_attention"}:
        raise unsupported(where, "layer_types", layer_types,
                          f"anything but {n_layers} entries of 'full_attention' or 'sliding_attention'", error)
    return tuple(i for i, kind in enumerate(layer_types) if kind == "sliding_attention")


def qwen_sliding_layers(data: dict[str, Any], where: str, n_layers: int) -> tuple[int, ...]:
    """Qwen2/Qwen3: with ``use_sliding_window``, the layers ``layer_types`` marks, by default those from
    ``max_window_layers`` (28) on; none without it."""
    if not data.get("use_sliding_window", False):
        layer_types_slide(data, where, n_layers)  # still checked
        return ()
    named = layer_types_slide(data, where, n_layers)
    if named is not None:
        return named
    start = data.get("max_window_layers", 28)
    if isinstance(start, bool) or not isinstance(start, int):
        raise ConfigError(f"{where}: field 'max_window_layers' is {json.dumps(start)}; use an integer")
    return tuple(range(start, n_layers))


def window_fields(config: LlamaConfig) -> dict[str, Any]:
    """The ``config.json`` fields of a Qwen-style sliding window (``use_sliding_window`` and the layers in
    ``layer_types``)."""
    layers = range(config.n_layers) if config.sliding_layers is None else config.sliding_layers
    return {"use_sliding_window": config.sliding_window is not None, "sliding_window": config.sliding_window,
            "max_window_layers": config.n_layers,
            "layer_types": ["sliding_attention" if config.sliding_window and i in layers else "full_attention"
                            for i in range(config.n_layers)]}


def every_layer_window(config: LlamaConfig, display: str) -> dict[str, Any]:
    """``sliding_window`` of a family that slides it in every layer (Mistral, Phi-3)."""
    if config.sliding_layers is not None:
        raise ConfigError(f"LlamaConfig.to_hf_json: {display} slides the window in every layer; sliding_layers "
                          "must be None")
    return {"sliding_window": config.sliding_window}


# -- the variants of this folder ---------------------------------------------------------------------------

def _read_llama(data: dict[str, Any], where: str, values: HfValues) -> None:
    refuse_true(data, where, {"attention_bias": "Llama with projection biases",
                              "mlp_bias": "Llama with projection biases"})
    window = data.get("sliding_window")
    if window is not None:
        raise unsupported(where, "sliding_window", window, "sliding-window attention in a Llama config")
    layer_types_slide(data, where, values["n_layers"])


def _read_mistral(data: dict[str, Any], where: str, values: HfValues) -> None:
    read_sliding_window(data, where, values, layer_types_slide(data, where, values["n_layers"]))


def _read_qwen2(data: dict[str, Any], where: str, values: HfValues) -> None:
    values["qkv_bias"] = True
    refuse_true(data, where, {"use_mrope": "multimodal RoPE"})
    read_sliding_window(data, where, values, qwen_sliding_layers(data, where, values["n_layers"]))


def _write_plain(model_type: str, extra: dict[str, Any]) -> Callable[[LlamaConfig], dict[str, Any]]:
    """``write`` for a variant without q/k/v biases, q/k norms or layers without RoPE."""
    def write(config: LlamaConfig) -> dict[str, Any]:
        check_writable(config, model_type)
        return dict(extra)
    return write


def check_writable(config: LlamaConfig, model_type: str, qkv_bias: bool = False, qk_norm: bool = False,
                   no_rope: bool = False) -> None:
    """Refuse :meth:`LlamaConfig.to_hf_json` for a config whose features ``model_type``'s checkpoints cannot
    hold (each flag: the feature the family has)."""
    display = display_name(model_type)
    for name, has, value in (("qkv_bias", qkv_bias, config.qkv_bias), ("qk_norm", qk_norm, config.qk_norm),
                             ("no_rope_layers", no_rope, bool(config.no_rope_layers))):
        if value and not has:
            raise ConfigError(f"LlamaConfig.to_hf_json: {display} checkpoints have no {name}, this config has "
                              f"{getattr(config, name)!r}. Fix: use the model_type of a family that has it")
        if has and name != "no_rope_layers" and not value:
            raise ConfigError(f"LlamaConfig.to_hf_json: {display} checkpoints always have {name}, it is off. "
                              f"Fix: set {name}=True")


def _write_mistral(config: LlamaConfig) -> dict[str, Any]:
    check_writable(config, "mistral")
    return every_layer_window(config, "Mistral")


def _write_qwen2(config: LlamaConfig) -> dict[str, Any]:
    check_writable(config, "qwen2", qkv_bias=True)
    return window_fields(config)


register_variant("llama", Variant("LlamaForCausalLM", "Llama", frozenset({"attention_bias", "mlp_bias",
                                                                          "sliding_window", "layer_types"}),
                                  _read_llama, _write_plain("llama", {"attention_bias": False, "mlp_bias": False})))
register_variant("mistral", Variant("MistralForCausalLM", "Mistral", frozenset({"sliding_window", "layer_types"}),
                                    _read_mistral, _write_mistral))
register_variant("qwen2", Variant("Qwen2ForCausalLM", "Qwen2", frozenset({"use_sliding_window", "sliding_window",
                                                                          "max_window_layers", "layer_types",
                                                                          "use_mrope"}),
                                  _read_qwen2, _write_qwen2))

# Fields that change the model, implemented only at the value that changes nothing.
_NEUTRAL_VALUES: dict[str, Any] = {"quantization_config": None}
_NEUTRAL_WHAT = {"quantization_config": "a quantized checkpoint (load the unquantized one, or a GGUF file)"}


def _map_hf(data: dict[str, Any], where: str) -> dict[str, Any]:
    model_type = data.get("model_type")
    if model_type not in VARIANTS:
        raise ConfigError(f"{where}: model_type is {model_type!r}; Orion's Llama family reads "
                          f"{', '.join(map(repr, VARIANTS))}")
    variant = VARIANTS[model_type]
    arch = data.get("architectures")
    if arch is not None and arch != [variant.architecture]:
        raise ConfigError(f"{where}: field 'architectures' is {json.dumps(arch)}; Orion runs "
                          f"{variant.architecture} only (a causal LM with an LM head)")
    values: dict[str, Any] = {"model_type": model_type, "rope_convention": "half"}
    for ours, key in _REQUIRED.items():
        if key not in data:
            raise ConfigError(f"{where}: missing key {key!r} (LlamaConfig.{ours})")
        values[ours] = data[key]
    kv = data.get("num_key_value_heads")
    values["n_kv_heads"] = values["n_heads"] if kv is None else kv
    head_dim = data.get("head_dim", variant.default_head_dim)
    if head_dim is None:
        if not isinstance(values["n_heads"], int) or not values["n_heads"] or values["dim"] % values["n_heads"]:
            raise ConfigError(f"{where}: no 'head_dim', and hidden_size {values['dim']} is not a multiple of "
                              f"num_attention_heads {values['n_heads']}. Fix: give head_dim")
        head_dim = values["dim"] // values["n_heads"]
    values["head_dim"] = head_dim
    values["rms_norm_eps"] = data.get("rms_norm_eps", 1e-6)
    values["tie_embeddings"] = bool(data.get("tie_word_embeddings", variant.tied_by_default))
    _rope(data, where, variant, values)

    act = data.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise unsupported(where, "hidden_act", act, "an MLP activation other than SiLU")
    variant.read(data, where, values)

    values["bos_token_id"] = data.get("bos_token_id")
    eos = data.get("eos_token_id")
    values["eos_token_ids"] = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))

    for key, neutral in _NEUTRAL_VALUES.items():
        if data.get(key, neutral) not in (neutral, None):
            raise unsupported(where, key, data[key], _NEUTRAL_WHAT[key])
    note_unread_fields(data, where, variant.display_name, model_fields(model_type))
    return values
