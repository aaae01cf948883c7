"""Data that knows where it came from (issue 23): the three silent failures a new user met are errors or correct
behaviour, large vocabularies train, and ``--seq`` follows the model's context.

- A ``.jsonl`` of chats is read as examples (rendered with the model's template), never as uint16 ids; the same
  bytes under a ``.bin`` name are refused as text; a ``.txt`` is refused with the command that tokenizes it.
- Token data prepared with another tokenizer than the model's is refused, naming both and the ``data prepare``
  command; the model's own tokenizer passes.
- A 151,936-token (Qwen2.5-sized) vocabulary prepares uint32 files whose ids above 65,535 survive, and a tiny
  Llama of that vocabulary trains on them and on ``--data stdlib``. (A Llama: the trainer refuses Qwen2's
  q/k/v biases today.)
- ``--seq`` defaults to min(256, context), and the run's first line prints every setting, defaults marked.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from orion.models.gpt2 import weights as gpt2_weights
from orion.models.gpt2.config import GPT2Config
from orion.models.llama import weights as llama_weights
from orion.models.llama.config import LlamaConfig
from orion.train import data
from orion.train.cli import main as train_main
from orion.train.errors import DataError
from orion.train.examples import IGNORE
from orion.train.trainer import Trainer
from support.token_files import prepared_text

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TEXT = "The quick brown fox jumps over the lazy dog. What is two plus two? Two plus two is four.\n" * 30


def _llama_dir(directory: Path, vocab: int, tokenizer_json: Path, template: str | None = CHATML,
               seq: int = 64) -> Path:
    """A Hugging Face Llama directory of random weights with ``tokenizer_json`` (and a chat template)."""
    config = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=vocab,
                         max_position_embeddings=seq)
    llama_weights.save_hf(directory, config, llama_weights.random_weights(config, seed=0))
    (directory / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    settings = {"eos_token": "<|endoftext|>"} | ({"chat_template": template} if template else {})
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    return directory


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared data directory (and its 400-token BPE) of TEXT."""
    return prepared_text(tmp_path_factory.mktemp("bpe"), TEXT, 400)


def _chats(n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"What is {i} plus {i}?"},
                          {"role": "assistant", "content": f"{i} plus {i} is {2 * i}."}]} for i in range(n)]


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_chat_jsonl_is_read_as_examples_never_as_token_ids(bpe: Path, tmp_path: Path) -> None:
    model = _llama_dir(tmp_path / "model", 512, bpe / "tokenizer.json", seq=128)
    chat = _write_jsonl(tmp_path / "chat.jsonl", _chats(20))
    # the old failure: these bytes read as uint16 ids ('{"' = 8827) pass an "id < vocabulary" check of 49,152
    assert int(np.frombuffer(chat.read_bytes()[:2], "<u2")[0]) == 8827
    ds = data.open_data(chat, vocab_size=512, model_dir=model, seq=128)
    assert ds.train.report["truncated"] == 0 and ds.layout == "examples" and len(ds.train.examples) == 18 and len(ds.val.examples) == 2
    tok = tokenizers.Tokenizer.from_file(str(bpe / "tokenizer.json"))
    first = ds.train.examples[0]
    assert tok.decode(first.ids.tolist()) == ("<|im_start|>user\nWhat is 0 plus 0?<|im_end|>\n"
                                              "<|im_start|>assistant\n0 plus 0 is 0.<|im_end|>\n")
    assert tok.decode(first.ids[first.trained].tolist()) == "0 plus 0 is 0.<|im_end|>\n"
    inputs, targets = ds.train.windows(np.array([0]), 128)
    n = len(first.ids) - 1
    np.testing.assert_array_equal(inputs[0, :n], first.ids[:-1])
    assert (targets[0, n:] == IGNORE).all() and (targets[0, :n][~first.trained[1:]] == IGNORE).all()
    np.testing.assert_array_equal(targets[0, :n][first.trained[1:]], first.ids[1:][first.trained[1:]])

    renamed = tmp_path / "chat.bin"
    renamed.write_bytes(chat.read_bytes())
    with pytest.raises(DataError, match=r"chat.bin holds text .*not token ids.*looks like JSON Lines"):
        Trainer(model, renamed, tmp_path / "run", steps=1, seq=64, quiet=True)
    notes = tmp_path / "notes.txt"
    notes.write_text(TEXT)
    with pytest.raises(DataError, match="python -m orion data prepare .*notes.txt --tokenizer"):
        Trainer(model, notes, tmp_path / "run", steps=1, seq=64, quiet=True)
    with pytest.raises(DataError, match="a shape or checkpoint has none"):
        Trainer("tiny-llama", chat, tmp_path / "run", steps=1, seq=64, quiet=True)
    bare = _llama_dir(tmp_path / "bare", 512, bpe / "tokenizer.json", template=None)
    with pytest.raises(DataError, match="no chat_template"):
        Trainer(bare, chat, tmp_path / "run", steps=1, seq=64, quiet=True)


def test_examples_report_truncate_drop_and_refuse_bad_lines(bpe: Path, tmp_path: Path) -> None:
    model = _llama_dir(tmp_path / "model", 512, bpe / "tokenizer.json")
    directory = tmp_path / "set"
    directory.mkdir()
    long = {"prompt": "fox " * 10, "completion": "dog " * 200}
    no_answer = {"prompt": "fox " * 200, "completion": "dog"}
    _write_jsonl(directory / "train.jsonl", [*_chats(4), long, no_answer, {"text": "The lazy dog."}])
    _write_jsonl(directory / "valid.jsonl", _chats(3))
    ds = data.open_data(directory, vocab_size=512, model_dir=model, seq=96, max_examples=6, val_examples=2)
    report = ds.train.report
    assert report["examples"] == 5 and report["truncated"] == 2 and report["dropped"] == 1  # the text is past 6
    assert report["format"] == "messages+prompt/completion"
    assert report["trained"] == sum(int(e.trained[1:].sum()) for e in ds.train.examples) < report["tokens"]
    assert len(ds.val.examples) == 2 and ds.eval_windows(4) == 2
    everything = data.open_data(directory, vocab_size=512, model_dir=model, seq=96, train_on_prompt=True)
    assert everything.train.report["trained"] == everything.train.report["tokens"]
    bad = _write_jsonl(tmp_path / "bad.jsonl", [*_chats(3), {"input": "x", "output": "y"}])
    with pytest.raises(DataError, match=r"bad.jsonl:4: keys \['input', 'output'\]"):
        data.open_data(bad, vocab_size=512, model_dir=model)
    (tmp_path / "broken.jsonl").write_text('{"text": "a"}\n{"text": \n')
    with pytest.raises(DataError, match="broken.jsonl:2: not JSON"):
        data.open_data(tmp_path / "broken.jsonl", vocab_size=512, model_dir=model)


def test_data_from_another_tokenizer_is_refused_naming_both(bpe: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    (tmp_path / "more.txt").write_text(TEXT.upper() * 2)
    data.prepare([tmp_path / "more.txt"], other, vocab_size=300)
    model = _llama_dir(tmp_path / "model", 512, other / "tokenizer.json")
    with pytest.raises(DataError, match=(rf"{bpe} was tokenized with trained byte-level BPE, vocab 400 .*not with the "
                                         rf"model's {model / 'tokenizer.json'} .*Fix: re-prepare it: python -m orion "
                                         rf"data prepare .*text.txt --tokenizer {model / 'tokenizer.json'}")):
        Trainer(model, bpe, tmp_path / "run", steps=1, seq=32, quiet=True)
    mine = tmp_path / "mine"
    data.prepare([tmp_path / "more.txt"], mine, tokenizer=model / "tokenizer.json")
    Trainer(model, mine, tmp_path / "run", steps=1, seq=32, quiet=True)  # the model's own tokenizer: accepted


def _qwen_sized_tokenizer(path: Path) -> Path:
    """A byte-level BPE of 151,643 entries (bytes, then unreachable fillers) plus Qwen's three special tokens
    and an added word, so that text encodes to ids above 65,535."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({f"filler{i}": i for i in range(len(vocab), 151643)})
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.add_tokens(["fox"])
    tok.save(str(path))
    return path


def test_a_qwen_sized_vocabulary_prepares_uint32_and_trains(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tokenizer = _qwen_sized_tokenizer(tmp_path / "tokenizer.json")
    model = _llama_dir(tmp_path / "model", 151936, tokenizer, seq=32)
    (tmp_path / "text.txt").write_text(TEXT)
    meta = data.prepare([tmp_path / "text.txt"], tmp_path / "data", tokenizer=model / "tokenizer.json")
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == 151647
    ds = data.open_dataset(tmp_path / "data")
    stream = np.concatenate([ds.train.arrays[0], ds.val.arrays[0]])
    tok = tokenizers.Tokenizer.from_file(str(tokenizer))
    assert stream.dtype == np.uint32 and tok.token_to_id("fox") == 151646 and (stream == 151646).sum() == 30
    assert tok.decode(stream[:-1].tolist()) == TEXT  # ids above 65,535 survive the file
    trainer = Trainer(model, tmp_path / "data", tmp_path / "run", steps=2, lr=1e-3, eval_every=2, eval_batches=1,
                      checkpoint_every=2, quiet=True, prefer="ane", from_scratch=True)  # random weights
    losses = [r["loss"] for r in trainer.train()]
    assert trainer.config.seq == 32 and all(math.isfinite(x) for x in losses)
    assert abs(losses[0] - math.log(151936)) < 1.0  # random weights: about uniform over the vocabulary
    args = ["--model", str(model), "--data", "stdlib", "--data-bytes", "20000", "--steps", "1", "--out",
            str(tmp_path / "std"), "--eval-batches", "1", "--prefer", "cpu", "--quiet", "--from-scratch"]
    assert train_main(args) == 0, capsys.readouterr().err
    std = json.loads((tmp_path / "std" / "data" / "meta.json").read_text())
    assert std["dtype"] == "uint32" and std["tokenizer_origin"] == str(model / "tokenizer.json")


def test_seq_defaults_to_the_context_and_the_first_line_prints_every_setting(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=400, n_positions=32)
    gpt2_weights.save_hf(tmp_path / "gpt2", config, gpt2_weights.random_weights(config, seed=0))
    (tmp_path / "text.txt").write_text(TEXT)
    data.prepare([tmp_path / "text.txt"], tmp_path / "data", vocab_size=400)
    assert Trainer(config, tmp_path / "data", tmp_path / "r", steps=1, quiet=True).config.seq == 32
    assert train_main(["--model", str(tmp_path / "gpt2"), "--data", str(tmp_path / "data"), "--steps", "2",
                       "--batch=2", "--out", str(tmp_path / "run"), "--prefer", "cpu", "--from-scratch"]) == 0
    err = capsys.readouterr().err
    first = next(line for line in err.splitlines() if line.startswith("train: "))
    assert "seq 32 (default)" in first and "batch 2," in first and "steps 2," in first
    assert "lr 0.0003 (default)" in first and "warmup 0 (default)" in first and "(nanogpt)" in first


def test_cli_chat_run_reports_the_data_and_ends_with_validation_perplexity(
        bpe: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = _llama_dir(tmp_path / "model", 512, bpe / "tokenizer.json", seq=128)
    chat = _write_jsonl(tmp_path / "chat.jsonl", _chats(20))
    args = ["--model", str(model), "--data", str(chat), "--steps", "2", "--out", str(tmp_path / "run"),
            "--val-examples", "1", "--lora", "r=4,alpha=8,targets=q,v", "--prefer", "cpu", "--from-scratch"]
    assert train_main(args) == 0
    captured = capsys.readouterr()
    first = next(line for line in captured.err.splitlines() if line.startswith("train: "))
    assert "seq 128 (default)" in first and "train-on-prompt False (default)" in first
    assert first.endswith("val-examples 1") and "lora r=4,alpha=8,targets=q,v," in first and "(examples)" in first
    assert "data train: 18 examples (messages)" in captured.err and "data val: 1 examples" in captured.err
    summary = captured.out.splitlines()[0]
    val = [r["val_loss"] for r in map(json.loads, (tmp_path / "run" / "train.jsonl").read_text().splitlines())
           if r.get("event") == "eval"][-1]
    trained = int((np.asarray(data.open_data(chat, vocab_size=512, model_dir=model, seq=128, val_examples=1)
                              .val.windows(np.array([0]), 128)[1]) >= 0).sum())
    assert f"validation loss {val:.4f} perplexity {math.exp(val):.2f} over {trained} trained tokens" in summary
    with pytest.raises(SystemExit):
        train_main([*args, "--max-examples", "0"])
    assert "--max-examples: 0 is below 1" in capsys.readouterr().err
