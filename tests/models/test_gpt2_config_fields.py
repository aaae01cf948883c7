"""GPT-2 config.json fields beyond the shape: the implemented ones match transformers, every other
non-default value is refused naming the field.

Reference: Hugging Face transformers' GPT2LMHeadModel in float32, loaded from the same directory;
tolerance 3% of the largest logit (fp16 numerics, as in test_gpt2_model.py)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import orion
from orion import models
from orion.models.config_fields import ConfigNote
from orion.models.gpt2.config import ConfigError, GPT2Config
from orion.models.gpt2.weights import save_hf
from support import references
from support.gpt2_fixtures import lively_weights

BASE = dict(n_layer=2, n_head=4, n_embd=64, vocab_size=256, n_positions=64)
IDS = [5, 17, 3, 99, 42, 7]


def hf_logits(directory, ids: list[int]) -> np.ndarray:
    torch, transformers = references.require("torch", "transformers")
    model = transformers.GPT2LMHeadModel.from_pretrained(directory, attn_implementation="eager").float().eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("fields", [
    {"activation_function": "relu"},
    {"activation_function": "silu"},
    {"activation_function": "gelu"},
    {"activation_function": "quick_gelu"},
    {"activation_function": "tanh"},
    {"n_inner": 96},
    {"scale_attn_weights": False},
    {"scale_attn_by_inverse_layer_idx": True},
], ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
def test_implemented_fields_match_transformers(tmp_path, fields) -> None:
    config = GPT2Config(**BASE, **fields)
    # smaller matrices than lively_weights' 20x keep unscaled attention scores inside fp16
    weights = lively_weights(config, seed=2)
    for _, array in weights.arrays():
        if array.ndim == 2:
            array /= 10 if not fields.get("scale_attn_weights", True) else 1
    save_hf(tmp_path, config, weights)
    model = models.load(tmp_path, progress=False)
    assert model.config == config
    want = hf_logits(tmp_path, IDS)
    atol = 0.03 * float(np.abs(want).max())
    np.testing.assert_allclose(model.logits(IDS), want, rtol=0, atol=atol)
    np.testing.assert_allclose(model.prefill(IDS[:4]), want[3], rtol=0, atol=atol)
    np.testing.assert_allclose(model.decode_step(IDS[4]), want[4], rtol=0, atol=atol)
    assert np.argmax(model.logits(IDS), 1).tolist() == np.argmax(want, 1).tolist()


@pytest.mark.parametrize("key, value, message", [
    ("activation_function", "mish", "activation_function 'mish' is not implemented"),
    ("add_cross_attention", True, "add_cross_attention=True is not implemented"),
    ("tie_word_embeddings", False, "tie_word_embeddings=False is not implemented"),
    ("n_inner", 0, "n_inner must be a positive integer"),
    ("scale_attn_weights", "yes", "scale_attn_weights must be true or false"),
    ("n_ctx", 32, "n_ctx=32 differs from n_positions=64"),
])
def test_unimplemented_values_are_refused_naming_the_field(tmp_path, key, value, message) -> None:
    data = {**GPT2Config(**BASE).to_hf_json(), key: value}
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=message) as err:
        GPT2Config.from_hf_json(tmp_path)
    assert isinstance(err.value, orion.OrionError) and "config.json" in str(err.value)


def test_inert_and_default_fields_load_and_unknown_keys_get_a_note() -> None:
    data = {**GPT2Config(**BASE).to_hf_json(), "resid_pdrop": 0.0, "summary_type": "mean", "use_cache": False,
            "reorder_and_upcast_attn": True, "add_cross_attention": False, "n_special": 0,
            "predict_special_tokens": True, "torchscript": False}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert GPT2Config.from_hf_json(data) == GPT2Config(**BASE)
    with pytest.warns(ConfigNote, match=r"'rotary_dim' is not among the fields that change a GPT-2 model"):
        GPT2Config.from_hf_json({**data, "rotary_dim": 16})


def test_the_default_config_round_trips_with_the_new_fields() -> None:
    config = GPT2Config(**BASE, activation_function="relu", n_inner=80, scale_attn_by_inverse_layer_idx=True)
    assert GPT2Config.from_hf_json(config.to_hf_json()) == config
    assert config.param_count() == sum(a.size for _, a in lively_weights(config).arrays())
