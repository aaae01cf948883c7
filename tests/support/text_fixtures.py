"""A small GPT-2 directory with a byte-level BPE tokenizer.json whose size equals the model's vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from orion.models import GPT2Config
from orion.models.gpt2.weights import save_hf
from support.gpt2_fixtures import lively_weights

CONFIG = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=128)
EOS = "<|endoftext|>"


def byte_level_tokenizer(vocab_size: int) -> Tokenizer:
    """Byte-level BPE (any text encodes) padded with added tokens to exactly ``vocab_size`` ids."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the neural engine runs the model", "hello world, hello engine",
                             "café naïve 🙂 日本語"], trainer)
    tok.add_tokens([f"<extra_{i}>" for i in range(vocab_size - tok.get_vocab_size())])
    assert tok.get_vocab_size() == vocab_size
    return tok


def write_model_dir(directory: Path, config: GPT2Config = CONFIG, seed: int = 1, tokenizer: bool = True,
                    **tokenizer_config: object) -> Path:
    """``directory`` as a Hugging Face GPT-2 directory (config, weights, tokenizer files)."""
    save_hf(directory, config, lively_weights(config, seed=seed))
    if tokenizer:
        byte_level_tokenizer(config.vocab_size).save(str(directory / "tokenizer.json"))
        (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS, "bos_token": EOS,
                                                                     **tokenizer_config}))
    return directory
