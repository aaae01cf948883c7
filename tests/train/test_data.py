"""Token files (nanoGPT, llama2.c shards, one file), the resumable sampler, eval batches, prepare and its CLI,
and the built-in standard-library corpus."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tokenizers

from orion.train import corpus, data, data_cli
from orion.train.errors import DataError

TEXTS = [
    "The quick brown fox jumps over the lazy dog. " * 40 + "Numbers: 12 345 6789.\n",
    "def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n    return a + b\n" * 30,
    "Ünïcödé text – with dashes, “quotes” and emoji 🙂.\n" * 25,
]


def _write_tokens(path: Path, tokens) -> np.ndarray:
    array = np.asarray(tokens, dtype="<u2")
    path.write_bytes(array.tobytes())
    return array


def test_nanogpt_layout_and_sampler_windows_match_slicing(tmp_path: Path) -> None:
    train = _write_tokens(tmp_path / "train.bin", np.arange(5000) % 50000)
    _write_tokens(tmp_path / "val.bin", np.arange(300) + 7)
    ds = data.open_dataset(tmp_path)
    assert ds.layout == "nanogpt" and ds.train.num_tokens == 5000 and ds.val.num_tokens == 300
    sampler = data.BatchSampler(ds.train, seq_len=16, batch_size=4, seed=3)
    x, y = sampler.next_batch()
    starts = np.random.Generator(np.random.PCG64(3)).integers(0, 5000 - 16, size=4)  # 4984 starts of 17 tokens
    expected = np.stack([train[s:s + 17].astype(np.int64) for s in starts])
    np.testing.assert_array_equal(x, expected[:, :-1])
    np.testing.assert_array_equal(y, expected[:, 1:])
    assert x.dtype == np.int64 and x.shape == (4, 16) and sampler.batches_drawn == 1


def test_llama2c_shards_first_is_val_and_windows_stay_in_one_shard(tmp_path: Path) -> None:
    for i, n in enumerate([400, 90, 600, 33]):
        _write_tokens(tmp_path / f"data{i:02d}.bin", [1] + [1000 * i + 2 + k % 900 for k in range(n - 1)])
    ds = data.open_dataset(tmp_path, vocab_size=32000)
    assert ds.layout == "llama2c"
    assert ds.val.sources == [str(tmp_path / "data00.bin")] and ds.val.num_tokens == 400
    assert ds.train.num_tokens == 90 + 600 + 33
    assert ds.train.num_windows(33) == (90 - 32) + (600 - 32) + 1
    sampler = data.BatchSampler(ds.train, seq_len=32, batch_size=64, seed=0)
    for _ in range(5):
        x, y = sampler.next_batch()
        windows = np.concatenate([x, y[:, -1:]], axis=1)
        shard = np.where(windows == 1, -1, windows // 1000)  # BOS (1) belongs to any shard
        for row in shard:
            assert len(set(row[row >= 0].tolist())) == 1  # never crosses a shard boundary


def test_single_file_holds_out_the_tail(tmp_path: Path) -> None:
    tokens = _write_tokens(tmp_path / "all.bin", np.arange(1000))
    ds = data.open_dataset(tmp_path / "all.bin", val_fraction=0.2)
    assert ds.layout == "single-file"
    np.testing.assert_array_equal(ds.train.arrays[0], tokens[:800])
    np.testing.assert_array_equal(ds.val.arrays[0], tokens[800:])


def test_resumed_sampler_sees_exactly_the_uninterrupted_batches(tmp_path: Path) -> None:
    _write_tokens(tmp_path / "train.bin", np.random.default_rng(0).integers(0, 8192, 20000))
    _write_tokens(tmp_path / "val.bin", np.arange(100))
    split = data.open_dataset(tmp_path).train
    uninterrupted = data.BatchSampler(split, 64, 8, seed=42)
    reference = [uninterrupted.next_batch() for _ in range(12)]
    first = data.BatchSampler(split, 64, 8, seed=42)
    for _ in range(5):
        first.next_batch()
    saved = json.loads(json.dumps(first.state_dict()))  # as it goes through a checkpoint manifest
    resumed = data.BatchSampler(split, 64, 8, seed=42)
    resumed.load_state_dict(saved)
    assert resumed.batches_drawn == 5
    for x_ref, y_ref in reference[5:]:
        x, y = resumed.next_batch()
        np.testing.assert_array_equal(x, x_ref)
        np.testing.assert_array_equal(y, y_ref)
    fresh = data.BatchSampler(split, 64, 8, seed=42)
    assert not np.array_equal(fresh.next_batch()[0], reference[5][0])  # the state, not the seed, carries it
    with pytest.raises(DataError, match="'seq_len': 64.*'seq_len': 32"):
        data.BatchSampler(split, 32, 8, seed=42).load_state_dict(saved)
    with pytest.raises(DataError, match="bad RNG state"):
        data.BatchSampler(split, 64, 8, seed=42).load_state_dict({**saved, "rng": {"bit_generator": "MT19937"}})


def test_eval_batches_are_fixed_and_spread(tmp_path: Path) -> None:
    val = data.TokenSplit("val", [np.arange(1000, dtype="<u2")])
    first, again = list(data.eval_batches(val, 9, 4, 3)), list(data.eval_batches(val, 9, 4, 3))
    assert len(first) == 3
    for (x1, y1), (x2, y2) in zip(first, again, strict=True):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    starts = np.concatenate([x[:, 0] for x, _ in first])
    np.testing.assert_array_equal(starts, np.linspace(0, 990, 12).round())  # 991 starts for 10 tokens


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "has 0 bytes"), (b"\x01\x00\x02", "has 3 bytes"), (None, "does not exist")],
)
def test_bad_token_files_are_refused(tmp_path: Path, content, message) -> None:
    path = tmp_path / "train.bin"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=message):
        data.open_tokens(path)


def test_out_of_vocabulary_ids_and_short_data_are_refused(tmp_path: Path) -> None:
    _write_tokens(tmp_path / "train.bin", [5, 6, 9000, 7])
    _write_tokens(tmp_path / "val.bin", [1, 2])
    with pytest.raises(DataError, match=r"train.bin: token 2 is id 9000, outside the vocabulary of 8192"):
        data.open_dataset(tmp_path, vocab_size=8192)
    ds = data.open_dataset(tmp_path)
    with pytest.raises(DataError, match="too few for one window of seq_len \\+ 1 = 9"):
        data.BatchSampler(ds.train, 8, 1, seed=0)
    (tmp_path / "val.bin").unlink()
    with pytest.raises(DataError, match="no val.bin"):
        data.open_dataset(tmp_path)
    one = tmp_path / "shards"
    one.mkdir()
    _write_tokens(one / "data00.bin", [1, 2, 3])
    with pytest.raises(DataError, match="needs at least two"):
        data.open_dataset(one)


def _text_files(tmp_path: Path) -> list[Path]:
    paths = []
    for i, text in enumerate(TEXTS):
        paths.append(tmp_path / f"doc{i}.txt")
        paths[-1].write_text(text, encoding="utf-8")
    return paths


def test_prepare_trains_bpe_and_the_tokens_decode_back_to_the_text(tmp_path: Path) -> None:
    out = tmp_path / "out"
    meta = data.prepare(_text_files(tmp_path), out, vocab_size=400, val_fraction=0.25)
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]
    assert json.loads((out / "meta.json").read_text()) == meta
    assert meta["files"] == [str(p) for p in _text_files(tmp_path)]
    ds = data.open_dataset(out)  # vocabulary checked against meta.json
    stream = np.concatenate([ds.train.arrays[0], ds.val.arrays[0]])
    assert meta["tokens"] == {"train": ds.train.num_tokens, "val": ds.val.num_tokens}
    assert ds.val.num_tokens == round(len(stream) * 0.25)
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    assert meta["vocab_size"] == tok.get_vocab_size() <= 400  # this little text runs out of merges before 400
    eot = meta["eot_id"]
    assert tok.id_to_token(eot) == "<|endoftext|>" and int(np.sum(stream == eot)) == len(TEXTS)
    documents = np.split(stream, np.flatnonzero(stream == eot) + 1)[:-1]
    for document, text in zip(documents, TEXTS, strict=True):
        assert tok.decode(document[:-1].tolist()) == text
    again = data.prepare(_text_files(tmp_path), tmp_path / "again", vocab_size=400, val_fraction=0.25)
    assert again["tokens"] == meta["tokens"]
    assert (tmp_path / "again" / "train.bin").read_bytes() == (out / "train.bin").read_bytes()  # deterministic


def test_prepare_with_a_given_tokenizer_matches_its_encoding(tmp_path: Path) -> None:
    first = tmp_path / "first"
    data.prepare(_text_files(tmp_path), first, vocab_size=300)
    given = tmp_path / "given"
    meta = data.prepare(_text_files(tmp_path)[:1], given, tokenizer=first / "tokenizer.json")
    assert meta["tokenizer_origin"] == str(first / "tokenizer.json")
    tok = tokenizers.Tokenizer.from_file(str(first / "tokenizer.json"))
    expected = tok.encode(TEXTS[0]).ids + [meta["eot_id"]]
    ds = data.open_dataset(given)
    np.testing.assert_array_equal(np.concatenate([ds.train.arrays[0], ds.val.arrays[0]]), expected)
    with pytest.raises(DataError, match="cannot load the tokenizer"):
        data.prepare(_text_files(tmp_path), tmp_path / "x", tokenizer=tmp_path / "missing.json")


def test_prepare_refuses_bad_input(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nope.txt does not exist"):
        data.prepare([tmp_path / "nope.txt"], tmp_path / "o")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café".encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8 text"):
        data.prepare([latin1], tmp_path / "o")
    with pytest.raises(DataError, match="vocab_size=200 must exceed the 256 byte tokens"):
        data.prepare(_text_files(tmp_path), tmp_path / "o", vocab_size=200)
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"text": "hello"}\n')
    with pytest.raises(DataError, match="chat.jsonl holds chat or instruction examples.*python -m orion train"):
        data.prepare([chat], tmp_path / "o")
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("a")
    with pytest.raises(DataError, match="too few to split"):
        data.prepare([tiny], tmp_path / "o", vocab_size=300)


def test_cli_prepare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(p) for p in _text_files(tmp_path)]
    assert data_cli.main(["prepare", *files, "--out", str(tmp_path / "cli"), "--vocab-size", "350"]) == 0
    meta = json.loads((tmp_path / "cli" / "meta.json").read_text())
    assert meta["vocab_size"] == 350
    assert f"{meta['tokens']['train']:,} train" in capsys.readouterr().out
    assert data_cli.main(["prepare", "--out", str(tmp_path / "std"), "--vocab-size", "500",
                          "--max-bytes", "60000"]) == 0
    std = json.loads((tmp_path / "std" / "meta.json").read_text())
    assert std["corpus"]["bytes"] <= 60000 and std["tokens"]["train"] > 10000
    assert data_cli.main(["prepare", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "m")]) == 1
    assert "missing.txt does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        data_cli.main(["prepare", *files, "--out", "x", "--vocab-size", "300", "--tokenizer", "t.json"])


def test_stdlib_corpus_is_deterministic_and_cut_at_a_line() -> None:
    text = corpus.stdlib_text(max_bytes=300_000)
    assert text == corpus.stdlib_text(max_bytes=300_000)
    assert len(text.encode()) <= 300_000 and text.endswith("\n")
    assert text.startswith("# file: __future__.py\n")
    headers = [line[len("# file: "):] for line in text.splitlines() if line.startswith("# file: ")]
    assert headers == sorted(headers) and "_compression.py" in headers
    documents = dict(corpus.stdlib_documents())
    assert "json/__init__.py" in documents and "JSON (JavaScript Object Notation)" in documents["json/__init__.py"]
    assert not any(part in {"test", "tests", "site-packages"} for name in documents for part in name.split("/")[:-1])
    info = corpus.describe(text)
    assert info["bytes"] == len(text.encode()) and len(info["sha256"]) == 64
