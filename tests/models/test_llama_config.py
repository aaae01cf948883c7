"""LlamaConfig: the Stories110M preset, parameter counts and the Hugging Face config.json mapping,
where every field is mapped, checked or explicitly ignored."""

from __future__ import annotations

import json
import warnings

import pytest

import orion
from orion.models.config_fields import INERT_FIELDS, ConfigNote
from orion.models.llama.config import VARIANTS, ConfigError, LlamaConfig, model_fields
from support import references


def hf_llama(**changes) -> dict:
    """A config.json as transformers 5 writes it for a small Llama."""
    base = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 1, "dtype": "float32", "eos_token_id": 2, "head_dim": 16, "hidden_act": "silu",
            "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96, "max_position_embeddings": 128,
            "mlp_bias": False, "model_type": "llama", "num_attention_heads": 8, "num_hidden_layers": 2,
            "num_key_value_heads": 2, "pad_token_id": None, "pretraining_tp": 1, "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}, "tie_word_embeddings": True,
            "transformers_version": "5.24.0", "use_cache": True, "vocab_size": 256}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not ...}


def test_stories110m_preset() -> None:
    c = LlamaConfig.stories110m()
    assert (c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.hidden_dim, c.vocab_size) == \
        (768, 12, 12, 12, 64, 2048, 32000)
    assert (c.max_position_embeddings, c.rms_norm_eps, c.rope_theta, c.rope_convention, c.tie_embeddings) == \
        (1024, 1e-5, 10000.0, "interleaved", True)
    assert c.param_count() == 109_529_856  # llama2.c's 109.53 M
    assert (c.bos_token_id, c.eos_token_ids, c.qkv_bias) == (1, (2,), False)


def test_param_count_counts_gqa_biases_and_an_untied_head() -> None:
    c = LlamaConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=100,
                    max_position_embeddings=32, qkv_bias=True, model_type="qwen2")
    per_layer = 2 * 64 + 64 * 128 + 2 * 64 * 32 + 128 * 64 + 3 * 64 * 96 + 128 + 2 * 32
    assert c.param_count() == 2 * 100 * 64 + 2 * per_layer + 64


def test_a_transformers_llama_config_maps_every_field() -> None:
    c = LlamaConfig.from_hf_json(hf_llama())
    assert (c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.hidden_dim, c.vocab_size) == \
        (64, 2, 8, 2, 16, 96, 256)
    assert (c.max_position_embeddings, c.rms_norm_eps, c.rope_theta, c.rope_convention, c.tie_embeddings) == \
        (128, 1e-6, 500000.0, "half", True)
    assert (c.model_type, c.qkv_bias, c.bos_token_id, c.eos_token_ids) == ("llama", False, 1, (2,))
    assert LlamaConfig.from_hf_json(c.to_hf_json()) == c


def test_older_configs_and_defaults() -> None:
    old = hf_llama(rope_parameters=..., rope_theta=10000.0, rope_scaling=None, torch_dtype="bfloat16", dtype=...,
                   head_dim=..., num_key_value_heads=..., eos_token_id=[2, 7])
    c = LlamaConfig.from_hf_json(old)
    assert (c.head_dim, c.n_kv_heads, c.rope_theta, c.eos_token_ids) == (8, 8, 10000.0, (2, 7))


def test_qwen2_and_mistral(tmp_path) -> None:
    qwen = hf_llama(model_type="qwen2", architectures=["Qwen2ForCausalLM"], attention_bias=..., mlp_bias=...,
                    pretraining_tp=..., use_sliding_window=False, sliding_window=32768, max_window_layers=2,
                    layer_types=["full_attention"] * 2, rope_parameters={"rope_theta": 1e6, "rope_type": "default"})
    c = LlamaConfig.from_hf_json(qwen)
    assert (c.model_type, c.qkv_bias, c.rope_theta) == ("qwen2", True, 1e6)
    assert LlamaConfig.from_hf_json(c.to_hf_json()) == c
    mistral = hf_llama(model_type="mistral", architectures=["MistralForCausalLM"], attention_bias=..., mlp_bias=...,
                       pretraining_tp=..., sliding_window=None)
    (tmp_path / "config.json").write_text(json.dumps(mistral))
    c = LlamaConfig.from_hf_json(tmp_path)
    assert (c.model_type, c.qkv_bias) == ("mistral", False)
    # a window at least as long as the context never slides; a shorter one slides (tests/models/test_sliding_window.py)
    assert LlamaConfig.from_hf_json(mistral | {"sliding_window": 128}).window(0) is None
    assert LlamaConfig.from_hf_json(mistral | {"sliding_window": 64}).window(1) == 64
    sliding_qwen = LlamaConfig.from_hf_json(qwen | {"use_sliding_window": True, "sliding_window": 64,
                                                    "max_window_layers": 1, "layer_types": None})
    assert [sliding_qwen.window(i) for i in range(2)] == [None, 64]
    assert LlamaConfig.from_hf_json(sliding_qwen.to_hf_json()) == sliding_qwen


@pytest.mark.parametrize("changes,field", [
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}, "rope_parameters": ...}, "'llama3' needs 'low_freq_factor'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_type is given twice with different values"),
    ({"rope_parameters": {"rope_type": "proportional", "factor": 2.0, "rope_theta": 1e4}},
     "rope_parameters.rope_type"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0, "beta_fast": 3}, "rope_parameters": ...},
     "rope_scaling.beta_fast"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 3,
                          "long_factor": [1.0] * 8}}, "short_factor must be 8 positive numbers"),
    ({"partial_rotary_factor": 0.1}, "partial_rotary_factor"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "factor": 2.0}}, "rope_parameters.factor"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"sliding_window": 64}, "sliding_window"),
    ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "use_mrope": True}, "use_mrope"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
    ({"architectures": ["LlamaForSequenceClassification"]}, "architectures"),
    ({"hidden_size": ...}, "hidden_size"),
    ({"model_type": "gpt2"}, "model_type"),
    ({"num_key_value_heads": 3}, "n_kv_heads"),
])
def test_fields_orion_does_not_implement_are_errors_naming_them(changes, field) -> None:
    with pytest.raises(ConfigError, match=field) as info:
        LlamaConfig.from_hf_json(hf_llama(**changes))
    assert isinstance(info.value, orion.OrionError) and "config dict" in str(info.value)


def test_fields_that_cannot_change_the_model_are_accepted() -> None:
    """Bookkeeping loads silently; a field no Llama reads loads with one note naming it (issue 22: the
    published SmolLM2 config.json was refused over transformers.js_config)."""
    assert {"torch_dtype", "use_cache", "pretraining_tp", "initializer_range", "attention_dropout"} <= set(INERT_FIELDS)
    assert all(INERT_FIELDS.values())
    bookkeeping = {"use_cache": False, "output_attentions": True, "tokenizer_class": "LlamaTokenizer",
                   "transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16"}}, "_name_or_path": "x",
                   "_model_name_or_path": "y", "unk_token_id": 0, "dtype": "bfloat16", "torch_dtype": "float32"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert LlamaConfig.from_hf_json(hf_llama(**bookkeeping)) == LlamaConfig.from_hf_json(hf_llama())
    with pytest.warns(ConfigNote, match=r"'brand_new_knob', 'other_knob' are not among the fields that change a "
                                        r"Llama model") as notes:
        assert LlamaConfig.from_hf_json(hf_llama(brand_new_knob=3, other_knob=1)) == LlamaConfig.from_hf_json(hf_llama())
    assert len(notes) == 1
    assert all(model_fields(t) & set(INERT_FIELDS) <= {"tie_word_embeddings"} for t in VARIANTS)


@pytest.mark.parametrize("rope", [
    {"rope_theta": 500000.0},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
    {"rope_scaling": {"rope_type": "default", "rope_theta": 500000.0}},
    {"rope_theta": 500000.0, "rope_scaling": None},
    {"rope_theta": 500000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
], ids=["rope_theta", "rope_parameters", "rope_scaling", "rope_theta-null-scaling", "both"])
def test_rope_base_is_read_from_every_form_transformers_writes(rope) -> None:
    data = {k: v for k, v in hf_llama().items() if k not in ("rope_theta", "rope_parameters", "rope_scaling")}
    assert LlamaConfig.from_hf_json({**data, **rope}).rope_theta == 500000.0
    with pytest.raises(ConfigError, match="given twice with different values"):
        LlamaConfig.from_hf_json({**data, "rope_theta": 1e4, "rope_parameters": {"rope_theta": 5e5}})


def test_invalid_shapes_and_unreadable_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="head_dim"):
        LlamaConfig(dim=64, n_layers=1, n_heads=4, n_kv_heads=4, head_dim=15, hidden_dim=8, vocab_size=8,
                    max_position_embeddings=8)
    with pytest.raises(ConfigError, match="rope_convention"):
        LlamaConfig(dim=64, n_layers=1, n_heads=4, n_kv_heads=4, head_dim=16, hidden_dim=8, vocab_size=8,
                    max_position_embeddings=8, rope_convention="neox")
    with pytest.raises(ConfigError, match="no such file"):
        LlamaConfig.from_hf_json(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable JSON"):
        LlamaConfig.from_hf_json(tmp_path)
    with pytest.raises(ConfigError, match="rotate-half"):
        LlamaConfig.stories110m().to_hf_json()


def test_transformers_reads_the_config_orion_writes() -> None:
    (transformers,) = references.require("transformers")
    c = LlamaConfig.from_hf_json(hf_llama(tie_word_embeddings=False))
    theirs = transformers.AutoConfig.for_model(**c.to_hf_json())
    assert (theirs.hidden_size, theirs.num_key_value_heads, theirs.head_dim, theirs.intermediate_size) == (64, 2, 16, 96)
    assert theirs.rope_parameters["rope_theta"] == 500000.0 and theirs.tie_word_embeddings is False
    assert LlamaConfig.from_hf_json(theirs.to_dict()) == c


def test_a_config_nested_past_the_recursion_limit_is_a_config_error(tmp_path) -> None:
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        LlamaConfig.from_hf_json(tmp_path)


# SmolLM2-135M-Instruct's config.json as HuggingFaceTB publishes it (issue 22: refused over transformers.js_config).
SMOLLM2_INSTRUCT_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "head_dim": 64, "hidden_act": "silu", "hidden_size": 576,
    "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": True,
    "max_position_embeddings": 8192, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 9,
    "num_hidden_layers": 30, "num_key_value_heads": 3, "pad_token_id": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_interleaved": False, "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16", "fp16": "float16"}},
    "transformers_version": "4.42.3", "use_cache": True, "vocab_size": 49152,
}


def test_the_published_smollm2_instruct_config_loads_as_it_is(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_INSTRUCT_CONFIG))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = LlamaConfig.from_hf_json(tmp_path)
    assert (config.dim, config.n_layers, config.n_heads, config.n_kv_heads, config.head_dim) == (576, 30, 9, 3, 64)
    assert (config.rope_theta, config.tie_embeddings, config.eos_token_ids) == (100000, True, (2,))
