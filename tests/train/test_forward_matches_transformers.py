"""The trainer's forward is the network that transformers (and Orion's inference) runs (issue 27).

For Hugging Face directories that transformers writes (random weights, initializer range 0.3, so the residual
stream passes the size at which a naive fp16 norm overflows, as a trained model's does) and for the real
SmolLM2-135M-Instruct:

- the trainer's loss on fixed windows (its fp16 programs on the emulator, placed on the ANE) equals
  transformers' float32 cross-entropy on the same tokens within 1%;
- each layer of the training graph (weights as inputs) gives the inference graph's (weights baked) hidden state
  within fp16 rounding (1% of the layer's largest |value|), from the same input: transformers' hidden state.

On the code before 0c2ef59 (naive fp16 norms), three of the five directories fail (losses off by 3%, a GPT-2
layer off by more than 1%), and SmolLM2's loss was 18.96 against transformers' 4.76. The 9-over-3-heads
directory (width 144) also failed to load for inference then: its padded residual-stream surface needed 49,248
bytes, more than the KV surfaces it must match in size (ANE-13).

And a fine-tune whose base model starts above the loss of uniform guessing stops before its first step.
"""

from __future__ import annotations

import numpy as np
import pytest

import orion
from orion import models
from orion.autodiff import cpu
from orion.autodiff.runner import GradientRunner
from orion.models.gpt2 import graphs as gpt2_graphs
from orion.models.gpt2.config import GPT2Config
from orion.models.llama import graphs as llama_graphs
from orion.train.errors import TrainError
from orion.train.trainer import Trainer, load_model, read_log
from support import references
from support.token_files import periodic_tokens

SEQ, WINDOWS = 64, 3
LOSS_RTOL, LAYER_ATOL = 0.01, 0.01

# (family, transformers config keywords): every family the trainer accepts; GQA group sizes 1-4, RoPE bases 1e4 and
# 1e6, tied and untied
CASES = {
    "gpt2": ("gpt2", dict(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=128)),
    "llama-g1-1e4-tied": ("llama", dict(num_attention_heads=4, num_key_value_heads=4, rope_theta=1e4,
                                        tie_word_embeddings=True)),
    "llama-g2-1e6-untied": ("llama", dict(num_attention_heads=6, num_key_value_heads=3, rope_theta=1e6,
                                          tie_word_embeddings=False)),
    "llama-g3-1e4-untied": ("llama", dict(num_attention_heads=9, num_key_value_heads=3, rope_theta=1e4,
                                          tie_word_embeddings=False)),
    "llama-g4-1e6-tied": ("llama", dict(num_attention_heads=8, num_key_value_heads=2, rope_theta=1e6,
                                        tie_word_embeddings=True)),
    "mistral-g4-1e6-untied": ("mistral", dict(num_attention_heads=8, num_key_value_heads=2, rope_theta=1e6,
                                              tie_word_embeddings=False)),
    "qwen2-g3-1e6-tied": ("qwen2", dict(num_attention_heads=6, num_key_value_heads=2, rope_theta=1e6,
                                        tie_word_embeddings=True)),  # q/k/v biases
}


def _hf_directory(family: str, settings: dict, directory):
    torch, transformers = references.require("torch", "transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(initializer_range=0.3, **settings)
    else:
        heads = settings["num_attention_heads"]
        kind = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
                "qwen2": transformers.Qwen2Config}[family]
        config = kind(hidden_size=16 * heads, head_dim=16, intermediate_size=96, num_hidden_layers=2, vocab_size=512,
                      max_position_embeddings=128, initializer_range=0.3, **settings)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(directory)
    return model


def _windows(vocab: int, tokens: np.ndarray | None = None) -> list[np.ndarray]:
    """``WINDOWS`` windows of ``SEQ + 1`` tokens: from ``tokens`` (real text) or random ids."""
    if tokens is None:
        return [np.random.default_rng(w).integers(0, vocab, SEQ + 1) for w in range(WINDOWS)]
    step = (len(tokens) - SEQ - 1) // WINDOWS
    return [tokens[w * step:w * step + SEQ + 1] for w in range(WINDOWS)]


def _transformers_loss(model, window: np.ndarray) -> float:
    torch, = references.require("torch")
    with torch.no_grad():
        logits = model(torch.tensor(window[None, :-1])).logits[0].double()
    return torch.nn.functional.cross_entropy(logits, torch.tensor(window[1:])).item()


def _check_losses(directory, hf_model, windows: list[np.ndarray]) -> None:
    trainable, params, _ = load_model(directory)
    runner = GradientRunner(trainable, SEQ, prefer="ane")
    for w, window in enumerate(windows):
        got, want = runner.loss(params, window[:-1], window[1:]), _transformers_loss(hf_model, window)
        assert got == pytest.approx(want, rel=LOSS_RTOL), f"window {w}: Orion {got:.4f}, transformers {want:.4f}"


def _check_layers(directory, hf_model, window: np.ndarray, layers: list[int]) -> None:
    """Training layer graph against the inference prefill graph of the same layer, from transformers' input."""
    torch, = references.require("torch")
    trainable, params, _ = load_model(directory)
    inference = models.load(directory, progress=False)
    graphs = gpt2_graphs if isinstance(inference.config, GPT2Config) else llama_graphs
    with torch.no_grad():
        hidden = hf_model(torch.tensor(window[None, :SEQ]), output_hidden_states=True).hidden_states
    train_layer = orion.compile_graph(trainable.layer_graph(SEQ), max_layers=trainable.attention_per_layer)
    for i in layers:
        x = cpu.to_channels(hidden[i][0].float().numpy().astype(np.float16).astype(np.float32))
        trained = train_layer(x=x, **trainable.layer_inputs(params, i))["y"]
        inferred = orion.compile_graph(graphs.prefill_graph(inference.config, inference.weights, range(i, i + 1),
                                                            SEQ))(x=x)["x"]
        scale = float(np.abs(inferred).max())
        np.testing.assert_allclose(trained, inferred, rtol=0, atol=LAYER_ATOL * scale, err_msg=f"layer {i}")


@pytest.mark.parametrize("case", list(CASES))
def test_hf_directory_trains_the_network_transformers_runs(case: str, tmp_path) -> None:
    family, settings = CASES[case]
    hf_model = _hf_directory(family, settings, tmp_path)
    windows = _windows(hf_model.config.vocab_size)
    _check_losses(tmp_path, hf_model, windows)
    _check_layers(tmp_path, hf_model, windows[0], [0, 1])


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    torch, transformers = references.require("torch", "transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    text = ("The Apple Neural Engine is a neural processing unit in Apple's chips. It runs the matrix multiplications "
            "of machine learning models in half precision, at a fraction of the power a GPU needs. Developers reach "
            "it through Core ML, which compiles a model into a program the engine can run. ") * 4
    tokens = np.array(tokenizer(text)["input_ids"])
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    return smollm2_dir, model, tokens


def test_smollm2_trainer_loss_is_transformers_loss(smollm2) -> None:
    directory, hf_model, tokens = smollm2
    _check_losses(directory, hf_model, _windows(hf_model.config.vocab_size, tokens))


def test_smollm2_training_layers_are_the_inference_layers(smollm2) -> None:
    directory, hf_model, tokens = smollm2
    _check_layers(directory, hf_model, tokens[:SEQ + 1], [0, 2, 3, 15])


def test_a_fine_tune_that_starts_above_uniform_stops_before_the_first_step(tmp_path, capsys) -> None:
    """A model directory whose base validation loss is above log(vocabulary size) (here: random weights of
    initializer range 0.3, loss ~12 against log 512 = 6.24) stops with the loss and the fix, before any step;
    ``from_scratch=True`` says it is meant and trains."""
    _hf_directory("llama", CASES["llama-g2-1e6-untied"][1], tmp_path / "model")
    tokens = periodic_tokens(tmp_path, 512)
    with pytest.raises(TrainError, match=r"above log\(vocabulary size\) = 6\.2383.*--from-scratch"):
        Trainer(tmp_path / "model", tokens, tmp_path / "run", steps=2, seq=SEQ, prefer="ane").train()
    assert "base model: validation loss" in capsys.readouterr().err
    assert [r for r in read_log(tmp_path / "run" / "train.jsonl") if r.get("event") == "step"] == []
    records = Trainer(tmp_path / "model", tokens, tmp_path / "scratch", steps=2, seq=SEQ, prefer="ane", quiet=True,
                      from_scratch=True).train()
    assert len(records) == 2
