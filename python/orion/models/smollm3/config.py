"""A SmolLM3 ``config.json`` as a :class:`~orion.models.llama.config.LlamaConfig`: the fields transformers'
``SmolLM3ForCausalLM`` reads besides the Llama family's shared ones, each implemented or refused by name."""

from __future__ import annotations

import json
from typing import Any

from orion.models.llama.config import (
    ConfigError,
    HfValues,
    LlamaConfig,
    Variant,
    check_writable,
    layer_types_slide,
    read_sliding_window,
    refuse_true,
    register_variant,
    unsupported,
)


def rope_flags(data: dict[str, Any], where: str, n_layers: int) -> list[int]:
    """transformers' ``no_rope_layers``: 1 for a layer that rotates, 0 for one that does not; when absent, every
    ``no_rope_layer_interval``-th layer (default 4) does not."""
    flags = data.get("no_rope_layers")
    if flags is None:
        interval = data.get("no_rope_layer_interval", 4)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0:
            raise ConfigError(f"{where}: field 'no_rope_layer_interval' is {json.dumps(interval)}; it must be a "
                              "positive integer")
        return [int((i + 1) % interval != 0) for i in range(n_layers)]
    if not isinstance(flags, list) or len(flags) != n_layers or any(f not in (0, 1) or isinstance(f, float)
                                                                    for f in flags):
        raise unsupported(where, "no_rope_layers", flags, f"anything but {n_layers} entries of 0 or 1")
    return [int(f) for f in flags]


def _read(data: dict[str, Any], where: str, values: HfValues) -> None:
    refuse_true(data, where, {"attention_bias": "SmolLM3 with projection biases",
                              "mlp_bias": "SmolLM3 with projection biases"})
    n = values["n_layers"]
    values["no_rope_layers"] = tuple(i for i, rotates in enumerate(rope_flags(data, where, n)) if not rotates)
    named = layer_types_slide(data, where, n)  # transformers: the layers without RoPE slide, when enabled
    slides = values["no_rope_layers"] if named is None else named
    read_sliding_window(data, where, values, slides if data.get("use_sliding_window", False) else ())


def _write(config: LlamaConfig) -> dict[str, Any]:
    check_writable(config, "smollm3", no_rope=True)
    if config.sliding_window is not None and config.sliding_layers != config.no_rope_layers:
        raise ConfigError("LlamaConfig.to_hf_json: SmolLM3 slides the window in its layers without RoPE only; "
                          f"sliding_layers is {config.sliding_layers}, no_rope_layers {config.no_rope_layers}")
    return {"attention_bias": False, "mlp_bias": False, "use_sliding_window": config.sliding_window is not None,
            "sliding_window": config.sliding_window, "no_rope_layers": [int(config.uses_rope(i)) for i in range(config.n_layers)]}


VARIANT = Variant("SmolLM3ForCausalLM", "SmolLM3",
                  frozenset({"attention_bias", "mlp_bias", "no_rope_layers", "no_rope_layer_interval",
                             "use_sliding_window", "sliding_window", "layer_types"}),
                  _read, _write, default_theta=2_000_000.0, tied_by_default=True)  # SmolLM3Config's defaults
MODEL_TYPE = "smollm3"
register_variant(MODEL_TYPE, VARIANT)
