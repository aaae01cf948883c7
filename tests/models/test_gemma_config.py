"""Gemma 2 / Gemma 3 text ``config.json`` fields (issue 22): the published files load as they are, with no note;
every field of transformers' Gemma config classes is either implemented (``MODEL_FIELDS``) or known not to change
the model; values Orion does not implement are refused naming the field; Orion's own ``config.json`` is read back
the same by Orion and by transformers."""

from __future__ import annotations

import warnings

import pytest

import orion
from orion.models.config_fields import INERT_FIELDS
from orion.models.gemma.config import MODEL_FIELDS, ConfigError, GemmaConfig
from support import references
from support.gemma_configs import GEMMA2_2B_IT, GEMMA3_1B_IT


def test_the_published_configs_load_as_they_are_with_no_note() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gemma2 = GemmaConfig.from_hf_json(GEMMA2_2B_IT)
        gemma3 = GemmaConfig.from_hf_json(GEMMA3_1B_IT)
    assert (gemma2.sliding_window, gemma2.sliding_layers[:3], len(gemma2.sliding_layers)) == (4096, (0, 2, 4), 13)
    assert (gemma2.attn_softcap, gemma2.final_softcap, gemma2.qk_norm, gemma2.eos_token_ids) == (50.0, 30.0, False,
                                                                                               (1, 107))
    assert gemma2.rope(0) == gemma2.rope(1) == (10000.0, 1.0) and gemma2.attention_scale == 256 ** -0.5
    assert [i for i in range(26) if i not in gemma3.sliding_layers] == [5, 11, 17, 23]
    assert (gemma3.sliding_window, gemma3.attn_softcap, gemma3.final_softcap, gemma3.qk_norm) == (512, None, None, True)
    assert gemma3.rope(0) == (10000.0, 1.0) and gemma3.rope(5) == (1e6, 1.0)
    assert gemma3.window(0) == 512 and gemma3.window(5) is None
    assert gemma3.embed_scale == pytest.approx(1152 ** 0.5, rel=1e-7)


def test_every_field_of_transformers_config_classes_is_read_or_inert() -> None:
    """The explicit per-family lists cover transformers' own: a field added there fails here, not silently."""
    _, transformers = references.require("torch", "transformers")
    base = set(transformers.PreTrainedConfig.__dataclass_fields__)
    for cls, model_type in ((transformers.Gemma2Config, "gemma2"), (transformers.Gemma3TextConfig, "gemma3_text")):
        own = set(cls.__dataclass_fields__) - base
        assert own - MODEL_FIELDS[model_type] - set(INERT_FIELDS) == set(), model_type


@pytest.mark.parametrize("changes,field", [
    ({"hidden_activation": "gelu"}, "hidden_activation"),
    ({"hidden_act": "relu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "rope_scaling"),  # Gemma 2 has no RoPE scaling
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "beta_fast": 32}}, "rope_parameters.beta_fast"),
    ({"rope_theta": 1e4, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, "RoPE's base"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
    ({"architectures": ["Gemma2ForSequenceClassification"]}, "architectures"),
    ({"layer_types": ["sliding_attention"]}, "layer_types"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"num_key_value_heads": 3}, "n_kv_heads"),
])
def test_fields_orion_does_not_implement_are_errors_naming_them(changes, field) -> None:
    with pytest.raises(ConfigError, match=field) as info:
        GemmaConfig.from_hf_json(GEMMA2_2B_IT | changes)
    assert isinstance(info.value, orion.OrionError) and "config dict" in str(info.value)


def test_gemma3_rope_blocks_and_linear_scaling() -> None:
    v5 = GEMMA3_1B_IT | {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                 "rope_theta": 1e6},
                                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    for key in ("rope_theta", "rope_local_base_freq", "rope_scaling"):
        v5.pop(key)
    old = GEMMA3_1B_IT | {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    assert GemmaConfig.from_hf_json(v5) == GemmaConfig.from_hf_json(old)
    assert GemmaConfig.from_hf_json(old).rope(5) == (1e6, 8.0) and GemmaConfig.from_hf_json(old).rope(0) == (1e4, 1.0)
    with pytest.raises(ConfigError, match="sliding_attention"):
        GemmaConfig.from_hf_json(v5 | {"rope_parameters": v5["rope_parameters"] | {"sliding_attention": {
            "rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}})


@pytest.mark.parametrize("published", [GEMMA2_2B_IT, GEMMA3_1B_IT])
def test_orions_config_json_reads_back_the_same_in_orion_and_transformers(published) -> None:
    _, transformers = references.require("torch", "transformers")
    config = GemmaConfig.from_hf_json(published | {"rope_scaling": None} if "rope_local_base_freq" in published
                                      else published)
    data = config.to_hf_json()
    assert GemmaConfig.from_hf_json(data) == config
    hf = transformers.AutoConfig.for_model(**data)
    assert [i for i, kind in enumerate(hf.layer_types) if kind == "sliding_attention"] == list(config.sliding_layers)
    assert (hf.sliding_window, hf.query_pre_attn_scalar, hf.attn_logit_softcapping, hf.final_logit_softcapping) == \
        (config.sliding_window, config.query_pre_attn_scalar, config.attn_softcap, config.final_softcap)
