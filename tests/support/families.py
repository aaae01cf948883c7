"""The published ``config.json`` of the families that run on the Llama layer (Llama 3.2, Qwen3, SmolLM3, Phi-3.5,
Phi-4-mini), and transformers' models of them with random weights at 2 layers, for the comparisons in
``tests/models/test_families.py``.

Every published field is kept except, said where it is done: ``num_hidden_layers`` (2), ``vocab_size`` (512, so
the embedding and head stay small; the special token ids are moved inside it) and, where a test needs it,
``no_rope_layers`` cut to the 2 layers (SmolLM3: the published pattern's layers 3 and 4, one with RoPE and one
without) or ``original_max_position_embeddings`` made small (so the context past it is short).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from support import references

VOCAB = 512

_PHI35_LONG = [1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601, 1.5899999141693115,
               1.600000023841858, 1.6200000047683716, 2.620000123977661, 3.2300000190734863, 3.2300000190734863,
               4.789999961853027, 7.400000095367432, 7.700000286102295, 9.09000015258789, 12.199999809265137,
               17.670000076293945, 24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523,
               32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992, 50.340003967285156,
               50.45000457763672, 57.55000305175781, 57.93000411987305, 58.21000289916992, 60.1400032043457,
               62.61000442504883, 62.62000274658203, 62.71000289916992, 63.1400032043457, 63.1400032043457,
               63.77000427246094, 63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688,
               64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938, 64.4800033569336,
               64.51000213623047, 64.52999877929688, 64.83999633789062]
_PHI35_SHORT = [1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705, 1.0499999523162842,
                1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0699999332427979,
                1.0999999046325684, 1.1099998950958252, 1.1599998474121094, 1.1599998474121094, 1.1699998378753662,
                1.2899998426437378, 1.339999794960022, 1.679999828338623, 1.7899998426437378, 1.8199998140335083,
                1.8499997854232788, 1.8799997568130493, 1.9099997282028198, 1.9399996995925903, 1.9899996519088745,
                2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
                2.0199997425079346, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
                2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
                2.0799996852874756, 2.0899996757507324, 2.189999580383301, 2.2199995517730713, 2.5899994373321533,
                2.729999542236328, 2.749999523162842, 2.8399994373321533]
_PHI4_LONG = [1, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817, 2.187582649,
              2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023, 4.785517845, 5.351743533,
              5.984965424, 6.693110555, 7.485043894, 8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651,
              14.64173252, 16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03, 32.1,
              32.13, 32.23, 32.6, 32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16, 47.77]

PUBLISHED: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": {  # meta-llama/Llama-3.2-1B
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256},
    "qwen3-0.6b": {  # Qwen/Qwen3-0.6B
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
        "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
        "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
    "smollm3-3b": {  # HuggingFaceTB/SmolLM3-3B
        "architectures": ["SmolLM3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": None, "eos_token_id": 128012, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 65536,
        "max_window_layers": 28, "mlp_bias": False, "model_type": "smollm3", "no_rope_layer_interval": 4,
        "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(36)], "num_attention_heads": 16,
        "num_hidden_layers": 36, "num_key_value_heads": 4, "pad_token_id": 128004, "pretraining_tp": 2,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 5000000.0, "sliding_window": None,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.54.0.dev0",
        "use_cache": False, "use_sliding_window": False, "vocab_size": 128256},
    "phi-3.5-mini": {  # microsoft/Phi-3.5-mini-instruct
        "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
        "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
        "rope_scaling": {"long_factor": _PHI35_LONG, "short_factor": _PHI35_SHORT, "type": "longrope"},
        "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.46.3", "use_cache": True, "vocab_size": 32064},
    "phi-4-mini": {  # microsoft/Phi-4-mini-instruct
        "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 199999, "embd_pdrop": 0.0, "eos_token_id": 199999, "full_attn_mod": 1, "hidden_act": "silu",
        "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192, "interpolate_factor": 1,
        "lm_head_bias": False, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "phi3",
        "num_attention_heads": 24, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "original_max_position_embeddings": 4096, "pad_token_id": 199999, "partial_rotary_factor": 0.75,
        "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
        "rope_scaling": {"long_factor": _PHI4_LONG, "short_factor": [1.0] * 48, "type": "longrope"},
        "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0", "use_cache": True, "vocab_size": 200064},
}


def two_layers(name: str, **changes: Any) -> dict[str, Any]:
    """The published config of ``name`` at 2 layers and a vocabulary of :data:`VOCAB` (special ids 1 and 2),
    with ``changes`` (a value of ``...`` removes the key)."""
    data = copy.deepcopy(PUBLISHED[name])
    data.update(num_hidden_layers=2, vocab_size=VOCAB)
    for key, value in (("bos_token_id", 1), ("eos_token_id", 2), ("pad_token_id", 0)):
        if data.get(key) is not None:
            data[key] = value
    if "no_rope_layers" in data:
        data["no_rope_layers"] = data["no_rope_layers"][2:4]
    data.update(changes)
    return {k: v for k, v in data.items() if v is not ...}


def hf_model(data: dict[str, Any], seed: int = 0):
    """transformers' causal LM of config ``data`` (eager attention, fp32) with lively random weights: matrices
    normal(0, 1/sqrt(fan-in)) (the embedding normal(0, 3/sqrt(hidden)): logits of a few units), norm gains 1 +- 0.3, so every parameter matters and
    activations have the sizes of a trained model's."""
    torch, transformers = references.require("torch", "transformers")
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(**copy.deepcopy(data))
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1 + 0.6 * (torch.rand_like(p) - 0.5))
            elif "embed_tokens" in name:
                p.normal_(0, 3 * p.shape[1] ** -0.5)
            else:
                p.normal_(0, p.shape[1] ** -0.5)
            p.copy_(p.bfloat16().float())  # bf16 values: save_bf16 writes them exactly, in half the bytes
    return model.eval()


def save_bf16(model, directory) -> None:
    """Save :func:`hf_model`'s model as bf16 safetensors (its weights are bf16 values: nothing rounds; its buffers,
    such as RoPE's frequencies, stay fp32 in the model)."""
    model.save_pretrained(directory, state_dict={k: v.bfloat16() for k, v in model.state_dict().items()})


def hf_logits(model, ids: list[int]) -> np.ndarray:
    """transformers' fp32 logits ``[len(ids), vocab]`` of one forward pass over ``ids``."""
    torch, = references.require("torch")
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()
