"""GPT-2 configuration, random initialization and Hugging Face checkpoint load/save."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import orion
from orion.models.gpt2.config import ConfigError, GPT2Config
from orion.models.gpt2.weights import (
    GPT2Weights,
    WeightsError,
    expected_shapes,
    load_hf,
    random_weights,
    save_hf,
)
from orion.runtime.pages import map_of

SMALL = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=128)


def assert_same(a: GPT2Weights, b: GPT2Weights) -> None:
    names_a = [name for name, _ in a.arrays()]
    assert names_a == [name for name, _ in b.arrays()]
    for (name, x), (_, y) in zip(a.arrays(), b.arrays()):
        assert x.dtype == y.dtype == np.float32, name
        assert np.array_equal(x, y), name


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    save_hf(tmp_path, SMALL, random_weights(SMALL, seed=1))
    return tmp_path


def rewrite(directory: Path, edit) -> None:
    """Apply edit(tensors) to the checkpoint's model.safetensors in place."""
    tensors = load_file(directory / "model.safetensors")
    edit(tensors)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})


# --- configuration ---------------------------------------------------------------------------

def test_config_defaults_are_gpt2_small():
    c = GPT2Config()
    assert (c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.n_positions) == (12, 12, 768, 50257, 1024)
    assert c.layer_norm_epsilon == 1e-5 and c.head_dim == 64
    assert c.param_count() == 124_439_808


def test_param_count_matches_arrays():
    assert SMALL.param_count() == sum(a.size for _, a in random_weights(SMALL).arrays())


@pytest.mark.parametrize("field", ["n_layer", "n_head", "n_embd", "vocab_size", "n_positions"])
@pytest.mark.parametrize("value", [0, -1, 2.0, True])
def test_config_rejects_non_positive_sizes(field, value):
    with pytest.raises(ConfigError, match=f"GPT2Config.{field} must be a positive integer"):
        GPT2Config(**{field: value})


def test_config_rejects_indivisible_heads():
    with pytest.raises(ConfigError, match=r"n_embd \(100\) must be divisible by n_head \(12\)"):
        GPT2Config(n_embd=100)


@pytest.mark.parametrize("eps", [0.0, -1e-5, "1e-5"])
def test_config_rejects_bad_epsilon(eps):
    with pytest.raises(ConfigError, match="layer_norm_epsilon must be a positive number"):
        GPT2Config(layer_norm_epsilon=eps)


def test_config_errors_are_orion_errors():
    assert issubclass(ConfigError, orion.OrionError) and issubclass(ConfigError, ValueError)


def test_hf_json_round_trip(tmp_path):
    data = SMALL.to_hf_json()
    assert data["model_type"] == "gpt2" and data["architectures"] == ["GPT2LMHeadModel"]
    assert data["n_ctx"] == data["n_positions"] == 128
    assert GPT2Config.from_hf_json(data) == SMALL
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert GPT2Config.from_hf_json(tmp_path / "config.json") == SMALL
    assert GPT2Config.from_hf_json(tmp_path) == SMALL


def test_hf_json_reads_n_ctx_when_n_positions_is_absent():
    data = SMALL.to_hf_json()
    del data["n_positions"]
    assert GPT2Config.from_hf_json(data).n_positions == 128


def test_hf_json_missing_key_names_file_and_key(tmp_path):
    data = SMALL.to_hf_json()
    del data["n_head"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=rf"{path}: missing key 'n_head'"):
        GPT2Config.from_hf_json(path)
    data = SMALL.to_hf_json()
    del data["n_positions"], data["n_ctx"]
    with pytest.raises(ConfigError, match="missing key 'n_positions' or 'n_ctx'"):
        GPT2Config.from_hf_json(data)


def test_hf_json_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        GPT2Config.from_hf_json(tmp_path / "nope.json")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable JSON file"):
        GPT2Config.from_hf_json(tmp_path)
    with pytest.raises(ConfigError, match="model_type is 'llama', expected 'gpt2'"):
        GPT2Config.from_hf_json({**SMALL.to_hf_json(), "model_type": "llama"})
    with pytest.raises(ConfigError, match=r"config dict: GPT2Config: n_embd \(64\) must be divisible by n_head \(3\)"):
        GPT2Config.from_hf_json({**SMALL.to_hf_json(), "n_head": 3})


# --- random initialization -------------------------------------------------------------------

def test_random_weights_shapes_and_dtype():
    w = random_weights(SMALL)
    w.validate(SMALL)
    shapes = expected_shapes(SMALL)
    assert w.blocks[0].w_qkv.shape == (192, 64) and w.blocks[0].w_proj.shape == (64, 256)
    for name, array in w.arrays():
        assert array.shape == shapes[name.split(".")[-1]] and array.dtype == np.float32


def test_random_weights_are_deterministic():
    assert_same(random_weights(SMALL, seed=3), random_weights(SMALL, seed=3))
    assert not np.array_equal(random_weights(SMALL, seed=3).wte, random_weights(SMALL, seed=4).wte)
    assert random_weights(SMALL, seed=3).content_hash(SMALL) == random_weights(SMALL, seed=3).content_hash(SMALL)


def test_random_weights_statistics():
    config = GPT2Config(n_layer=8, n_head=4, n_embd=128, vocab_size=2048, n_positions=256)
    w = random_weights(config)
    residual = 0.02 / math.sqrt(2 * config.n_layer)
    for array, std in [(w.wte, 0.02), (w.wpe, 0.02), (w.blocks[0].w_qkv, 0.02), (w.blocks[3].w_fc, 0.02),
                       (w.blocks[0].w_attn_out, residual), (w.blocks[7].w_proj, residual)]:
        assert abs(array.mean()) < 0.05 * std
        assert abs(array.std() / std - 1) < 0.02
    for block in w.blocks:
        for g in (block.ln1_g, block.ln2_g):
            assert np.all(g == 1)
        for b in (block.ln1_b, block.ln2_b, block.b_qkv, block.b_attn_out, block.b_fc, block.b_proj):
            assert np.all(b == 0)
    assert np.all(w.ln_f_g == 1) and np.all(w.ln_f_b == 0)


def test_param_count_is_gpt2_small_at_full_size_and_matches_the_arrays():
    assert GPT2Config().param_count() == 124_439_808  # GPT-2 small's published count
    w = random_weights(SMALL)  # the same shape code at a size that is quick to draw
    assert sum(a.size for _, a in w.arrays()) == SMALL.param_count()


# --- validation and content hash -------------------------------------------------------------

def test_validate_names_the_bad_array():
    w = random_weights(SMALL)
    w.blocks[1].w_fc = w.blocks[1].w_fc.T
    with pytest.raises(WeightsError, match=r"blocks.1.w_fc: expected float32 or float16 \(256, 64\), found"):
        w.validate(SMALL)
    w = random_weights(SMALL)
    w.wte = w.wte.astype(np.float64)
    with pytest.raises(WeightsError, match=r"GPT2Weights.wte: expected float32 or float16"):
        w.validate(SMALL)
    w = random_weights(SMALL)
    w.blocks.pop()
    with pytest.raises(WeightsError, match="has 1 blocks, config.n_layer is 2"):
        w.validate(SMALL)


def test_content_hash_sees_every_byte_and_the_config():
    w = random_weights(SMALL)
    base = w.content_hash(SMALL)
    assert len(base) == 64 and int(base, 16) >= 0
    w.blocks[1].b_proj[5] = 1e-30
    assert w.content_hash(SMALL) != base
    w.blocks[1].b_proj[5] = 0.0
    assert w.content_hash(SMALL) == base
    assert w.content_hash(GPT2Config(**{**SMALL.__dict__, "layer_norm_epsilon": 1e-6})) != base


# --- save_hf / load_hf -----------------------------------------------------------------------

def test_save_writes_standard_hf_directory(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["architectures"] == ["GPT2LMHeadModel"]
    tensors = load_file(checkpoint / "model.safetensors")
    assert "lm_head.weight" not in tensors
    assert all(name.startswith("transformer.") for name in tensors)
    assert tensors["transformer.h.1.attn.c_attn.weight"].shape == (64, 192)  # Conv1D: [in, out]
    assert tensors["transformer.h.1.mlp.c_proj.weight"].shape == (256, 64)
    w = random_weights(SMALL, seed=1)
    assert np.array_equal(tensors["transformer.h.1.mlp.c_fc.weight"], w.blocks[1].w_fc.T)
    assert len(tensors) == 4 + 12 * SMALL.n_layer


def test_round_trip_is_exact(checkpoint):
    config, w = load_hf(checkpoint)
    assert config == SMALL
    assert_same(w, random_weights(SMALL, seed=1))
    # Unsourced, the same bytes hash the same; sourced, the file's digest stands for them (stable).
    assert replace(w, source=None).content_hash(config) == random_weights(SMALL, seed=1).content_hash(SMALL)
    assert w.content_hash(config) == load_hf(checkpoint)[1].content_hash(config)
    # An F32 file is mapped, not copied: every array is a read-only view of the file's map.
    assert all(not a.flags.writeable and not a.flags.owndata for _, a in w.arrays())


def test_load_without_prefix_with_buffers_and_tied_head(checkpoint):
    def strip(tensors):
        for name in list(tensors):
            tensors[name.removeprefix("transformer.")] = tensors.pop(name)
        tensors["lm_head.weight"] = tensors["wte.weight"].copy()
        for i in range(SMALL.n_layer):
            tensors[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 128, 128), np.float32))
            tensors[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)

    rewrite(checkpoint, strip)
    assert_same(load_hf(checkpoint)[1], random_weights(SMALL, seed=1))


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_load_converts_float_dtypes(checkpoint, dtype):
    """F16 loads as float16 views of the file's map (no copy, no float32 copy); F64 converts to float32."""
    rewrite(checkpoint, lambda t: t.update({k: v.astype(dtype) for k, v in t.items()}))
    w = load_hf(checkpoint)[1]
    for (name, got), (_, want) in zip(w.arrays(), random_weights(SMALL, seed=1).arrays()):
        assert got.dtype == (np.float16 if dtype == np.float16 else np.float32), name
        assert (map_of(got) is not None) == (dtype == np.float16), name
        assert np.array_equal(got, want.astype(dtype).astype(got.dtype)), name


def write_safetensors_raw(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """A safetensors file written byte by byte (numpy cannot hold bfloat16)."""
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def test_load_converts_bfloat16(checkpoint):
    tensors = load_file(checkpoint / "model.safetensors")
    raw = {}
    for name, array in tensors.items():
        bits = (array.astype(np.float32).view(np.uint32) >> 16).astype("<u2")  # truncate to bf16
        raw[name] = ("BF16", list(array.shape), bits.tobytes())
    write_safetensors_raw(checkpoint / "model.safetensors", raw)
    w = load_hf(checkpoint)[1]
    want = random_weights(SMALL, seed=1)
    truncated = (want.blocks[1].w_qkv.view(np.uint32) & 0xFFFF0000).view(np.float32)
    assert w.blocks[1].w_qkv.dtype == np.float16  # one converted copy, at 2 bytes a weight
    assert np.array_equal(w.blocks[1].w_qkv, truncated.astype(np.float16))
    assert np.array_equal(w.blocks[0].ln1_g, want.blocks[0].ln1_g)


def test_progress_lines_go_to_stderr(checkpoint, capsys):
    load_hf(checkpoint, progress=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"orion: loading model.safetensors: {4 + 12 * SMALL.n_layer}/{4 + 12 * SMALL.n_layer} tensors"
    load_hf(checkpoint, progress=False)
    load_hf(checkpoint)  # automatic: small files are quiet
    assert capsys.readouterr().err == ""


# --- load_hf errors --------------------------------------------------------------------------

def test_missing_directory_and_files(tmp_path):
    with pytest.raises(WeightsError, match="no such directory; a GPT-2 directory holds"):
        load_hf(tmp_path / "absent")
    with pytest.raises(WeightsError, match=r"missing config.json; a GPT-2 directory holds a Hugging Face "
                                           r"config.json and model.safetensors"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(SMALL.to_hf_json()))
    with pytest.raises(WeightsError, match=rf"{tmp_path / 'model.safetensors'}: missing model.safetensors"):
        load_hf(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(WeightsError, match="pytorch_model.bin only: re-save it as safetensors"):
        load_hf(tmp_path)


def test_unreadable_safetensors(checkpoint):
    (checkpoint / "model.safetensors").write_bytes(b"garbage!")
    with pytest.raises(WeightsError, match="not a readable safetensors file"):
        load_hf(checkpoint)


def test_missing_tensor_is_named(checkpoint):
    rewrite(checkpoint, lambda t: t.pop("transformer.h.1.ln_2.bias"))
    with pytest.raises(WeightsError, match=r"missing tensor 'h.1.ln_2.bias' \(looked for it with and without"):
        load_hf(checkpoint)


def test_shape_mismatch_names_tensor_expected_and_found(checkpoint):
    def transpose_qkv(tensors):
        tensors["transformer.h.0.attn.c_attn.weight"] = np.ascontiguousarray(tensors["transformer.h.0.attn.c_attn.weight"].T)

    rewrite(checkpoint, transpose_qkv)
    with pytest.raises(WeightsError, match=r"tensor 'transformer.h.0.attn.c_attn.weight' has shape \(192, 64\), "
                                           r"expected \(64, 192\) \(Hugging Face Conv1D layout \[in, out\]\)"):
        load_hf(checkpoint)


def test_config_disagreeing_with_tensors(checkpoint):
    (checkpoint / "config.json").write_text(json.dumps({**SMALL.to_hf_json(), "vocab_size": 500}))
    with pytest.raises(WeightsError, match=r"'transformer.wte.weight' has shape \(512, 64\), expected \(500, 64\)"):
        load_hf(checkpoint)
    (checkpoint / "config.json").write_text(json.dumps({**SMALL.to_hf_json(), "n_layer": 1}))
    with pytest.raises(WeightsError, match=r"unexpected tensor 'transformer.h.1.attn.c_attn.bias'.*n_layer=1"):
        load_hf(checkpoint)


def test_untied_lm_head_is_rejected(checkpoint):
    rewrite(checkpoint, lambda t: t.update({"lm_head.weight": t["transformer.wte.weight"] + 1}))
    with pytest.raises(WeightsError, match="'lm_head.weight' differs from wte.weight"):
        load_hf(checkpoint)
    rewrite(checkpoint, lambda t: t.update({"lm_head.weight": t["transformer.wte.weight"][:100]}))
    with pytest.raises(WeightsError, match=r"'lm_head.weight' has shape \(100, 64\), expected \(512, 64\)"):
        load_hf(checkpoint)


def test_duplicate_and_non_float_tensors(checkpoint):
    rewrite(checkpoint, lambda t: t.update({"wpe.weight": t["transformer.wpe.weight"]}))
    with pytest.raises(WeightsError, match="tensor 'wpe.weight' stored twice"):
        load_hf(checkpoint)
    rewrite(checkpoint, lambda t: (t.pop("wpe.weight"), t.update({"transformer.ln_f.bias": np.zeros(64, np.int32)})))
    with pytest.raises(WeightsError, match="'transformer.ln_f.bias' has dtype I32; expected a float"):
        load_hf(checkpoint)


def test_weights_errors_are_orion_errors():
    assert issubclass(WeightsError, orion.OrionError)
