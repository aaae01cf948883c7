"""The trainer's weight strategies on tiny GPT-2 and Llama models (layer programs on the emulator, prefer="ane"):

- "patch" and "recompile" reach the weights of "inputs" after 5 AdamW steps within fp16 rounding: every
  parameter within 2% of the largest change any step made to that tensor, plus 1e-6 (measured: identical on the
  emulator, which accumulates the baked conv and the runtime matmul alike); with "patch" the compile count does
  not move across steps, with "recompile" it moves by layers x programs per step;
- the restart test: ``python -m orion train --weights recompile`` for N steps uninterrupted, and the same N steps
  with an ORION_COMPILE_BUDGET small enough that the run checkpoints and exec-restarts itself every 2 steps: the
  final weights, AdamW moments and the loss log (step and validation records) are identical bit for bit (with
  checkpoints every 2 steps too: the restart then reuses the step's checkpoint instead of writing it again).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orion.models.gpt2.config import GPT2Config
from orion.models.llama.config import LlamaConfig
from orion.train import checkpoint
from orion.train.trainer import Trainer, read_log
from support.token_files import periodic_tokens

VOCAB, SEQ, STEPS = 64, 32, 5
CONFIGS = {
    "gpt2": GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=VOCAB, n_positions=SEQ),
    "llama": LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=VOCAB,
                         max_position_embeddings=SEQ),
}
VOLATILE = ("ms", "tokens_per_s", "compiles")


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return periodic_tokens(tmp_path_factory.mktemp("tokens"), VOCAB, repeats=200)


def _run(kind: str, weights: str, tokens: Path, out: Path) -> tuple[Trainer, list[dict]]:
    trainer = Trainer(CONFIGS[kind], tokens, out, steps=STEPS, seq=SEQ, lr=3e-3, warmup=1, eval_every=100,
                      eval_batches=1, checkpoint_every=100, quiet=True, prefer="ane", weights=weights)
    return trainer, trainer.train()


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_patch_and_recompile_reach_the_weights_of_inputs(kind: str, tokens: Path, tmp_path: Path) -> None:
    initial = Trainer(CONFIGS[kind], tokens, tmp_path / "init", steps=STEPS, seq=SEQ, quiet=True).params
    inputs, _ = _run(kind, "inputs", tokens, tmp_path / "inputs")
    for weights in ("patch", "recompile"):
        trainer, records = _run(kind, weights, tokens, tmp_path / weights)
        compiles = [r["compiles"] for r in records]
        per_step = trainer.runner.compiles_per_update
        if weights == "patch":
            assert per_step == 0 and len(set(compiles)) == 1, compiles  # every update without a compile
        else:
            assert per_step == 2 * trainer.model.n_layers and np.all(np.diff(compiles) == per_step), compiles
        for name, want in inputs.params.items():
            moved = np.abs(want - initial[name]).max()
            assert np.abs(trainer.params[name] - want).max() <= 2e-2 * moved + 1e-6, (weights, name)
        assert [r["loss"] for r in records] == pytest.approx([r["loss"] for r in read_log(inputs.log_path)
                                                              if r.get("event") == "step"], rel=1e-3)


def _train_command(tokens: Path, out: Path, kind: str, steps: int, checkpoint_every: int) -> list[str]:
    return [sys.executable, "-m", "orion", "train", "--model", f"tiny-{kind}", "--data", str(tokens), "--steps",
            str(steps), "--seq", str(SEQ), "--lr", "3e-3", "--warmup", "1", "--weights", "recompile", "--prefer",
            "ane", "--eval-every", "3", "--eval-batches", "1", "--checkpoint-every", str(checkpoint_every),
            "--out", str(out), "--quiet"]


def _log(out: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in read_log(out / "train.jsonl")
            if r.get("event") in ("step", "eval")]


@pytest.mark.parametrize("kind,checkpoint_every", [("gpt2", 100), ("llama", 2)])
def test_recompile_with_an_exec_restart_every_two_steps_is_bit_identical(kind: str, checkpoint_every: int,
                                                                         tokens: Path, tmp_path: Path) -> None:
    steps = 6
    whole, restarted = tmp_path / "whole", tmp_path / "restarted"
    subprocess.run(_train_command(tokens, whole, kind, steps, checkpoint_every), check=True, timeout=300,
                   capture_output=True)
    # 2 layers x 2 programs = 4 compiles to build and 4 per update; a budget of 15 (threshold 12) fits the build
    # and 2 updates: each process trains 2 steps, then checkpoints and execs itself
    env = {**os.environ, "ORION_COMPILE_BUDGET": "15"}
    result = subprocess.run(_train_command(tokens, restarted, kind, steps, checkpoint_every), timeout=300,
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    events = read_log(restarted / "train.jsonl")
    assert [r["step"] for r in events if r["event"] == "resume"] == [2, 4]
    # one checkpoint per restart (a step checkpointed by the loop is not written again) and the final one
    assert [r["step"] for r in events if r["event"] == "checkpoint"] == [2, 4, 6]
    assert [r["compiles"] for r in read_log(restarted / "train.jsonl") if r["event"] == "step"] == [8, 12] * 3
    assert _log(restarted) == _log(whole) and len(_log(whole)) == steps + 2
    final, want = (checkpoint.load(checkpoint.checkpoints(d / "checkpoints")[-1]) for d in (restarted, whole))
    assert final.step == want.step == steps
    assert sorted(final.tensors) == sorted(want.tensors)
    for name, array in want.tensors.items():
        assert np.array_equal(final.tensors[name], array), name
