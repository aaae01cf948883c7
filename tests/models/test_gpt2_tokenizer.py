"""GPT-2 tokenizer loading: tiny tokenizer.json files built here with the tokenizers library."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import orion
from orion.models.gpt2.tokenizer import TokenizerError, TokenizerNotFound, load_tokenizer

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
    return directory


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
