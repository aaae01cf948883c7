"""GPT-2's hyperparameters, validated, and their Hugging Face ``config.json`` form."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orion.errors import OrionError
from orion.generation.hf_files import ModelFileError, read_json_object


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


@dataclass(frozen=True)
class GPT2Config:
    """GPT-2 shape: the defaults are GPT-2 small (124M)."""

    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50257
    n_positions: int = 1024
    layer_norm_epsilon: float = 1e-5

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

    @property
    def head_dim(self) -> int:
        """Channels per attention head."""
        return self.n_embd // self.n_head

    def param_count(self) -> int:
        """Number of parameters, counting the tied LM head once (124,439,808 for GPT-2 small)."""
        c = self.n_embd
        per_block = (
            2 * c                      # ln_1
            + 3 * c * c + 3 * c        # attn.c_attn
            + c * c + c                # attn.c_proj
            + 2 * c                    # ln_2
            + 4 * c * c + 4 * c        # mlp.c_fc
            + 4 * c * c + c            # mlp.c_proj
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
            "activation_function": "gelu_new",
            "n_inner": None,
            "resid_pdrop": 0.1,
            "embd_pdrop": 0.1,
            "attn_pdrop": 0.1,
            "initializer_range": 0.02,
            "scale_attn_weights": True,
            "tie_word_embeddings": True,
            "bos_token_id": self.vocab_size - 1,  # <|endoftext|> is GPT-2's last token
            "eos_token_id": self.vocab_size - 1,
        }
