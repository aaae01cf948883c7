"""Llama weights: random init, Hugging Face directories (single, sharded; fp32, fp16, bf16), llama2.c's
legacy .bin, RoPE-convention permutation, and the errors for every mismatch."""

from __future__ import annotations

import json
import struct
from dataclasses import replace

import numpy as np
import pytest

from orion.models.llama.config import LlamaConfig
from orion.models.llama.weights import (
    INDEX_FILE,
    WEIGHTS_FILE,
    WeightsError,
    load_hf,
    load_llama2c,
    random_weights,
    save_hf,
    save_llama2c,
    to_rope_convention,
    write_safetensors,
)
from support.llama_reference import reference_logits

GQA = LlamaConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=120,
                  max_position_embeddings=32, rope_convention="interleaved", tie_embeddings=True,
                  bos_token_id=1, eos_token_ids=(2,))
QWEN = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=120,
                   max_position_embeddings=32, qkv_bias=True, model_type="qwen2", rope_theta=1e6)


def same(a, b) -> None:
    assert [n for n, _ in a.arrays()] == [n for n, _ in b.arrays()]
    for (name, x), (_, y) in zip(a.arrays(), b.arrays()):
        np.testing.assert_array_equal(x, y, err_msg=name)


def test_random_weights_are_deterministic_and_hashed() -> None:
    a, b = random_weights(QWEN, seed=3), random_weights(QWEN, seed=3)
    same(a, b)
    assert a.content_hash(QWEN) == b.content_hash(QWEN)
    b.layers[1].bv[0] += 1
    assert a.content_hash(QWEN) != b.content_hash(QWEN)
    assert a.lm_head is not None and a.layers[0].bq.shape == (64,)
    tied = random_weights(GQA)
    assert tied.lm_head is None and tied.classifier is tied.embed and tied.layers[0].bq is None
    assert sum(x.size for _, x in tied.arrays()) == GQA.param_count()


@pytest.mark.parametrize("dtype,rel", [("float32", 0.0), ("float16", 2.0 ** -11), ("bfloat16", 2.0 ** -8)])
@pytest.mark.parametrize("shard", [None, 30_000])
def test_hugging_face_round_trip(tmp_path, dtype, rel, shard) -> None:
    weights = random_weights(QWEN, seed=1)
    save_hf(tmp_path, QWEN, weights, dtype=dtype, max_shard_bytes=shard)
    assert (tmp_path / INDEX_FILE).is_file() == (shard is not None)
    assert (len(list(tmp_path.glob("*.safetensors"))) > 1) == (shard is not None)
    config, loaded = load_hf(tmp_path, progress=False)
    assert config == QWEN
    for (name, x), (_, y) in zip(weights.arrays(), loaded.arrays()):
        np.testing.assert_allclose(y, x, rtol=rel, atol=6e-8 if rel else 0, err_msg=name)  # fp16 subnormals


def test_interleaved_weights_are_stored_rotate_half_with_the_same_logits(tmp_path) -> None:
    weights = random_weights(GQA, seed=2)
    save_hf(tmp_path, GQA, weights)
    assert not (tmp_path / "lm_head.weight").exists()
    config, loaded = load_hf(tmp_path, progress=False)
    assert config.rope_convention == "half" and config.tie_embeddings and loaded.lm_head is None
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    np.testing.assert_allclose(reference_logits(config, loaded, ids), reference_logits(GQA, weights, ids), atol=1e-5)
    back_config, back = to_rope_convention(config, loaded, "interleaved")
    assert back_config == GQA
    same(back, weights)


def test_rope_conversion_permutes_the_q_k_biases_too() -> None:
    config = replace(QWEN, rope_convention="interleaved")
    weights = random_weights(config, seed=6)
    half_config, half = to_rope_convention(config, weights, "half")
    assert not np.array_equal(half.layers[0].bk, weights.layers[0].bk)
    np.testing.assert_array_equal(half.layers[0].bv, weights.layers[0].bv)
    ids = [7, 0, 3, 3, 9, 100]
    np.testing.assert_allclose(reference_logits(half_config, half, ids), reference_logits(config, weights, ids),
                               atol=1e-5)


def _tensors(path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    return load_file(str(path / WEIGHTS_FILE))


def test_shape_mismatch_names_the_tensor_and_both_shapes(tmp_path) -> None:
    save_hf(tmp_path, QWEN, random_weights(QWEN))
    meta = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(meta | {"num_key_value_heads": 4}))
    with pytest.raises(WeightsError, match=r"'model.layers.0.self_attn.k_proj.bias' has shape \(32,\), expected \(64,\)"):
        load_hf(tmp_path)


def test_missing_unexpected_and_untied_head_errors(tmp_path) -> None:
    save_hf(tmp_path, QWEN, random_weights(QWEN))
    tensors = _tensors(tmp_path)
    write_safetensors(tmp_path / WEIGHTS_FILE, {k: v for k, v in tensors.items() if "1.mlp.up" not in k}, "F32")
    with pytest.raises(WeightsError, match="missing tensor 'model.layers.1.mlp.up_proj.weight'"):
        load_hf(tmp_path)
    write_safetensors(tmp_path / WEIGHTS_FILE, tensors | {"model.layers.2.input_layernorm.weight": np.ones(64)}, "F32")
    with pytest.raises(WeightsError, match="unexpected tensor 'model.layers.2.input_layernorm.weight'"):
        load_hf(tmp_path)
    write_safetensors(tmp_path / WEIGHTS_FILE, tensors | {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8)},
                      "F32")
    load_hf(tmp_path)  # RoPE buffers of older checkpoints are recomputed from theta
    meta = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(meta | {"tie_word_embeddings": True}))
    with pytest.raises(WeightsError, match="differs from 'model.embed_tokens.weight'"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(meta | {"model_type": "llama", "architectures": None}))
    with pytest.raises(WeightsError, match="unexpected tensor 'model.layers.0.self_attn.(q|k|v)_proj.bias'"):
        load_hf(tmp_path)


def test_sharded_index_errors(tmp_path) -> None:
    save_hf(tmp_path, QWEN, random_weights(QWEN), max_shard_bytes=50_000)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    first = next(iter(index["weight_map"]))
    moved = dict(index, weight_map=index["weight_map"] | {first: "model-00009-of-00009.safetensors"})
    (tmp_path / INDEX_FILE).write_text(json.dumps(moved))
    with pytest.raises(WeightsError, match=f"tensor '{first}' is in shard 'model-00009-of-00009.safetensors'"):
        load_hf(tmp_path)
    (tmp_path / INDEX_FILE).write_text("[]")
    with pytest.raises(WeightsError, match="weight_map"):
        load_hf(tmp_path)
    (tmp_path / INDEX_FILE).unlink()
    with pytest.raises(WeightsError, match="neither model.safetensors nor"):
        load_hf(tmp_path)


def test_non_float_tensors_and_missing_directories(tmp_path) -> None:
    save_hf(tmp_path, GQA, random_weights(GQA))
    tensors = _tensors(tmp_path)
    tensors["model.norm.weight"] = np.arange(64, dtype=np.int32)
    from safetensors.numpy import save_file
    save_file(tensors, str(tmp_path / WEIGHTS_FILE))
    with pytest.raises(WeightsError, match="'model.norm.weight' has dtype I32"):
        load_hf(tmp_path)
    with pytest.raises(WeightsError, match="no such directory"):
        load_hf(tmp_path / "nope")
    with pytest.raises(WeightsError, match="dtype 'int8'"):
        save_hf(tmp_path, GQA, random_weights(GQA), dtype="int8")


@pytest.mark.parametrize("tied", [True, False])
def test_llama2c_round_trip(tmp_path, tied) -> None:
    config = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=50,
                         max_position_embeddings=24, rope_convention="interleaved", tie_embeddings=tied,
                         bos_token_id=1, eos_token_ids=(2,))
    weights = random_weights(config, seed=4)
    save_llama2c(tmp_path / "m.bin", config, weights)
    header = struct.unpack("<7i", (tmp_path / "m.bin").read_bytes()[:28])
    assert header == (64, 96, 2, 4, 2, 50 if tied else -50, 24)
    loaded_config, loaded = load_llama2c(tmp_path / "m.bin")
    assert loaded_config == config
    same(loaded, weights)
    half_config, half = to_rope_convention(config, weights, "half")  # saving permutes back to interleaved
    save_llama2c(tmp_path / "h.bin", half_config, half)
    assert (tmp_path / "h.bin").read_bytes() == (tmp_path / "m.bin").read_bytes()


def test_llama2c_errors(tmp_path) -> None:
    config = LlamaConfig(dim=32, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=16, hidden_dim=40, vocab_size=20,
                         max_position_embeddings=8, rope_convention="interleaved", tie_embeddings=True,
                         bos_token_id=1, eos_token_ids=(2,))
    save_llama2c(tmp_path / "m.bin", config, random_weights(config))
    data = (tmp_path / "m.bin").read_bytes()
    (tmp_path / "short.bin").write_bytes(data[:-4])
    with pytest.raises(WeightsError, match=f"{len(data) - 4} bytes, but its header .* implies {len(data)}"):
        load_llama2c(tmp_path / "short.bin")
    (tmp_path / "v1.bin").write_bytes(struct.pack("<ii", 0x616B3432, 1) + data[8:])
    with pytest.raises(WeightsError, match="--version 0"):
        load_llama2c(tmp_path / "v1.bin")
    n_tables = 2 * 8 * 8 * 4
    tampered = data[:len(data) - n_tables] + np.zeros(2 * 8 * 8, "<f4").tobytes()
    (tmp_path / "freq.bin").write_bytes(tampered)
    with pytest.raises(WeightsError, match="freq_cis"):
        load_llama2c(tmp_path / "freq.bin")
    with pytest.raises(WeightsError, match="model_type"):
        save_llama2c(tmp_path / "q.bin", QWEN, random_weights(QWEN))
    with pytest.raises(WeightsError, match="no such file"):
        load_llama2c(tmp_path / "none.bin")


def test_validate_names_the_bad_array() -> None:
    weights = random_weights(GQA)
    weights.layers[1].wk = weights.layers[1].wk[:8]
    with pytest.raises(WeightsError, match=r"layers.1.wk: expected float32 or float16 \(32, 64\)"):
        weights.validate(GQA)
    with pytest.raises(WeightsError, match="lm_head is absent"):
        random_weights(GQA).validate(QWEN)
