"""orion.train.Trainer on tiny GPT-2 and Llama models (the layer programs on the emulator in fp16, prefer="ane"):

- 200 steps on a learnable token file: the mean loss of the last 10 steps is below 10% of the first 10's
  (measured: ~4.2 -> ~0.01-0.05), 0 NaN, 0 skipped steps after warmup, and no compile after the first
  step (``orion.compile_count()`` recorded per step), while every update changes the outputs.
- Resume: a run cut back to its step-20 checkpoint and resumed ends bit-identical to the uninterrupted run
  (weights, AdamW moments, loss scale, and the loss log); compilation waits until the checkpoint is loaded.
- 50 steps against PyTorch fp32 training of transformers' model from the same initial weights, on the same
  batches, AdamW (0.9, 0.95, decay on matrices), the same warmup+cosine rates and clipping: every step's
  loss within 0.2% relative plus 1e-3 absolute (fp16 programs against fp32; measured: at most 2.6e-4
  relative, 1.6e-4 absolute, for both, over a curve falling from ~4.2 to ~0.2-0.3).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import orion
from orion.models.gpt2 import weights as gpt2_weights
from orion.models.gpt2.config import GPT2Config
from orion.models.llama import weights as llama_weights
from orion.models.llama.config import LlamaConfig
from orion.train import checkpoint
from orion.train.cli import main as cli_main
from orion.train.data import BatchSampler
from orion.train.errors import CheckpointError, TrainError
from orion.train.schedule import WarmupCosine
from orion.train.trainer import Trainer, read_log
from support import references
from support.token_files import periodic_tokens

VOCAB, SEQ = 64, 32
CONFIGS = {
    "gpt2": GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=VOCAB, n_positions=SEQ),
    "llama": LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=VOCAB,
                         max_position_embeddings=SEQ),
}
TIMING = ("ms", "tokens_per_s")


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A nanoGPT directory holding a periodic stream (period 23) of random tokens: learnable, so loss must fall."""
    return periodic_tokens(tmp_path_factory.mktemp("tokens"), VOCAB)


def _trainer(kind: str, tokens: Path, out: Path, **options) -> Trainer:
    settings = {"steps": 200, "seq": SEQ, "lr": 3e-3, "eval_every": 50, "checkpoint_every": 50, "quiet": True,
                "prefer": "ane", **options}
    return Trainer(CONFIGS[kind], tokens, out, **settings)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_loss_falls_with_no_nan_no_skip_and_no_compile_after_the_first_step(kind: str, tokens: Path,
                                                                           tmp_path: Path) -> None:
    trainer = _trainer(kind, tokens, tmp_path)
    assert trainer.plan is None and trainer.runner is None  # nothing planned or compiled before train()
    records = trainer.train()
    assert [r["step"] for r in records] == list(range(1, 201))
    losses = [r["loss"] for r in records]
    assert all(r["loss"] is not None and np.isfinite(r["loss"]) for r in records)
    assert not any(r["skipped"] for r in records[trainer.config.warmup_steps:])
    assert np.mean(losses[-10:]) < 0.1 * np.mean(losses[:10]), losses
    assert len({r["compiles"] for r in records}) == 1  # all programs compiled before step 1 ended
    assert records[0]["compiles"] >= 1 and any(p.device == "ane" for p in trainer.plan.programs)
    assert len(set(losses)) == len(losses)  # every update changed the programs' outputs ...
    vals = [r["val_loss"] for r in read_log(trainer.log_path) if r.get("event") == "eval"]
    assert len(vals) == 4 and vals == sorted(vals, reverse=True)  # ... on the fixed validation windows too
    assert all(r["grad_norm"] > 0 and r["lr"] > 0 and r["clamps"] == 0 for r in records)


def test_resume_from_a_checkpoint_is_bit_identical_and_compiles_after_loading(tokens: Path, tmp_path: Path) -> None:
    options = {"steps": 40, "batch": 2, "accum": 2, "checkpoint_every": 10, "keep": 10}
    whole = _trainer("gpt2", tokens, tmp_path / "whole", **options)
    want = whole.train()
    cut = _trainer("gpt2", tokens, tmp_path / "cut", **options)
    cut.train()
    for manifest in checkpoint.checkpoints(cut.checkpoint_dir)[2:]:  # back to step 20, as if killed at 20..29
        manifest.unlink()
    before = orion.compile_count()
    resumed = _trainer("gpt2", tokens, tmp_path / "cut", resume=True, **options)
    resumed._start()  # loads the checkpoint: no program is compiled yet
    assert resumed.step == 20 and orion.compile_count() == before and resumed.runner is None
    got = resumed.train()
    assert resumed.runner is not None  # built (compiled, or taken from this process's program cache) in train()
    strip = [{k: v for k, v in r.items() if k not in TIMING and k != "compiles"} for r in got]
    assert strip == [{k: v for k, v in r.items() if k not in TIMING and k != "compiles"} for r in want]
    for name, p in whole.params.items():
        assert np.array_equal(p, resumed.params[name]), name
        assert np.array_equal(whole.optimizer.exp_avg_sq[name], resumed.optimizer.exp_avg_sq[name]), name
    assert resumed.sampler.state_dict() == whole.sampler.state_dict()
    assert resumed.scaler == whole.scaler


def test_resume_skips_a_damaged_checkpoint_with_a_note_and_refuses_another_config(tokens: Path,
                                                                                  tmp_path: Path) -> None:
    _trainer("gpt2", tokens, tmp_path, steps=20, checkpoint_every=10).train()
    newest = checkpoint.checkpoints(tmp_path / "checkpoints")[-1].with_suffix(".safetensors")
    newest.write_bytes(newest.read_bytes()[:-8])  # truncated
    resumed = _trainer("gpt2", tokens, tmp_path, steps=20, checkpoint_every=10, resume=True)
    resumed.train()
    notes = [r for r in read_log(resumed.log_path) if r.get("event") == "note"]
    assert resumed.resumed_from.name == "ckpt-00000010.json" and "damaged" in notes[0]["message"]
    with pytest.raises(CheckpointError, match="config hash"):
        _trainer("gpt2", tokens, tmp_path, steps=20, lr=1e-3, resume=True).train()
    with pytest.raises(TrainError, match="already holds checkpoints"):
        _trainer("gpt2", tokens, tmp_path, steps=20).train()


def test_bad_settings_are_refused(tokens: Path, tmp_path: Path) -> None:
    with pytest.raises(TrainError, match=r"weights='baked'. Fix: use one of \('inputs', 'patch', 'recompile'\)"):
        _trainer("gpt2", tokens, tmp_path, weights="baked")
    with pytest.raises(TrainError, match="only TrainConfig fields"):
        _trainer("gpt2", tokens, tmp_path, learning_rate=1.0)
    with pytest.raises(TrainError, match="exceeds the model's context"):
        _trainer("gpt2", tokens, tmp_path, seq=SEQ * 2)
    small = GPT2Config(n_layer=1, n_head=2, n_embd=64, vocab_size=16, n_positions=SEQ)
    with pytest.raises(orion.OrionError, match="outside the vocabulary"):
        Trainer(small, tokens, tmp_path, steps=10, seq=SEQ)


def _torch_losses(kind: str, trainer: Trainer, tmp_path: Path) -> list[float]:
    """PyTorch fp32 training of transformers' model from the trainer's initial weights on its batches."""
    torch, transformers = references.require("torch", "transformers")
    cfg = trainer.config
    module = gpt2_weights if kind == "gpt2" else llama_weights
    module.save_hf(tmp_path / "hf", trainer.model.config, trainer.model.weights(trainer.params))
    torch.set_num_threads(2)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32,
                                                           attn_implementation="eager")
    decay = [p for p in hf.parameters() if p.ndim >= 2]
    rest = [p for p in hf.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)
    rates = WarmupCosine(cfg.lr, cfg.warmup_steps, cfg.steps, cfg.lr / 10)
    sampler = BatchSampler(trainer.data.train, cfg.seq, cfg.batch, cfg.seed)  # a second sampler, same seed
    losses = []
    for step in range(cfg.steps):
        optimizer.zero_grad()
        windows = [b for _ in range(cfg.accum) for b in zip(*sampler.next_batch(), strict=True)]
        loss = sum(torch.nn.functional.cross_entropy(hf(torch.tensor(ids)[None]).logits[0], torch.tensor(targets))
                   for ids, targets in windows) / len(windows)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), cfg.max_grad_norm)
        for group in optimizer.param_groups:
            group["lr"] = rates.lr_at(step)
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kind,batch,accum", [("gpt2", 2, 1), ("llama", 1, 2)])
def test_fifty_steps_follow_pytorch_fp32_adamw(kind: str, batch: int, accum: int, tokens: Path,
                                               tmp_path: Path) -> None:
    trainer = _trainer(kind, tokens, tmp_path / "run", steps=50, batch=batch, accum=accum)
    want = _torch_losses(kind, trainer, tmp_path)
    got = [r["loss"] for r in trainer.train()]
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-3)
    assert want[-1] < 0.5 * want[0]  # the comparison covers a falling curve, not a flat one


def test_cli_trains_on_the_stdlib_corpus_resumes_and_logs_the_missing_plot(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    args = ["--model", "tiny-gpt2", "--data", "stdlib", "--data-bytes", "200000", "--steps", "12", "--seq", "32",
            "--out", str(out), "--checkpoint-every", "6", "--eval-every", "6", "--eval-batches", "2", "--quiet"]
    assert cli_main(args) == 0
    meta = json.loads((out / "data" / "meta.json").read_text())
    assert meta["vocab_size"] <= 512 and "corpus" in meta
    records = read_log(out / "train.jsonl")
    assert [r["step"] for r in records if r["event"] == "step"] == list(range(1, 13))
    plot = [r for r in records if r["event"] == "plot"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert plot == [{"step": 12, "event": "plot", "written": False,
                         "reason": "matplotlib is not installed (pip install 'orion-ane[plot]')"}]
        assert "no loss-curve figure written" in capsys.readouterr().err
    else:
        assert plot[0]["written"] and (out / "loss.png").stat().st_size > 0
    assert cli_main([*args, "--resume"]) == 0  # already at 12 steps: nothing more to train
    assert len([r for r in read_log(out / "train.jsonl") if r["event"] == "step"]) == 12
    assert cli_main([*args[:-1], "--steps", "13"]) == 1  # another config over the same checkpoints
    assert "already holds checkpoints" in capsys.readouterr().err


def test_python_m_entry_point_reports_bad_arguments(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "orion.train.cli", "--model", "tiny-gpt2", "--data",
                             str(tmp_path / "nothing"), "--steps", "3", "--out", str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stderr.startswith("error: ") and "does not exist" in result.stderr


def _cli_command(tokens: Path, out: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "orion.train.cli", "--model", "tiny-gpt2", "--data", str(tokens), "--steps",
            str(steps), "--seq", str(SEQ), "--lr", "3e-3", "--checkpoint-every", "5", "--keep", "2", "--eval-every",
            "1000", "--eval-batches", "1", "--out", str(out), "--quiet"]


def _steps_logged(out: Path) -> list[dict]:
    return [r for r in read_log(out / "train.jsonl") if r.get("event") == "step"]


def test_kill_minus_nine_at_random_moments_loses_at_most_the_steps_since_the_last_checkpoint(
        tokens: Path, tmp_path: Path) -> None:
    steps, rng = 30, np.random.default_rng(7)
    reference = tmp_path / "uninterrupted"
    subprocess.run(_cli_command(tokens, reference, steps), check=True, timeout=300, capture_output=True)
    out, kills = tmp_path / "killed", 0
    command = _cli_command(tokens, out, steps)
    while True:
        logged_before = len(_steps_logged(out))
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        target = logged_before + int(rng.integers(2, 10))  # kill once this many steps are logged
        while process.poll() is None and len(_steps_logged(out)) < target:
            time.sleep(0.005)
        if process.poll() is not None:
            assert process.returncode == 0, process.stderr.read().decode()
            break
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        kills += 1
        manifests = checkpoint.checkpoints(out / "checkpoints")
        for manifest in manifests:
            checkpoint.verify(manifest)  # never corrupt: every manifest present verifies
        logged = len(_steps_logged(out))
        newest = checkpoint.load(manifests[-1]).step if manifests else 0
        assert logged - newest < 5 + 1  # lost at most the steps since the last checkpoint (every 5)
        command = [*command, "--resume"] if "--resume" not in command else command
    assert kills >= 2
    strip = [{k: v for k, v in r.items() if k not in (*TIMING, "compiles")} for r in _steps_logged(out)]
    assert strip == [{k: v for k, v in r.items() if k not in (*TIMING, "compiles")} for r in
                     _steps_logged(reference)]
    final, want = (checkpoint.load(checkpoint.checkpoints(d / "checkpoints")[-1]) for d in (out, reference))
    assert final.step == want.step == steps
    assert not [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".tmp")]  # no stale temporaries
    for name, array in want.tensors.items():
        assert np.array_equal(final.tensors[name], array), name


RESTARTING = """
import sys
from orion.compiler import compile_graph
from orion.graph.builder import Graph
from orion.train.cli import main
if "--resume" not in sys.argv:  # the first incarnation has used most of its compile budget elsewhere
    for i in range(9):
        g = Graph(f"filler{i}")
        g.output(g.gelu(g.input("x", [1, 16 * (i + 1), 1, 64]), name="act"), "y")
        compile_graph(g)
sys.exit(main(sys.argv[1:]))
"""


def test_a_run_that_would_cross_the_compile_budget_checkpoints_execs_itself_and_resumes(tokens: Path,
                                                                                       tmp_path: Path) -> None:
    env = {**os.environ, "ORION_COMPILE_BUDGET": "12"}  # threshold 10: 9 filler compiles + 2 programs cross it
    script = tmp_path / "restarting.py"
    script.write_text(RESTARTING)
    args = [*_cli_command(tokens, tmp_path / "run", 12)[3:], "--prefer", "ane"]
    subprocess.run([sys.executable, str(script), *args], check=True, timeout=300, capture_output=True, env=env)
    reference = [a if a != str(tmp_path / "run") else str(tmp_path / "reference") for a in args]
    subprocess.run([sys.executable, "-m", "orion.train.cli", *reference], check=True, timeout=300,
                   capture_output=True, env=env)
    events = [(r["event"], r["step"]) for r in read_log(tmp_path / "run" / "train.jsonl")]
    assert events[:3] == [("checkpoint", 0), ("resume", 0), ("step", 1)]  # restarted before compiling
    final, want = (checkpoint.load(checkpoint.checkpoints(d / "checkpoints")[-1]) for d in
                   (tmp_path / "run", tmp_path / "reference"))
    assert final.step == want.step == 12
    for name, array in want.tensors.items():
        assert np.array_equal(final.tensors[name], array), name


def test_crossing_the_compile_budget_without_exec_restart_is_refused(tokens: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from orion.train import trainer as trainer_module

    monkeypatch.setattr(trainer_module.restart, "needs_restart", lambda programs: True)
    monkeypatch.setattr(trainer_module, "compile_count", lambda: 95)
    with pytest.raises(TrainError, match="pass exec_restart=True"):
        _trainer("gpt2", tokens, tmp_path / "a", steps=5).train()
    monkeypatch.setattr(trainer_module, "compile_count", lambda: 0)
    with pytest.raises(TrainError, match="even in a fresh process. Fix: raise ORION_COMPILE_BUDGET"):
        _trainer("gpt2", tokens, tmp_path / "b", steps=5, exec_restart=True).train()
