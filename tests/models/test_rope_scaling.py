"""RoPE's frequencies as transformers computes them (``orion.models.llama.rope``): for the published configs of
Llama 3.2 (llama3), Qwen3 (with and without the YaRN its card recommends), SmolLM3, Phi-3.5 (longrope) and
Phi-4-mini (longrope on 3/4 of each head), and for linear, dynamic and YaRN variants, Orion's inverse
frequencies equal transformers' rotary embedding's within 1e-6 relative, its attention factor within 1e-9, and
its cos/sin tables (the attention factor in them, unrotated channels 1 and 0) transformers' cos/sin within
1e-4 + 1.2e-7 x the pass length (transformers forms the angles in float32) for passes of several lengths (for longrope, up to and past the original context).

Dynamic NTK changes transformers' base only for a pass longer than ``max_position_embeddings``: within it,
which Orion's context never exceeds, the frequencies are the default ones (checked), and a position past it is
an error in Orion.
"""

from __future__ import annotations

import copy
import importlib

import numpy as np
import pytest

from orion.models.llama.config import ConfigError, LlamaConfig
from orion.models.llama.graphs import rope_row, rope_tables
from orion.models.llama.rope import frequencies
from support import families, references

torch, transformers = references.require("torch", "transformers")

_ROTARY = {"llama": "Llama", "qwen3": "Qwen3", "smollm3": "SmolLM3", "phi3": "Phi3"}


def _yarn(**extra):
    return {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6, **extra}


CASES = {
    "llama-3.2-1b": families.PUBLISHED["llama-3.2-1b"],
    "qwen3-0.6b": families.PUBLISHED["qwen3-0.6b"],
    "qwen3-0.6b-yarn": families.PUBLISHED["qwen3-0.6b"] | {"rope_scaling": _yarn(), "rope_theta": ...},
    "qwen3-yarn-mscale": families.PUBLISHED["qwen3-0.6b"] | {"rope_scaling": _yarn(mscale=0.707, mscale_all_dim=1.0),
                                                             "rope_theta": ...},
    "qwen3-yarn-untruncated": families.PUBLISHED["qwen3-0.6b"] | {
        "rope_scaling": _yarn(truncate=False, beta_fast=16, beta_slow=2, attention_factor=1.2), "rope_theta": ...},
    "qwen3-yarn-no-factor": families.PUBLISHED["qwen3-0.6b"] | {
        "rope_scaling": _yarn(factor=None) | {"original_max_position_embeddings": 8192}, "rope_theta": ...},
    "smollm3-3b": families.PUBLISHED["smollm3-3b"],
    "phi-3.5-mini": families.PUBLISHED["phi-3.5-mini"],
    "phi-4-mini": families.PUBLISHED["phi-4-mini"],
    "llama-linear": families.PUBLISHED["llama-3.2-1b"] | {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    "llama-dynamic": families.PUBLISHED["llama-3.2-1b"] | {"rope_scaling": {"type": "dynamic", "factor": 2.0},
                                                           "max_position_embeddings": 2048},
}


def _config(data):
    return {k: v for k, v in copy.deepcopy(data).items() if v is not ...}


def _rotary(data):
    config = transformers.AutoConfig.for_model(**_config(data))
    module = importlib.import_module(f"transformers.models.{config.model_type}.modeling_{config.model_type}")
    return getattr(module, f"{_ROTARY[config.model_type]}RotaryEmbedding")(config).eval()


def _hf_tables(rotary, length: int) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), torch.arange(length)[None])
    return cos[0].numpy().T, sin[0].numpy().T  # [rotated channels, length]


@pytest.mark.parametrize("case", list(CASES))
def test_frequencies_and_tables_are_transformers(case: str) -> None:
    data = _config(CASES[case])
    config = LlamaConfig.from_hf_json(data)
    rotary = _rotary(data)
    r = config.rotary_dim
    scaling = config.rope_scaling
    lengths = {1, 37, 300}
    if scaling is not None and scaling.rope_type == "longrope":  # the factors change past the original context
        lengths |= {scaling.original_max_position_embeddings, scaling.original_max_position_embeddings + 1}
    for length in sorted(lengths):
        want_cos, want_sin = _hf_tables(rotary, length)  # transformers picks longrope's factors by this length
        inv_freq, attention = frequencies(scaling, config.rope_theta, r, config.max_position_embeddings, length)
        np.testing.assert_allclose(inv_freq, rotary.inv_freq.double().numpy(), rtol=1e-6, err_msg=f"{length}")
        assert attention == pytest.approx(rotary.attention_scaling, rel=1e-9)
        cos, sin = rope_tables(config, np.arange(length))
        atol = 1e-4 + 1.2e-7 * length  # transformers' float32 angles drift with the position
        np.testing.assert_allclose(cos[:r], want_cos, rtol=0, atol=atol, err_msg=f"cos, length {length}")
        np.testing.assert_allclose(sin[:r], want_sin, rtol=0, atol=atol, err_msg=f"sin, length {length}")
        assert (cos[r:] == 1).all() and (sin[r:] == 0).all()  # Phi-4-mini's unrotated quarter
    if scaling is not None and scaling.rope_type != "dynamic":  # the scaling matters: default RoPE differs
        base = frequencies(None, config.rope_theta, r, 0, 1)[0]
        assert (np.abs(base - inv_freq) / base).max() > 0.1 or attention != 1.0


def test_longrope_decode_rows_follow_the_pass_length() -> None:
    """A decode step at position p is a pass ending at p + 1: short factors up to the original context, long past it."""
    data = _config(CASES["phi-3.5-mini"])
    config = LlamaConfig.from_hf_json(data)
    rotary = _rotary(data)
    for position in (4094, 4095, 4096, 4200):
        with torch.no_grad():
            cos, sin = rotary(torch.zeros(1), torch.tensor([[position]]))
        row = rope_row(config, position)[0, :, 0, 0]
        np.testing.assert_allclose(row[:config.head_dim], cos[0, 0].numpy(), atol=5e-4, err_msg=str(position))
        np.testing.assert_allclose(row[config.head_dim:], sin[0, 0].numpy(), atol=5e-4, err_msg=str(position))


def test_dynamic_ntk_is_the_default_within_the_context_and_positions_past_it_are_refused() -> None:
    data = _config(CASES["llama-dynamic"])
    config = LlamaConfig.from_hf_json(data)
    rotary = _rotary(data)
    cos, _ = _hf_tables(rotary, 2048)
    np.testing.assert_allclose(rope_tables(config, np.arange(2048))[0], cos, atol=2e-4)
    past, _ = _hf_tables(_rotary(data), 2100)  # transformers rescales the base for a longer pass
    assert np.abs(past[:, :2048] - cos).max() > 1e-2
    with pytest.raises(ConfigError, match="outside the context length"):
        rope_row(config, 2048)
