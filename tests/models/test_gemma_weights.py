"""Gemma weights through the shared Hugging Face loader (``orion.models.hf_checkpoint``): a saved directory loads
back bit for bit, and each malformed checkpoint is refused with an error naming the file, the tensor and the fix."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file

from orion.models.gemma.config import GemmaConfig
from orion.models.gemma.weights import WeightsError, load_hf, random_weights, save_hf
from orion.models.weights_io import WEIGHTS_FILE, write_safetensors

CONFIG = GemmaConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, hidden_dim=48, vocab_size=64,
                     max_position_embeddings=32, sliding_window=8, sliding_layers=(0,), model_type="gemma3_text",
                     qk_norm=True, query_pre_attn_scalar=8)


def test_a_saved_directory_loads_back_exactly(tmp_path) -> None:
    weights = random_weights(CONFIG, seed=3)
    save_hf(tmp_path, CONFIG, weights)
    config, loaded = load_hf(tmp_path, progress=False)
    assert config == CONFIG
    saved, back = dict(weights.arrays()), dict(loaded.arrays())
    assert saved.keys() == back.keys()
    for name, array in saved.items():
        assert back[name].dtype == np.float32 and np.array_equal(back[name], array), name


def _rewrite(directory, change) -> None:
    tensors = load_file(str(directory / WEIGHTS_FILE))
    change(tensors)
    write_safetensors(directory / WEIGHTS_FILE, tensors, "F32")


def test_malformed_checkpoints_are_refused_by_file_and_tensor(tmp_path) -> None:
    save_hf(tmp_path, CONFIG, random_weights(CONFIG))
    file = tmp_path / WEIGHTS_FILE
    key = "model.layers.1.self_attn.q_norm.weight"
    _rewrite(tmp_path, lambda t: t.update({key: np.ones(4, np.float32)}))
    with pytest.raises(WeightsError) as info:
        load_hf(tmp_path, progress=False)
    message = str(info.value)
    assert str(file) in message and f"tensor {key!r} has shape (4,), expected (8,)" in message
    assert "head_dim=8" in message  # the config value the shape comes from

    _rewrite(tmp_path, lambda t: t.update({key: np.ones(8, np.float32),
                                          "model.layers.2.input_layernorm.weight": np.ones(32, np.float32)}))
    with pytest.raises(WeightsError, match="unexpected tensor 'model.layers.2.input_layernorm.weight'.*n_layers=2"):
        load_hf(tmp_path, progress=False)

    _rewrite(tmp_path, lambda t: [t.pop("model.layers.2.input_layernorm.weight"),
                                  t.pop("model.layers.0.mlp.up_proj.weight")])
    with pytest.raises(WeightsError, match="missing tensor 'model.layers.0.mlp.up_proj.weight'"):
        load_hf(tmp_path, progress=False)

    save_hf(tmp_path, CONFIG, random_weights(CONFIG))
    _rewrite(tmp_path, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] + 1}))
    with pytest.raises(WeightsError, match="differs from 'model.embed_tokens.weight'.*Fix: set it to false"):
        load_hf(tmp_path, progress=False)
