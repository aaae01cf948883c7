"""Checkpoints: round trip, damage detection (truncation, bit flips, missing files, config hash), keep-last-K,
and kill -9 at random moments of a writer loop never leaving a checkpoint that is taken as valid but is not."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from orion.train import checkpoint
from orion.train.errors import CheckpointError

CONFIG = checkpoint.config_hash({"model": "tiny", "dim": 64, "lr": 3e-4})


def _tensors(step: int, n: int = 1000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    return {"param.w": rng.standard_normal((n // 10, 10), dtype=np.float32),
            "adam_m.w": rng.standard_normal((n // 10, 10), dtype=np.float32),
            "adam_v.w": rng.random((n // 10, 10), dtype=np.float32)}


def _state(step: int) -> dict:
    return {"schedule": {"kind": "constant", "lr": 3e-4, "position": step},
            "sampler": {"seed": 1, "rng": {"state": 2**100 + step, "inc": 7}}, "accumulation_phase": step % 4,
            "loss_scale": {"kind": "static", "scale": 256.0, "skipped_steps": 0}}


def _save(directory: Path, step: int, keep: int = 3) -> Path:
    return checkpoint.save(directory, step, _tensors(step), _state(step), CONFIG, keep=keep)


def test_round_trip_and_keep_last(tmp_path: Path) -> None:
    paths = [_save(tmp_path, step) for step in (10, 20, 30, 40)]
    assert checkpoint.checkpoints(tmp_path) == paths[1:]  # keep=3: step 10 pruned
    assert not (tmp_path / "ckpt-00000010.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        n for s in (20, 30, 40) for n in (f"ckpt-{s:08d}.json", f"ckpt-{s:08d}.safetensors"))  # no temporaries
    loaded = checkpoint.load(paths[-1], CONFIG)
    assert loaded.step == 40 and loaded.config_hash == CONFIG and loaded.state == _state(40)
    assert loaded.state["sampler"]["rng"]["state"] == 2**100 + 40  # big RNG integers survive exactly
    for name, array in _tensors(40).items():
        np.testing.assert_array_equal(loaded.tensors[name], array)
        assert loaded.tensors[name].dtype == np.float32
    manifest = json.loads(paths[-1].read_text())
    assert manifest["files"]["ckpt-00000040.safetensors"]["sha256"] == checkpoint._sha256(
        tmp_path / "ckpt-00000040.safetensors")
    assert checkpoint.latest_valid(tmp_path) == paths[-1]
    assert checkpoint.latest_valid(tmp_path / "absent") is None


def test_resaving_a_step_replaces_it(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 3, _tensors(3), _state(3), CONFIG)
    path = checkpoint.save(tmp_path, 3, _tensors(4), {"again": True}, CONFIG)
    loaded = checkpoint.load(path)
    assert loaded.state == {"again": True}
    np.testing.assert_array_equal(loaded.tensors["param.w"], _tensors(4)["param.w"])
    assert checkpoint.checkpoints(tmp_path) == [path]


def test_config_hash_is_canonical() -> None:
    assert checkpoint.config_hash({"a": 1, "b": [1, 2]}) == checkpoint.config_hash({"b": [1, 2], "a": 1})
    assert checkpoint.config_hash({"a": 1}) != checkpoint.config_hash({"a": 2})


def _truncate(p: Path) -> None:
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _flip_bit(offset_from_end: int):
    def flip(p: Path) -> None:
        data = bytearray(p.read_bytes())
        data[len(data) - offset_from_end] ^= 0x10
        p.write_bytes(bytes(data))
    return flip


@pytest.mark.parametrize(
    ("target", "damage", "reason"),
    [
        ("safetensors", _truncate, "bytes, the manifest recorded"),
        ("safetensors", _flip_bit(100), "does not match its SHA-256"),  # a bit inside the tensor data
        ("safetensors", lambda p: p.unlink(), "is missing"),
        ("json", _flip_bit(40), "manifest"),  # a hex digit of a checksum, or JSON syntax
        ("json", lambda p: p.write_text(p.read_text().replace('"accumulation_phase": 2', '"accumulation_phase": 3')),
         "does not match its own SHA-256"),  # a plausible edit of the state
        ("json", _truncate, "not readable JSON"),
    ],
)
def test_damaged_checkpoint_is_refused_and_the_previous_offered(tmp_path: Path, target, damage, reason) -> None:
    good = _save(tmp_path, 100)
    bad = _save(tmp_path, 102)  # accumulation_phase 102 % 4 = 2
    damage(bad.with_suffix(f".{target}"))
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(bad, CONFIG)
    message = str(err.value)
    assert reason in message and str(bad) in message
    assert f"the previous valid checkpoint is {good}" in message
    assert err.value.path == bad and err.value.previous == good
    assert checkpoint.latest_valid(tmp_path) == good
    assert checkpoint.load(good, CONFIG).step == 100


def test_missing_manifest_and_no_previous(tmp_path: Path) -> None:
    only = _save(tmp_path, 5)
    (tmp_path / "ckpt-00000005.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no older valid checkpoint is left") as err:
        checkpoint.load(only)
    assert err.value.previous is None
    assert checkpoint.latest_valid(tmp_path) is None
    with pytest.raises(CheckpointError, match="manifest .*ckpt-00000009.json is missing"):
        checkpoint.load(tmp_path / "ckpt-00000009.json")


def test_wrong_config_hash_is_refused(tmp_path: Path) -> None:
    path = _save(tmp_path, 7)
    other = checkpoint.config_hash({"model": "tiny", "dim": 128})
    with pytest.raises(CheckpointError, match=f"config hash {CONFIG}, this run's config hashes to {other}"):
        checkpoint.load(path, other)
    assert checkpoint.latest_valid(tmp_path, other) is None
    assert checkpoint.latest_valid(tmp_path, CONFIG) == path


def test_bad_state_and_keep_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not JSON-serializable"):
        checkpoint.save(tmp_path, 1, _tensors(1), {"x": np.zeros(2)}, CONFIG)
    with pytest.raises(CheckpointError, match="not JSON-serializable"):
        checkpoint.save(tmp_path, 1, _tensors(1), {"loss": float("nan")}, CONFIG)
    with pytest.raises(CheckpointError, match="keep=0"):
        checkpoint.save(tmp_path, 1, _tensors(1), {}, CONFIG, keep=0)
    with pytest.raises(CheckpointError, match="cannot write"):
        checkpoint.save(tmp_path, 1, {"x": np.zeros((2, 2), np.float32)[:, :1].T.astype(object)}, {}, CONFIG)
    assert checkpoint.checkpoints(tmp_path) == []  # nothing half-written is taken as a checkpoint
    assert [p for p in tmp_path.iterdir()] == []


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from test_checkpoint import CONFIG, _save
    from orion.train import checkpoint
    directory = Path(sys.argv[1])
    latest = checkpoint.latest_valid(directory, CONFIG)
    step = checkpoint.load(latest, CONFIG).step + 1 if latest else 0
    print("ready", flush=True)
    while True:
        _save(directory, step, keep=3)
        step += 1
""")


def test_kill_9_at_random_moments_never_leaves_a_bad_checkpoint(tmp_path: Path) -> None:
    directory = tmp_path / "ckpts"
    rng = random.Random(1234)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    latest_steps, kills_mid_write = [], 0
    for _ in range(8):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(directory), str(Path(__file__).parent)],
                                  stdout=subprocess.PIPE, env=env)
        assert writer.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.05, 0.5))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        manifests = checkpoint.checkpoints(directory)
        temporaries = [p for p in directory.iterdir() if p.name.startswith(".tmp-")]
        orphans = {p.stem for p in directory.glob("*.safetensors")} - {m.stem for m in manifests}
        kills_mid_write += bool(temporaries or orphans)
        assert 1 <= len(manifests) <= 4  # keep=3, plus one written just before its pruning
        for manifest in manifests:  # every checkpoint that exists verifies and holds what was written
            loaded = checkpoint.load(manifest, CONFIG)
            assert loaded.state == _state(loaded.step)
            for name, array in _tensors(loaded.step).items():
                np.testing.assert_array_equal(loaded.tensors[name], array)
        latest = checkpoint.latest_valid(directory, CONFIG)
        assert latest == manifests[-1]
        latest_steps.append(checkpoint.load(latest).step)
    assert latest_steps == sorted(latest_steps) and latest_steps[-1] >= 8  # resumed each time, never lost ground
    assert kills_mid_write >= 1  # some kills did land inside a save (a partial checkpoint was left on disk)
