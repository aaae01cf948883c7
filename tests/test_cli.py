"""The command line: python -m orion {demo, constraints, generate} and python -m orion.bench decode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.gpt2_fixtures import lively_weights
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import orion
from orion.models import GPT2Config
from orion.models.gpt2.weights import save_hf

CONFIG = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=128)


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "ORION_CACHE_DIR": "off"}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A small GPT-2 directory in the Hugging Face layout, with a byte-level BPE tokenizer.json."""
    directory = tmp_path_factory.mktemp("gpt2")
    save_hf(directory, CONFIG, lively_weights(CONFIG, seed=1))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the neural engine runs the model", "hello world, hello engine"], trainer)
    tok.save(str(directory / "tokenizer.json"))
    return directory


def test_bench_decode_json(model_dir) -> None:
    out = run("orion.bench", "decode", "--model", str(model_dir), "--prompt-tokens", "5", "--new-tokens", "8", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["backend"] == orion.backend() and result["decode_tok_s"] > 0
    layer_programs = -(-CONFIG.n_layer // result["fusion_depth"])
    assert result["dispatches_per_token"] == layer_programs + 1  # plus one LM-head chunk
    assert "compiled decode" in out.stderr  # progress while compiling


def test_bench_decode_report(model_dir) -> None:
    out = run("orion.bench", "decode", "--model", str(model_dir), "--prompt-tokens", "3", "--new-tokens", "4")
    assert out.returncode == 0, out.stderr
    for field in ("backend", "compile", "prefill", "decode", "dispatches/token", "bytes/token", "p90"):
        assert field in out.stdout


def test_generate_streams_text(model_dir) -> None:
    out = run("orion", "generate", "--model", str(model_dir), "--prompt", "hello world", "--max-new-tokens", "6")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("hello world") and len(out.stdout.strip()) > len("hello world")


def test_generate_stops_at_zero_new_tokens(model_dir) -> None:
    out = run("orion", "generate", "--model", str(model_dir), "--prompt", "hello", "--max-new-tokens", "0")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "hello\n"


def test_generate_without_tokenizer_explains(tmp_path) -> None:
    save_hf(tmp_path, CONFIG, lively_weights(CONFIG, seed=1))
    out = run("orion", "generate", "--model", str(tmp_path), "--prompt", "hi")
    assert out.returncode == 1 and "tokenizer.json" in out.stderr


def test_constraints_table_lists_every_id() -> None:
    from orion import constraints

    out = run("orion", "constraints")
    assert out.returncode == 0
    assert all(c.id in out.stdout for c in constraints.CATALOG)


def test_demo_runs_and_checks_itself() -> None:
    out = run("orion", "demo", "--iterations", "2")
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout and "GFLOP/s" in out.stdout


@pytest.mark.parametrize("args, status, message", [
    (("orion", "generate", "--model", "{missing}", "--prompt", "hi"), 1, "no such directory"),
    (("orion", "generate", "--model", "{dir}", "--prompt", "hi", "--temperature", "-1"), 1, "temperature=-1"),
    (("orion", "generate", "--model", "{dir}", "--prompt", "hi", "--max-new-tokens", "-2"), 2, "-2 is below 0"),
    (("orion", "generate", "--model", "{unknown}", "--prompt", "hi"), 1, "model_type 'mamba'"),
    (("orion", "demo", "--iterations", "0"), 2, "0 is below 1"),
    (("orion", "demo", "--lanes", "7", "--iterations", "1"), 1, "ANE-14"),
    (("orion.bench", "decode", "--model", "{dir}", "--prompt-tokens", "0"), 2, "0 is below 1"),
    (("orion.bench", "decode", "--model", "{dir}", "--prompt-tokens", "100", "--new-tokens", "100"), 1,
     "exceed the model's context length 128"),
    (("orion.bench", "decode", "--model", "{unknown}"), 1, "model_type 'mamba'"),
    (("orion.bench", "decode", "--random", "nope"), 2, "invalid choice: 'nope'"),
])
def test_bad_command_lines_explain_without_a_traceback(model_dir, tmp_path, args, status, message) -> None:
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    paths = {"missing": str(tmp_path / "missing"), "dir": str(model_dir), "unknown": str(unknown)}
    out = run(*(a.format(**paths) for a in args))
    assert (out.returncode, "Traceback" in out.stderr) == (status, False), out.stderr
    assert message in out.stderr


def test_doctor_reports_an_unusable_cache_dir_and_an_unwritable_report(tmp_path) -> None:
    file = tmp_path / "plain"
    file.write_text("")
    env = {**os.environ, "ORION_CACHE_DIR": str(file)}
    out = subprocess.run([sys.executable, "-m", "orion", "doctor"], capture_output=True, text=True, timeout=300,
                         env=env, check=False)
    assert out.returncode == 0 and "Traceback" not in out.stderr
    assert "unusable: ORION_CACHE_DIR=" in out.stdout and "models:" in out.stdout and "gpt2" in out.stdout
    out = run("orion", "doctor", "--probe", "--out", str(tmp_path / "missing" / "report.json"))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "cannot write the probe report" in out.stderr
