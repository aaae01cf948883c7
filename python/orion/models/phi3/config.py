"""A Phi-3 ``config.json`` as a :class:`~orion.models.llama.config.LlamaConfig`: the fields transformers'
``Phi3ForCausalLM`` reads besides the Llama family's shared ones, each implemented or refused by name."""

from __future__ import annotations

from typing import Any

from orion.models.llama.config import (
    HfValues,
    LlamaConfig,
    Variant,
    check_writable,
    every_layer_window,
    read_sliding_window,
    register_variant,
)


def _read(data: dict[str, Any], where: str, values: HfValues) -> None:
    read_sliding_window(data, where, values, None)  # every layer, when set (Phi-3-mini-4k: 2047 of 4096)


def _write(config: LlamaConfig) -> dict[str, Any]:
    check_writable(config, "phi3")
    scaling = config.rope_scaling
    return {**every_layer_window(config, "Phi-3"), **({"original_max_position_embeddings": scaling.original_max_position_embeddings}
                                       if scaling is not None else {})}


VARIANT = Variant("Phi3ForCausalLM", "Phi-3", frozenset({"sliding_window"}), _read, _write,
                  rope_types=("default", "longrope"), rope_aliases={"su": "longrope", "yarn": "longrope"},
                  fused_checkpoint=True, original_context=4096)  # Phi3Config: older names, its own default
MODEL_TYPE = "phi3"
register_variant(MODEL_TYPE, VARIANT)
