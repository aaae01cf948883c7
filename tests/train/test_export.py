"""A full training run ends with ``RUN_DIR/model``, a Hugging Face directory of the trained weights
(orion.train.export), which inference and transformers read:

- the weights Orion loads from it are the last checkpoint's fp32 master weights, exactly (float32), or rounded
  once (float16);
- transformers' fp32 forward of the directory gives Orion's logits of it within fp16 rounding (the independent
  reference that the tensor names, layouts and config say the network that was trained);
- it carries the tokenizer the ids came from: the token data's, or, for a fine-tune, the base directory's files
  and the config fields Orion does not model (token ids).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orion import models
from orion.lora.train import LoraSpec
from orion.models.llama import weights as llama_weights
from orion.models.llama.config import LlamaConfig
from orion.train import checkpoint
from orion.train.cli import main as train_main
from orion.train.errors import TrainError
from orion.train.trainer import Trainer, load_model
from support import references
from support.token_files import prepared_text

TEXT = "The quick brown fox jumps over the lazy dog. What is two plus two? Two plus two is four.\n" * 40


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared data directory (and its 512-token BPE) of TEXT."""
    return prepared_text(tmp_path_factory.mktemp("bpe"), TEXT, 512)


def _run(out: Path, model: str, data_dir: Path, *extra: str) -> Path:
    args = ["--model", model, "--data", str(data_dir), "--steps", "3", "--seq", "32", "--lr", "3e-3", "--out", str(out),
            "--eval-every", "3", "--eval-batches", "1", "--quiet", *extra]
    assert train_main(args) == 0
    return out / "model"


def _master_weights(run: Path) -> dict[str, np.ndarray]:
    ckpt = checkpoint.load(checkpoint.latest_valid(run / "checkpoints"))
    return {k.split("/", 1)[1]: v for k, v in ckpt.tensors.items() if k.startswith("param/")}


@pytest.mark.parametrize("shape", ["tiny-gpt2", "tiny-llama"])
def test_a_full_run_writes_the_master_weights_as_a_model_directory_transformers_reads_alike(
        shape: str, bpe: Path, tmp_path: Path) -> None:
    torch, transformers = references.require("torch", "transformers")
    directory = _run(tmp_path / "run", shape, bpe)
    assert (directory / "tokenizer.json").read_bytes() == (bpe / "tokenizer.json").read_bytes()
    master = _master_weights(tmp_path / "run")
    _, exported, _ = load_model(directory)  # the directory's weights as the trainer reads a model directory
    assert set(exported) == set(master)
    for name, value in master.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)
    ids = [int(i) for i in np.random.default_rng(3).integers(0, 512, 24)]
    ours = models.load(directory, progress=False).logits(ids).astype(np.float64)
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].double().numpy()
    # fp16 activations through 2 layers: within 1% of the logits' range (measured: about 0.1%)
    assert np.abs(ours - theirs).max() <= 0.01 * np.abs(theirs).max(), np.abs(ours - theirs).max()
    assert (ours.argmax(axis=1) == theirs.argmax(axis=1)).mean() >= 0.9


def test_float16_rounds_the_master_weights_once(bpe: Path, tmp_path: Path) -> None:
    directory = _run(tmp_path / "run", "tiny-llama", bpe, "--save-dtype", "float16")
    assert json.loads((directory / "config.json").read_text())["dtype"] == "float16"
    _, exported, _ = load_model(directory)
    for name, value in _master_weights(tmp_path / "run").items():
        np.testing.assert_array_equal(exported[name], value.astype(np.float16).astype(np.float32), err_msg=name)


def test_a_fine_tune_keeps_the_base_directory_s_tokenizer_and_config_fields(bpe: Path, tmp_path: Path) -> None:
    base = tmp_path / "base"
    config = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=512,
                         max_position_embeddings=64)
    llama_weights.save_hf(base, config, llama_weights.random_weights(config, seed=0))
    base_config = json.loads((base / "config.json").read_text()) | {"eos_token_id": 7, "bos_token_id": 5,
                                                                   "torch_dtype": "bfloat16"}
    (base / "config.json").write_text(json.dumps(base_config))
    (base / "tokenizer.json").write_bytes((bpe / "tokenizer.json").read_bytes())
    (base / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    (base / "generation_config.json").write_text(json.dumps({"eos_token_id": 7, "do_sample": True, "temperature": 0.5}))
    directory = _run(tmp_path / "run", str(base), bpe, "--from-scratch")
    written = json.loads((directory / "config.json").read_text())
    assert written["eos_token_id"] == 7 and written["bos_token_id"] == 5
    assert written["dtype"] == written["torch_dtype"] == "float32"
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (directory / name).read_bytes() == (base / name).read_bytes(), name
    assert models.load(directory, progress=False).generation_defaults.temperature == 0.5


def test_a_lora_run_has_no_model_to_save(bpe: Path, tmp_path: Path) -> None:
    trainer = Trainer("tiny-llama", bpe, tmp_path / "run", steps=1, seq=32, quiet=True, lora=LoraSpec(r=4))
    with pytest.raises(TrainError, match="LoRA run's parameters are its adapters"):
        trainer.save_model(tmp_path / "model")
