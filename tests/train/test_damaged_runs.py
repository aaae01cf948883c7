"""``train --resume`` on damaged run directories: every damage is an Orion error naming the file (and,
for a checkpoint, offering the previous one, which resume then takes with a note), never a traceback
of RecursionError, UnicodeDecodeError, KeyError, TypeError, FileExistsError or IsADirectoryError."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from orion.models import GPT2Config
from orion.train.errors import CheckpointError, TrainError
from orion.train.trainer import Trainer, read_log
from support.token_files import periodic_tokens

VOCAB, SEQ = 64, 32
CONFIG = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=SEQ)
SETTINGS = {"seq": SEQ, "lr": 3e-3, "eval_every": 1, "checkpoint_every": 1, "keep": 3, "quiet": True}


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return periodic_tokens(tmp_path_factory.mktemp("tokens"), VOCAB)


@pytest.fixture(scope="module")
def run(tokens: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 2 steps with checkpoints at steps 1 and 2."""
    out = tmp_path_factory.mktemp("run") / "run"
    Trainer(CONFIG, tokens, out, steps=2, **SETTINGS).train()
    return out


@pytest.fixture
def damaged(run: Path, tmp_path: Path) -> Path:
    """A copy of the run to damage."""
    return Path(shutil.copytree(run, tmp_path / "run"))


def resume(tokens: Path, out: Path, steps: int = 2) -> Trainer:
    trainer = Trainer(CONFIG, tokens, out, steps=steps, resume=True, **SETTINGS)
    trainer.train()
    return trainer


def manifest(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"ckpt-{step:08d}.json"


def restamp(path: Path, **changes: object) -> None:
    """Rewrites a manifest with ``changes``, its own SHA-256 recomputed: damage no checksum catches."""
    body = json.loads(path.read_text())
    body.pop("manifest_sha256")
    body.update(changes)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    path.write_text(json.dumps({**body, "manifest_sha256": hashlib.sha256(canonical).hexdigest()}))


def notes(out: Path) -> list[str]:
    return [r["message"] for r in read_log(out / "train.jsonl") if r.get("event") == "note"]


@pytest.mark.parametrize("damage", ["nested", "state {}", "state []", "state null", "state of strings",
                                    "a directory", "tensors a directory"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tokens, damaged, damage) -> None:
    newest = manifest(damaged, 2)
    if damage == "nested":
        newest.write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "a directory":
        newest.unlink()
        newest.mkdir()
    elif damage == "tensors a directory":
        newest.with_suffix(".safetensors").unlink()
        newest.with_suffix(".safetensors").mkdir()
    else:
        state = {"state {}": {}, "state []": [], "state null": None,
                 "state of strings": {k: "x" for k in json.loads(newest.read_text())["state"]}}[damage]
        restamp(newest, state=state)
    if damage in ("a directory", "tensors a directory"):  # resumed at 1, step 2 cannot be written back
        with pytest.raises(CheckpointError, match=r"ckpt-00000002"):
            resume(tokens, damaged)
        trainer = Trainer(CONFIG, tokens, damaged, steps=2, resume=True, **SETTINGS)
        trainer._start()
    else:
        trainer = resume(tokens, damaged)
    assert trainer.resumed_from == manifest(damaged, 1)
    assert any("ckpt-00000002.json is damaged" in n and "ckpt-00000001.json" in n for n in notes(damaged))


def test_a_damaged_only_checkpoint_is_an_error_naming_it(tokens, damaged) -> None:
    manifest(damaged, 1).unlink()
    manifest(damaged, 1).with_suffix(".safetensors").unlink()
    restamp(manifest(damaged, 2), state={})
    with pytest.raises(CheckpointError, match=r"ckpt-00000002.json is damaged: its training state cannot be "
                                              r"restored .*no older valid checkpoint is left"):
        resume(tokens, damaged)


@pytest.mark.parametrize(("line", "says"), [(b"\xff\xfe{}", "UnicodeDecodeError"),
                                            (b"[" * 100_000 + b"]" * 100_000, "RecursionError"),
                                            (b'{"event": "step", "step": 1}', "'loss'"),
                                            (b'{"step": "one"}', "'step'"), (b"[1, 2]", "JSON object")],
                         ids=["0xff", "nested", "step without loss", "step a string", "a list"])
def test_a_damaged_log_line_is_an_error_naming_the_line(tokens, damaged, line, says) -> None:
    log = damaged / "train.jsonl"
    lines = log.read_bytes().splitlines()
    log.write_bytes(b"\n".join([lines[0], line, *lines[1:]]) + b"\n")
    with pytest.raises(TrainError, match=rf"train.jsonl is damaged at line 2: .*{says}"):
        resume(tokens, damaged)
    log.write_bytes(b"\n".join([*lines, line]) + b"\n")  # as the last line it is a torn write: dropped
    resume(tokens, damaged)


def test_checkpoints_that_is_a_file_and_a_log_that_is_a_directory(tokens, damaged) -> None:
    shutil.rmtree(damaged / "checkpoints")
    (damaged / "checkpoints").write_text("not a directory")
    with pytest.raises(CheckpointError, match=r"checkpoints should be the directory of the run's checkpoints"):
        resume(tokens, damaged)
    (damaged / "checkpoints").unlink()
    (damaged / "train.jsonl").unlink()
    (damaged / "train.jsonl").mkdir()
    with pytest.raises(TrainError, match=r"train.jsonl"):
        resume(tokens, damaged)
