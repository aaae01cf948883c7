"""The numpy Llama reference against transformers' LlamaForCausalLM, Qwen2ForCausalLM and MistralForCausalLM.

Checkpoints are tiny random models that transformers itself saved; Orion's loader reads them, and the
reference must reproduce transformers' fp32 logits to 1e-4 of the largest logit magnitude and its
greedy continuation exactly. llama2.c checkpoints (interleaved RoPE) converted to a Hugging Face
directory by Orion must give transformers the same logits as the reference on the original.
"""

from __future__ import annotations

import numpy as np
import pytest

from orion.models.llama.config import LlamaConfig
from orion.models.llama.weights import (
    load_hf,
    load_llama2c,
    random_weights,
    save_hf,
    save_llama2c,
)
from orion.models.weights_io import MappedSafetensors
from support import references
from support.llama_reference import reference_greedy, reference_logits

torch, transformers = references.require("torch", "transformers")

TOLERANCE = 1e-4  # of max |logit|: both sides compute in fp32


def _hf_model(kind: str, tied: bool, seed: int):
    torch.manual_seed(seed)
    shape = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 80, "num_hidden_layers": 2,
             "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 64,
             "rms_norm_eps": 1e-5, "tie_word_embeddings": tied, "bos_token_id": 1, "eos_token_id": 2}
    if kind == "llama":
        config = transformers.LlamaConfig(**shape, rope_theta=500.0)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "mistral":
        config = transformers.MistralConfig(**shape, rope_theta=2e4, sliding_window=None)
        model = transformers.MistralForCausalLM(config)
    else:
        config = transformers.Qwen2Config(**shape, rope_theta=1e6)
        model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():  # lively weights: non-unit norms and larger matrices make every parameter matter
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.08))
    return model.eval()


def _hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def _hf_greedy(model, ids: list[int], n: int) -> list[int]:
    model.generation_config.eos_token_id = None  # greedy for n tokens, through EOS as the reference does
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE * float(np.abs(want).max()))


@pytest.mark.parametrize("kind,tied", [("llama", False), ("llama", True), ("qwen2", False), ("qwen2", True),
                                       ("mistral", False)])
def test_reference_matches_transformers_on_a_checkpoint_it_saved(tmp_path, kind, tied) -> None:
    model = _hf_model(kind, tied, seed=len(kind) + tied)
    model.save_pretrained(tmp_path)
    config, weights = load_hf(tmp_path, progress=False)
    assert (config.n_heads, config.n_kv_heads, config.head_dim, config.qkv_bias, config.tie_embeddings) == \
        (8, 2, 16, kind == "qwen2", tied)
    ids = [int(i) for i in np.random.default_rng(5).integers(0, 96, 40)]
    _close(reference_logits(config, weights, ids), _hf_logits(model, ids))
    prompt = ids[:3]
    assert reference_greedy(config, weights, prompt, 12) == _hf_greedy(model, prompt, 12)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_checkpoints_load_as_transformers_reads_them(tmp_path, dtype) -> None:
    model = _hf_model("llama", False, seed=3).to(getattr(torch, dtype))
    model.save_pretrained(tmp_path)
    _, weights = load_hf(tmp_path, progress=False)
    for (name, p), (_, ours) in zip(model.state_dict().items(), _ordered(weights, model)):
        # float16 as stored (a view of the file); bfloat16 as one float16 copy: the values transformers
        # reads, rounded to fp16 as every program bakes them (exact in fp16's normal range)
        assert ours.dtype == np.float16, name
        np.testing.assert_array_equal(ours, p.float().numpy().astype(np.float16), err_msg=name)


def _ordered(weights, model):
    """Orion's array for each transformers state-dict entry, in the state dict's order."""
    fields = {"embed_tokens.weight": "embed", "norm.weight": "norm", "input_layernorm.weight": "attn_norm",
              "self_attn.q_proj.weight": "wq", "self_attn.k_proj.weight": "wk", "self_attn.v_proj.weight": "wv",
              "self_attn.o_proj.weight": "wo", "post_attention_layernorm.weight": "mlp_norm",
              "mlp.gate_proj.weight": "w_gate", "mlp.up_proj.weight": "w_up", "mlp.down_proj.weight": "w_down",
              "self_attn.q_proj.bias": "bq", "self_attn.k_proj.bias": "bk", "self_attn.v_proj.bias": "bv"}
    for name in model.state_dict():
        if name == "lm_head.weight":
            yield name, weights.classifier
        elif name.startswith("model.layers."):
            i, rest = name[len("model.layers."):].split(".", 1)
            yield name, getattr(weights.layers[int(i)], fields[rest])
        else:
            yield name, getattr(weights, fields[name[len("model."):]])


@pytest.mark.parametrize("tied", [True, False])
def test_a_llama2c_checkpoint_converted_to_hugging_face_runs_the_same_in_transformers(tmp_path, tied) -> None:
    config = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=80,
                         max_position_embeddings=32, rope_convention="interleaved", tie_embeddings=tied,
                         bos_token_id=1, eos_token_ids=(2,))
    weights = random_weights(config, seed=7)
    for _, array in weights.arrays():
        array *= 4 if array.ndim == 2 else 1
    save_llama2c(tmp_path / "model.bin", config, weights)
    config, weights = load_llama2c(tmp_path / "model.bin")
    save_hf(tmp_path / "hf", config, weights)  # permutes q/k rows to rotate-half
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = [int(i) for i in np.random.default_rng(1).integers(0, 80, 20)]
    _close(reference_logits(config, weights, ids), _hf_logits(model, ids))


def test_transformers_reads_the_bf16_shards_orion_writes(tmp_path) -> None:
    config = LlamaConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=16, hidden_dim=80, vocab_size=96,
                         max_position_embeddings=64, qkv_bias=True, model_type="qwen2")
    weights = random_weights(config, seed=2)
    save_hf(tmp_path, config, weights, dtype="bfloat16", max_shard_bytes=20_000)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    stored = {name: f.float32(name) for f in map(MappedSafetensors, tmp_path.glob("*.safetensors"))
              for name in f.header if name != "__metadata__"}
    assert set(stored) ^ set(model.state_dict()) <= {"lm_head.weight"}, set(stored) ^ set(model.state_dict())
    for name, array in stored.items():  # the bf16 values Orion wrote, widened exactly
        np.testing.assert_array_equal(model.state_dict()[name].numpy(), array, err_msg=name)
    _, ours = load_hf(tmp_path, progress=False)
    for (name, p), (_, array) in zip(model.state_dict().items(), _ordered(ours, model)):
        np.testing.assert_array_equal(p.numpy().astype(np.float16), array, err_msg=name)  # loaded as fp16
    assert np.abs(ours.layers[0].wq - weights.layers[0].wq).max() <= 2.0 ** -8 * np.abs(weights.layers[0].wq).max()
    ids = [5, 6, 7, 8, 9]
    _close(reference_logits(config, ours, ids), _hf_logits(model, ids))
