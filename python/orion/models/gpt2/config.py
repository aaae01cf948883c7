"""GPT-2's hyperparameters, validated, and their Hugging Face ``config.json`` form.

The fields that change a GPT-2 (:data:`MODEL_FIELDS`) are each read: the shape and the settings Orion
implements (``activation_function``, ``n_inner``, ``scale_attn_weights``,
``scale_attn_by_inverse_layer_idx``), or refused unless they hold the value that changes nothing.
Every other field cannot change the model and is accepted (:mod:`orion.models.config_fields`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orion.errors import OrionError
from orion.generation.hf_files import ModelFileError, read_json_object
from orion.models.config_fields import COMMON_MODEL_FIELDS, note_unread_fields


class ConfigError(OrionError, ValueError):
    """A GPT-2 configuration is invalid or a ``config.json`` cannot be read."""


# Our field -> the Hugging Face config.json keys that may hold it, preferred first.
_HF_KEYS: dict[str, tuple[str, ...]] = {
    "n_layer": ("n_layer",),
    "n_head": ("n_head",),
    "n_embd": ("n_embd",),
    "vocab_size": ("vocab_size",),
    "n_positions": ("n_positions", "n_ctx"),
    "layer_norm_epsilon": ("layer_norm_epsilon",),
}
# Optional settings Orion implements: our field -> config.json key (absent: transformers' default).
_HF_OPTIONAL: dict[str, str] = {
    "activation_function": "activation_function",
    "n_inner": "n_inner",
    "scale_attn_weights": "scale_attn_weights",
    "scale_attn_by_inverse_layer_idx": "scale_attn_by_inverse_layer_idx",
}
# transformers' names for the activations Orion's graphs compute. "gelu" (erf) runs as the tanh
# approximation, which differs from it by under 5e-4, below fp16's resolution at 1.
ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu", "quick_gelu", "relu", "silu", "swish",
               "tanh", "sigmoid", "linear")
# Keys Orion does not implement, with the value at which they change nothing.
_NOT_IMPLEMENTED = {"add_cross_attention": False, "tie_word_embeddings": True, "pruned_heads": {},
                    "cross_attention_hidden_size": None, "quantization_config": None}
# The fields that change a GPT-2 (orion.models.config_fields); reorder_and_upcast_attn only computes
# attention in fp32, as Orion's does.
MODEL_FIELDS = frozenset(COMMON_MODEL_FIELDS | set(_NOT_IMPLEMENTED) | set(_HF_OPTIONAL)
                         | {k for keys in _HF_KEYS.values() for k in keys} | {"reorder_and_upcast_attn"})


@dataclass(frozen=True)
class GPT2Config:
    """GPT-2 shape: the defaults are GPT-2 small (124M)."""

    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50257
    n_positions: int = 1024
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    n_inner: int | None = None  # the MLP's width; None: 4 * n_embd
    scale_attn_weights: bool = True  # scores / sqrt(head_dim)
    scale_attn_by_inverse_layer_idx: bool = False  # scores / (layer index + 1) as well

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"GPT2Config.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ConfigError(
                f"GPT2Config: n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}); "
                f"choose n_embd as a multiple of n_head"
            )
        eps = self.layer_norm_epsilon
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ConfigError(f"GPT2Config.layer_norm_epsilon must be a positive number, got {eps!r}")
        if self.activation_function not in ACTIVATIONS:
            raise ConfigError(f"GPT2Config.activation_function {self.activation_function!r} is not implemented; "
                              f"Orion runs {', '.join(ACTIVATIONS)}")
        inner = self.n_inner
        if inner is not None and (isinstance(inner, bool) or not isinstance(inner, int) or inner <= 0):
            raise ConfigError(f"GPT2Config.n_inner must be a positive integer or None (4 * n_embd), got {inner!r}")
        for name in ("scale_attn_weights", "scale_attn_by_inverse_layer_idx"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"GPT2Config.{name} must be true or false, got {getattr(self, name)!r}")

    @property
    def inner(self) -> int:
        """The MLP's hidden width."""
        return self.n_inner or 4 * self.n_embd

    def attention_scale(self, layer: int) -> float:
        """The factor on layer ``layer``'s attention scores, as transformers' GPT-2 applies it."""
        scale = 1.0 / self.head_dim**0.5 if self.scale_attn_weights else 1.0
        return scale / (layer + 1) if self.scale_attn_by_inverse_layer_idx else scale

    @property
    def head_dim(self) -> int:
        """Channels per attention head."""
        return self.n_embd // self.n_head

    def param_count(self) -> int:
        """Number of parameters, counting the tied LM head once (124,439,808 for GPT-2 small)."""
        c, f = self.n_embd, self.inner
        per_block = (
            2 * c                      # ln_1
            + 3 * c * c + 3 * c        # attn.c_attn
            + c * c + c                # attn.c_proj
            + 2 * c                    # ln_2
            + f * c + f                # mlp.c_fc
            + f * c + c                # mlp.c_proj
        )
        return (self.vocab_size + self.n_positions) * c + self.n_layer * per_block + 2 * c

    @classmethod
    def from_hf_json(cls, source: dict[str, Any] | str | os.PathLike[str]) -> GPT2Config:
        """Read a Hugging Face GPT-2 ``config.json`` (a dict, the file, or the directory holding it)."""
        if isinstance(source, dict):
            data, where = source, "config dict"
        else:
            path = Path(source)
            if path.is_dir():
                path = path / "config.json"
            if not path.is_file():
                raise ConfigError(f"{path}: no such file; a GPT-2 directory needs a Hugging Face config.json")
            try:
                data = read_json_object(path)
            except ModelFileError as exc:
                raise ConfigError(str(exc)) from None
            where = str(path)
        model_type = data.get("model_type", "gpt2")
        if model_type != "gpt2":
            raise ConfigError(f"{where}: model_type is {model_type!r}, expected 'gpt2'")
        values: dict[str, Any] = {}
        for name, keys in _HF_KEYS.items():
            found = [k for k in keys if k in data]
            if not found:
                raise ConfigError(f"{where}: missing key {' or '.join(repr(k) for k in keys)} (GPT2Config.{name})")
            values[name] = data[found[0]]
        for name, key in _HF_OPTIONAL.items():
            if key in data:
                values[name] = data[key]
        for key, neutral in _NOT_IMPLEMENTED.items():
            if data.get(key, neutral) not in (neutral, None):
                raise ConfigError(f"{where}: {key}={data[key]!r} is not implemented by Orion's GPT-2 (it runs "
                                  f"{key}={neutral!r}); the model would compute something else, so it is refused")
        if "n_ctx" in data and "n_positions" in data and data["n_ctx"] != data["n_positions"]:
            raise ConfigError(f"{where}: n_ctx={data['n_ctx']} differs from n_positions={data['n_positions']}; "
                              f"Orion's GPT-2 needs them equal (the context length)")
        note_unread_fields(data, where, "GPT-2", MODEL_FIELDS)
        try:
            return cls(**values)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def to_hf_json(self) -> dict[str, Any]:
        """The Hugging Face ``config.json`` contents for this shape (GPT-2's standard settings)."""
        fields = asdict(self)
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            **fields,
            "n_ctx": self.n_positions,
            "resid_pdrop": 0.1,
            "embd_pdrop": 0.1,
            "attn_pdrop": 0.1,
            "initializer_range": 0.02,
            "tie_word_embeddings": True,
            "bos_token_id": self.vocab_size - 1,  # <|endoftext|> is GPT-2's last token
            "eos_token_id": self.vocab_size - 1,
        }
