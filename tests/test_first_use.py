"""What a new user meets first: a NaN weight named as the checkpoint names it, a quiet load that is quiet,
and ``| head`` that ends without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from orion import models
from orion.constraints import ConstraintError
from orion.models import GPT2Config, hf_checkpoint
from orion.models.llama import weights as llama_weights
from orion.models.llama.config import LlamaConfig
from support.text_fixtures import write_model_dir

CONFIG = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=96,
                     max_position_embeddings=32, rope_convention="half")


@pytest.fixture
def llama_dir(tmp_path):
    llama_weights.save_hf(tmp_path, CONFIG, llama_weights.random_weights(CONFIG, seed=2))
    return tmp_path


@pytest.mark.parametrize(("value", "says"), [(np.nan, "1 NaN"), (np.inf, "1 infinite")])
def test_a_bad_weight_is_named_as_the_checkpoint_names_it(llama_dir, value, says) -> None:
    path = llama_dir / "model.safetensors"
    tensors = load_file(path)
    tensors["model.layers.0.mlp.down_proj.weight"][3, 5] = value
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ConstraintError) as caught:
        models.load(llama_dir, progress=False)
    message = str(caught.value)
    assert "ANE-25" in message and "tensor 'model.layers.0.mlp.down_proj.weight'" in message, message
    assert f"{says} of its {CONFIG.hidden_dim * CONFIG.dim} values" in message, message


def test_progress_false_silences_the_loader(llama_dir, monkeypatch, capfd) -> None:
    monkeypatch.setattr(hf_checkpoint, "PROGRESS_MIN_BYTES", 0)  # as for a model of 64 MiB or more
    models.load(llama_dir, progress=False)
    assert capfd.readouterr().err == ""
    models.load(llama_dir, progress=True)
    assert "orion: loaded" in capfd.readouterr().err  # the lines the flag controls


def test_a_closed_pipe_ends_generate_quietly(tmp_path) -> None:
    """The reader stops after 3 bytes while 1000 tokens are still to come: exit status 141 (SIGPIPE's), nothing
    on stderr."""
    model_dir = write_model_dir(tmp_path / "gpt2", GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512,
                                                              n_positions=1024))
    env = {**os.environ, "ORION_CACHE_DIR": "off"}
    command = (f"{sys.executable} -m orion generate --model {model_dir} --prompt hello --max-new-tokens 1000 "
               f"--ignore-eos --quiet | head -c 3; exit ${{PIPESTATUS[0]}}")
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=300)
    assert out.stdout == "hel" and out.stderr == "" and out.returncode == 141, out.stderr
