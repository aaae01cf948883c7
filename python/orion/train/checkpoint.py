"""Checkpoints: tensors in safetensors, everything else in a JSON manifest, written atomically and checksummed.

A checkpoint of step N in ``dir`` is two files: ``ckpt-0000000N.safetensors`` (fp32 weights, AdamW m
and v, any tensors) and ``ckpt-0000000N.json``, the manifest: step, config hash, the caller's JSON
state (schedule position, sampler state with its RNG, accumulation phase, loss-scale state, ...),
the SHA-256 and size of the safetensors file, and the SHA-256 of the manifest itself. Each file is
written to a temporary name, fsynced, renamed into place and the directory fsynced; the manifest
goes last, so it is the commit record: a checkpoint without its manifest does not exist, and one
whose files do not match their checksums is refused. ``save`` keeps the newest ``keep`` checkpoints.
A checkpoint directory has one writer at a time (``save`` removes temporaries left by dead writers).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from orion.train.errors import CheckpointError

FORMAT = "orion-checkpoint/1"
_NAME = re.compile(r"^ckpt-(\d{8,})\.json$")
_TENSOR_NAME = re.compile(r"^ckpt-\d{8,}\.safetensors$")
_TMP_PREFIX = ".tmp-"


@dataclass
class Checkpoint:
    """A verified checkpoint, loaded."""

    path: Path  # the manifest
    step: int
    config_hash: str
    tensors: dict[str, np.ndarray]
    state: dict[str, Any]


def config_hash(config: Mapping[str, Any]) -> str:
    """SHA-256 of the configuration as canonical JSON (sorted keys): what a resumed run must match."""
    return hashlib.sha256(_canonical(config)).hexdigest()


def save(directory: str | os.PathLike, step: int, tensors: Mapping[str, np.ndarray], state: Mapping[str, Any],
         config_hash: str, keep: int = 3) -> Path:
    """Writes checkpoint ``step`` atomically, deletes all but the newest ``keep``; returns its manifest path."""
    if keep < 1:
        raise CheckpointError(f"checkpoint.save: keep={keep} must be >= 1")
    try:
        _canonical(dict(state))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint.save: the state is not JSON-serializable ({exc}); pass plain numbers, "
                              "strings, lists and dicts (tensors go in `tensors`)") from exc
    directory = Path(directory)
    manifest_path = directory / f"ckpt-{step:08d}.json"
    try:
        return _save(directory, manifest_path, int(step), tensors, state, config_hash, keep)
    except OSError as exc:  # the directory is a file, a checkpoint path a directory, the disk full, ...
        raise CheckpointError(f"checkpoint.save: cannot write {manifest_path} ({exc}). Fix: make {directory} a "
                              "writable directory holding only checkpoint files, with free space", manifest_path,
                              None) from None


def _save(directory: Path, manifest_path: Path, step: int, tensors: Mapping[str, np.ndarray],
          state: Mapping[str, Any], config_hash: str, keep: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(directory)
    tensor_path = manifest_path.with_suffix(".safetensors")
    arrays = {name: np.ascontiguousarray(a) for name, a in tensors.items()}
    if manifest_path.exists():  # re-saving a step: retire the old one first, so a crash leaves no mismatched pair
        manifest_path.unlink()
        _fsync_dir(directory)
    tmp = directory / f"{_TMP_PREFIX}{os.getpid()}-{tensor_path.name}"
    try:
        save_file(arrays, str(tmp))
    except (SafetensorError, OSError) as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"checkpoint.save: cannot write {tensor_path} ({exc}); check the free space and "
                              f"permissions of {directory}", manifest_path, None) from exc
    _fsync_file(tmp)
    digest, size = _sha256(tmp), tmp.stat().st_size
    os.replace(tmp, tensor_path)
    _fsync_dir(directory)
    body = {"format": FORMAT, "step": int(step), "config_hash": config_hash, "state": dict(state),
            "files": {tensor_path.name: {"sha256": digest, "bytes": size}}}
    text = json.dumps({**body, "manifest_sha256": hashlib.sha256(_canonical(body)).hexdigest()}, indent=1)
    _write_atomically(manifest_path, text.encode())
    _prune(directory, keep)
    return manifest_path


def checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Manifests in ``directory``, oldest step first (not verified); none if it does not exist. Raises
    CheckpointError if it is not a directory."""
    directory = Path(directory)
    if not directory.exists():
        return []
    try:
        names = [p.name for p in directory.iterdir()]
    except OSError as exc:
        raise CheckpointError(f"{directory} should be the directory of the run's checkpoints but cannot be listed "
                              f"({exc}). Fix: move it aside (or make it a readable directory)", directory) from None
    found = [(int(m.group(1)), directory / m.group(0)) for name in names if (m := _NAME.match(name))]
    return [path for _, path in sorted(found)]


def verify(path: str | os.PathLike, config_hash: str | None = None) -> dict[str, Any]:
    """Checks a manifest and its files against their checksums (and the config hash if given); returns the
    manifest. Raises CheckpointError naming the damaged file and offering the newest older good checkpoint."""
    path = Path(path)
    try:
        manifest = _check(path)
    except _Damaged as damage:
        raise damaged(path, str(damage), config_hash) from None
    if config_hash is not None and manifest["config_hash"] != config_hash:
        raise CheckpointError(f"checkpoint {path} was written by a run with config hash {manifest['config_hash']}, "
                              f"this run's config hashes to {config_hash}: resume with the same configuration, or "
                              "use another checkpoint directory", path, None)
    return manifest


def damaged(path: str | os.PathLike, damage: str, config_hash: str | None = None) -> CheckpointError:
    """The error for checkpoint ``path`` damaged as ``damage`` says, offering the newest older checkpoint that
    verifies (and matches ``config_hash``) as its ``previous``."""
    path = Path(path)
    older = [p for p in checkpoints(path.parent) if _step_of(p) < _step_of(path)]
    previous = _newest_valid(older, config_hash)
    offer = f"the previous valid checkpoint is {previous}: resume from it" if previous else \
        "no older valid checkpoint is left: start the run afresh"
    return CheckpointError(f"checkpoint {path} is damaged: {damage}; {offer}", path, previous)


def load(path: str | os.PathLike, config_hash: str | None = None) -> Checkpoint:
    """Verifies (``verify``) and loads a checkpoint."""
    path = Path(path)
    manifest = verify(path, config_hash)
    (tensor_file,) = manifest["files"]
    try:
        tensors = load_file(str(path.parent / tensor_file))
    except (SafetensorError, OSError) as exc:  # checksummed, so only if it changed after verification
        raise CheckpointError(f"checkpoint {path}: cannot read {tensor_file} ({exc})", path, None) from exc
    return Checkpoint(path, manifest["step"], manifest["config_hash"], tensors, manifest["state"])


def latest_valid(directory: str | os.PathLike, config_hash: str | None = None) -> Path | None:
    """The manifest of the newest checkpoint in ``directory`` that verifies (and matches ``config_hash``)."""
    return _newest_valid(checkpoints(directory), config_hash)


class _Damaged(Exception):
    """Internal: what is wrong with one checkpoint's files."""


def _newest_valid(manifests: list[Path], config_hash: str | None) -> Path | None:
    for path in reversed(manifests):
        try:
            manifest = _check(path)
        except _Damaged:
            continue
        if config_hash is None or manifest["config_hash"] == config_hash:
            return path
    return None


def _check(path: Path) -> dict[str, Any]:
    """The manifest, once it and every file it lists match their checksums; raises _Damaged."""
    manifest = _read_manifest(path)
    for name, expected in manifest["files"].items():
        file = path.parent / name
        if not file.is_file():
            raise _Damaged(f"{file} is missing (or not a file)")
        try:
            size, digest = file.stat().st_size, _sha256(file)
        except OSError as exc:
            raise _Damaged(f"{file} cannot be read ({exc})") from None
        if size != expected["bytes"]:
            raise _Damaged(f"{file} has {size} bytes, the manifest recorded {expected['bytes']} (truncated?)")
        if digest != expected["sha256"]:
            raise _Damaged(f"{file} does not match its SHA-256 in the manifest (corrupted)")
    return manifest


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise _Damaged(f"the manifest {path} is missing") from None
    except (OSError, ValueError, RecursionError) as exc:  # ValueError: not UTF-8, not JSON, a 5,000-digit number
        raise _Damaged(f"the manifest {path} is not readable JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _Damaged(f"the manifest {path} is not an {FORMAT} manifest")
    recorded = manifest.pop("manifest_sha256", None)
    try:
        digest = hashlib.sha256(_canonical(manifest)).hexdigest()
    except (ValueError, RecursionError):  # nested too deep to re-encode: not one this module wrote
        digest = None
    if digest is None or recorded != digest:
        raise _Damaged(f"the manifest {path} does not match its own SHA-256 (corrupted)")
    files, step = manifest.get("files"), manifest.get("step")
    if not (isinstance(files, dict) and len(files) == 1 and isinstance(step, int) and not isinstance(step, bool)
            and step >= 0 and isinstance(manifest.get("config_hash"), str) and isinstance(manifest.get("state"), dict)
            and all(_TENSOR_NAME.match(name) and isinstance(f, dict)
                    and isinstance(f.get("sha256"), str) and isinstance(f.get("bytes"), int) for name, f in files.items())):
        raise _Damaged(f"the manifest {path} lacks its step, config hash, state (an object) or file list")
    return manifest


def _step_of(path: Path) -> int:
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else -1


def _prune(directory: Path, keep: int) -> None:
    for manifest in checkpoints(directory)[:-keep]:
        manifest.unlink(missing_ok=True)  # the manifest first: a half-deleted checkpoint is no checkpoint
        manifest.with_suffix(".safetensors").unlink(missing_ok=True)
    _fsync_dir(directory)


def _remove_stale_temporaries(directory: Path) -> None:
    """Temporaries of writers that died (a checkpoint directory has one writer at a time): ours (``.tmp-``) and
    the ``.tmpXXXXXX`` file safetensors' ``save_file`` writes before renaming it to our temporary name."""
    for p in directory.iterdir():
        if p.name.startswith(".tmp"):
            p.unlink(missing_ok=True)


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.parent / f"{_TMP_PREFIX}{os.getpid()}-{path.name}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
