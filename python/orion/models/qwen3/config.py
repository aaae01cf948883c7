"""A Qwen3 ``config.json`` as a :class:`~orion.models.llama.config.LlamaConfig`: the fields transformers'
``Qwen3ForCausalLM`` reads besides the Llama family's shared ones, each implemented or refused by name."""

from __future__ import annotations

from typing import Any

from orion.models.llama.config import (
    HfValues,
    LlamaConfig,
    Variant,
    check_writable,
    qwen_sliding_layers,
    read_sliding_window,
    refuse_true,
    register_variant,
    window_fields,
)


def _read(data: dict[str, Any], where: str, values: HfValues) -> None:
    refuse_true(data, where, {"attention_bias": "Qwen3 with projection biases"})
    values["qk_norm"] = True
    read_sliding_window(data, where, values, qwen_sliding_layers(data, where, values["n_layers"]))


def _write(config: LlamaConfig) -> dict[str, Any]:
    check_writable(config, "qwen3", qk_norm=True)
    return {"attention_bias": False, **window_fields(config)}


VARIANT = Variant("Qwen3ForCausalLM", "Qwen3",
                  frozenset({"attention_bias", "use_sliding_window", "sliding_window", "max_window_layers",
                             "layer_types"}),
                  _read, _write, default_head_dim=128)  # Qwen3Config's head_dim default
MODEL_TYPE = "qwen3"
register_variant(MODEL_TYPE, VARIANT)
