"""The ``resume`` fuzz target: ``train --resume`` on a run directory damaged as the fuzz input says.

Once per process a tiny GPT-2 run trains 4 steps (a checkpoint each step, its log), and the last
checkpoint is removed. Each input copies it
and applies 1 to 3 damages: a file's bytes replaced, spliced, truncated or bit-flipped; a manifest
rewritten with a fuzzed field and its checksum recomputed, or its tensors changed and re-hashed (so the
damage gets past the checksums into the trainer); a log line inserted; a file replaced by a directory, a directory by a file, a stray file
added or a file removed. Then the run resumes as the command line does (``Trainer(..., resume=True)``,
training to step 4, the summary of its log). It must finish or raise an ``OrionError``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from json_values import Draw, Pairs, dump, value

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the token fixtures

import orion  # noqa: E402

_RUN: dict = {}
STEPS = 4  # the run's length; its last checkpoint is removed, so resuming trains at least one step


def _settings() -> dict:
    return {"seq": 16, "lr": 3e-3, "eval_every": 1, "eval_batches": 1, "checkpoint_every": 1, "keep": 3,
            "quiet": True}


def base_run() -> dict:
    """The tokens, the model's config and a run directory at step 3 of 4, made once per process."""
    if not _RUN:
        from orion.models import GPT2Config
        from orion.train.trainer import Trainer
        from support.token_files import periodic_tokens

        root = Path(tempfile.mkdtemp(prefix="orion-fuzz-resume-"))
        config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
        (root / "tokens").mkdir()
        tokens = periodic_tokens(root / "tokens", 64)
        Trainer(config, tokens, root / "run", steps=STEPS, **_settings()).train()
        for last in (root / "run" / "checkpoints").glob(f"ckpt-{STEPS:08d}.*"):  # as if killed after step 3
            last.unlink()
        _RUN.update(root=root, config=config, tokens=tokens, run=root / "run", cases=0)
    return _RUN


def files_of(run: Path) -> list[Path]:
    return sorted(p for p in run.rglob("*") if p.is_file())


def restamp(doc: dict) -> str:
    """A manifest's text with its own SHA-256 recomputed (as checkpoint.save writes it), if it can be."""
    body = {k: v for k, v in doc.items() if k != "manifest_sha256"}
    try:
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    except (ValueError, TypeError, RecursionError):
        return dump(doc)
    return json.dumps({**body, "manifest_sha256": hashlib.sha256(canonical).hexdigest()})


def damage(d: Draw, run: Path) -> None:
    """One damage to the run directory ``run``."""
    files = files_of(run)
    action = d.byte() % 11
    target = d.pick(files) if files else run / "train.jsonl"
    if action == 0:
        target.write_bytes(d.data[d.pos:d.pos + d.byte() * 4])
    elif action == 1 and target.exists():
        data = target.read_bytes()
        at = (d.byte() << 8 | d.byte()) % max(1, len(data))
        target.write_bytes(data[:at] + d.text(16).encode("latin-1") + data[at + d.byte() % 8:])
    elif action == 2 and target.exists():
        data = bytearray(target.read_bytes())
        if data:
            data[(d.byte() << 8 | d.byte()) % len(data)] ^= 1 << (d.byte() % 8)
        target.write_bytes(bytes(data[: len(data) - d.byte() % 4 * (d.byte() % 64)]))
    elif action in (3, 4, 5):  # a manifest with one field fuzzed, its checksum made to match
        path = _pick_manifest(d, run)
        if path is None:
            return
        try:
            doc = json.loads(path.read_text())
        except (ValueError, OSError, RecursionError):
            return
        if isinstance(doc, dict):
            fuzz_fields(d, doc)
            path.write_text(restamp(doc))
    elif action == 6:  # a log line
        log = run / "train.jsonl"
        if log.is_file():
            lines = log.read_bytes().splitlines()
            line = dump(Pairs([(d.pick(("step", "event", "loss", "ms", "skipped", "val_loss")), value(d))
                               for _ in range(d.byte() % 4)]))
            at = d.byte() % (len(lines) + 1)
            log.write_bytes(b"\n".join([*lines[:at], line.encode("utf-8", "surrogatepass"), *lines[at:]]) + b"\n")
    elif action == 7:  # a file becomes a directory, or the reverse
        victim = d.pick([*files, run / "checkpoints", run / "train.jsonl"])
        if victim.is_dir():
            shutil.rmtree(victim)
            victim.write_bytes(d.text().encode("latin-1"))
        elif victim.exists():
            victim.unlink()
            victim.mkdir()
            if d.byte() & 1:
                (victim / "inside").write_bytes(b"x")
    elif action == 8:  # a stray entry in checkpoints/
        where = run / "checkpoints"
        if where.is_dir():
            name = d.pick(("ckpt-99999999.json", "ckpt-00000000.json", "ckpt-00000002.safetensors", ".tmp-1-x",
                           ".tmpabc", "ckpt-1.json", "ckpt-000000001.json", "ckpt-00000004.json"))
            stray = where / name
            if d.byte() & 1:
                stray.mkdir(exist_ok=True)
            elif not stray.is_dir():
                stray.write_bytes(d.text(64).encode("latin-1"))
    elif action == 9:
        rewrite_tensors(d, run)
    elif target.exists():
        target.unlink()


def rewrite_tensors(d: Draw, run: Path) -> None:
    """A checkpoint's tensors changed (a shape, a dtype, NaN, a tensor dropped or added) and re-hashed into
    its manifest: damage no checksum catches."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    path = _pick_manifest(d, run)
    if path is None:
        return
    try:
        doc = json.loads(path.read_text())
        (name,) = doc["files"]
        tensors = load_file(str(path.parent / name))
    except Exception:  # the harness's own read of an already damaged file: nothing to rewrite
        return
    key = d.pick(sorted(tensors))
    change = d.byte() % 5
    if change == 0:
        tensors[key] = tensors[key].reshape(-1)[: max(0, tensors[key].size - 1 - d.byte())]
    elif change == 1:
        tensors[key] = tensors[key].astype(d.pick((np.float16, np.float64, np.int32, np.uint8)))
    elif change == 2:
        tensors[key] = np.full_like(tensors[key], d.pick((np.nan, np.inf, -np.inf, 1e30)))
    elif change == 3:
        del tensors[key]
    else:
        tensors[d.text(12) or "extra"] = np.zeros(d.byte() % 7, np.float32)
    save_file(tensors, str(path.parent / name))
    data = (path.parent / name).read_bytes()
    doc["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    path.write_text(restamp(doc))


def fuzz_fields(d: Draw, doc: dict) -> None:
    """One field of a manifest (or of its state, or of a part of its state) set to a fuzzed value."""
    where = doc
    if d.byte() & 1 and isinstance(doc.get("state"), dict):
        where = doc["state"]
        if d.byte() & 1:
            key = d.pick(sorted(where) or ["x"])
            if isinstance(where.get(key), dict):
                where = where[key]
    keys = sorted(where) + ["extra"]
    where[d.pick(keys)] = value(d) if not d.rare() else d.pick(({}, [], None, "", 0, -1, 2**70))


def resume(data: bytes) -> None:
    """The base run, damaged by ``data``, resumed to step 4 as ``train --resume`` does."""
    from orion.train.trainer import Trainer, loss_summary, read_log

    base = base_run()
    work = Path(tempfile.mkdtemp(prefix="orion-fuzz-resume-case-", dir=base["root"]))
    try:
        run = Path(shutil.copytree(base["run"], work / "run"))
        d = Draw(data)
        for _ in range(1 + d.byte() % 3):
            try:
                damage(d, run)
            except OSError:  # a damage that does not apply (a directory where a file was expected, ...)
                continue
        base["cases"] += 1
        if os.environ.get("ORION_FUZZ_STATS") and base["cases"] % 100 == 0:  # campaigns count the cases
            with open(os.environ["ORION_FUZZ_STATS"], "a") as stats:
                stats.write(f"{os.getpid()} {base['cases']}\n")
        try:
            trainer = Trainer(base["config"], base["tokens"], run, steps=STEPS, resume=True, **_settings())
            records = trainer.train()
            loss_summary(records)  # what the command line prints at the end
            [r["val_loss"] for r in read_log(trainer.log_path) if r.get("event") == "eval"]
        except orion.OrionError:
            pass
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _pick_manifest(d: Draw, run: Path) -> Path | None:
    """One of the run's checkpoint manifests, drawn from the input (None: the run has none)."""
    manifests = sorted((run / "checkpoints").glob("ckpt-*.json")) if (run / "checkpoints").is_dir() else []
    return d.pick(manifests) if manifests else None
