"""Tokenizer loading: tiny tokenizer.json files built here with the tokenizers library, and the
special tokens taken from the model's JSON files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import orion
from orion.generation.tokenizer import TokenizerError, TokenizerNotFound, load_tokenizer

SENTENCES = [
    "The Apple Neural Engine runs transformer models.",
    "Orion compiles GPT-2 to MIL and runs it on the ANE.",
    "Hello world! Hello, neural engine.",
]


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory) -> Path:
    """A byte-level BPE like GPT-2's, trained on a few sentences, with <|endoftext|>."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES, trainer)
    directory = tmp_path_factory.mktemp("bpe")
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|endoftext|>"}}))
    return directory


def copy_with(bpe_dir: Path, target: Path, **files: dict) -> Path:
    """``bpe_dir``'s tokenizer.json in ``target`` with the given JSON files (``config`` -> config.json)."""
    (target / "tokenizer.json").write_bytes((bpe_dir / "tokenizer.json").read_bytes())
    for name, data in files.items():
        (target / f"{name}.json").write_text(json.dumps(data))
    return target


def test_byte_level_round_trip(bpe_dir):
    tok = load_tokenizer(bpe_dir)
    for text in SENTENCES + ["unseen words, émoji 🙂 and\nnewlines"]:
        ids = tok.encode(text)
        assert ids and all(isinstance(i, int) for i in ids)
        assert tok.decode(ids) == text
    assert len(tok.encode(SENTENCES[0])) < len(SENTENCES[0])  # merges were learned


def test_eos_token(bpe_dir):
    tok = load_tokenizer(bpe_dir)
    assert tok.eos_token_id == 0  # the first special token
    assert tok.encode("<|endoftext|>") == [0]
    assert tok.decode([*tok.encode("end"), tok.eos_token_id]) == "end<|endoftext|>"
    assert tok.vocab_size == 300
    assert tok.path == bpe_dir / "tokenizer.json"


def test_eos_and_bos_come_from_the_model_files_in_order(bpe_dir, tmp_path):
    plain = load_tokenizer(copy_with(bpe_dir, tmp_path))
    assert plain.eos_token_ids == () and plain.eos_token_id is None and plain.bos_token_id is None  # nothing hard-coded
    both = copy_with(bpe_dir, tmp_path, config={"eos_token_id": 7, "bos_token_id": 5},
                     tokenizer_config={"eos_token": "<|endoftext|>", "add_bos_token": True})
    tok = load_tokenizer(both)
    assert tok.eos_token_ids == (7,) and tok.bos_token_id == 5  # config.json wins over tokenizer_config.json
    assert tok.encode("end") == [5, *plain.encode("end")]  # add_bos_token
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, 3]}))
    assert load_tokenizer(tmp_path).eos_token_ids == (9, 3)  # generation_config.json wins, lists allowed


def test_bad_special_tokens_name_the_file(bpe_dir, tmp_path):
    copy_with(bpe_dir, tmp_path, tokenizer_config={"eos_token": "</s>"})
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json: eos_token '</s>' is not in the vocabulary"):
        load_tokenizer(tmp_path)
    copy_with(bpe_dir, tmp_path, config={"eos_token_id": "two"})
    with pytest.raises(TokenizerError, match=r"config.json: eos_token_id 'two' is not a token id"):
        load_tokenizer(tmp_path)


def test_word_level_without_eos(tmp_path):
    tok = Tokenizer(models.WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = load_tokenizer(tmp_path)
    assert loaded.encode("hello world again") == [0, 1, 2]
    assert loaded.decode([1, 0]) == "world hello"
    assert loaded.eos_token_id is None


def test_missing_tokenizer_explains_what_is_needed(tmp_path):
    with pytest.raises(TokenizerNotFound) as info:
        load_tokenizer(tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message
    assert "needs the Hugging Face tokenizer.json next to the weights" in message
    assert "token ids work without one" in message
    assert isinstance(info.value, orion.OrionError) and isinstance(info.value, FileNotFoundError)


def test_malformed_tokenizer_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{\"not\": \"a tokenizer\"}")
    with pytest.raises(TokenizerError, match="tokenizer.json: not a valid Hugging Face tokenizer file"):
        load_tokenizer(tmp_path)
