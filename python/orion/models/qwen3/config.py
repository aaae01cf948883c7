"""A Qwen3 ``config.json`` as a :class:`~orion.models.llama.config.LlamaConfig`: the fields transformers'
``Qwen3ForCausalLM`` reads besides the Llama family's shared ones, each implemented or refused by name."""

from __future__ import annotations

from typing import Any

from orion.models.llama.config import (
    HfValues,
    LlamaConfig,
    Variant,
    check_sliding_window,
    check_writable,
    qwen_sliding_layers,
    refuse_true,
    register_variant,
)


def _read(data: dict[str, Any], where: str, values: HfValues) -> None:
    refuse_true(data, where, {"attention_bias": "Qwen3 with projection biases"})
    values["qk_norm"] = True
    check_sliding_window(data, where, qwen_sliding_layers(data, where, values["n_layers"]),
                         values["max_position_embeddings"])


def _write(config: LlamaConfig) -> dict[str, Any]:
    check_writable(config, "qwen3", qk_norm=True)
    return {"attention_bias": False, "use_sliding_window": False, "sliding_window": None,
            "max_window_layers": config.n_layers}


VARIANT = Variant("Qwen3ForCausalLM", "Qwen3",
                  frozenset({"attention_bias", "use_sliding_window", "sliding_window", "max_window_layers",
                             "layer_types"}),
                  _read, _write, default_head_dim=128)  # Qwen3Config's head_dim default
MODEL_TYPE = "qwen3"
register_variant(MODEL_TYPE, VARIANT)
