"""On-disk cache of lowered programs (MIL text, BLOBFILE weights, I/O layout), keyed by content.

Lowering a large model (graph building, legalization, passes, fp16 weight files) is the slow part
of start-up; a second run with the same weights, shapes and compiler reads the files back and goes
straight to ``orion.compile``. The key covers the caller's description of the program, Orion's
version and the compiler's own source, so a changed compiler never reuses stale programs.
``ORION_CACHE_DIR`` moves the cache (default ``~/.cache/orion``); ``ORION_CACHE_DIR=off`` disables it.

Every entry carries a manifest with each file's size and CRC-32, checked on every read: a damaged
entry (a truncated weight file, a disk error) is rebuilt with a one-line warning, never used.
The cache is safe to share between processes: entries are written to a temporary directory and
renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import zlib
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path
from typing import Callable

import orion
from orion import compiler
from orion.compiler import Lowered
from orion.errors import OrionError
from orion.graph import Graph
from orion.legalize.io import IOLayout, IOSpec

_COMPILER_PARTS = ("compiler.py", "ops", "graph", "legalize", "passes", "emit.py", "generation", "models")
MANIFEST = "manifest.json"


class CacheDirError(OrionError):
    """``ORION_CACHE_DIR`` (or the default cache directory) cannot be used."""


class DamagedEntry(OrionError):
    """A program-cache entry does not match its manifest (it is rebuilt)."""


def cache_dir() -> Path | None:
    """Where lowered programs are kept, or None when caching is off. Raises :class:`CacheDirError`
    when the setting names something that is not a directory."""
    setting = os.environ.get("ORION_CACHE_DIR", "")
    if setting.lower() == "off":
        return None
    path = Path(setting) if setting else Path.home() / ".cache" / "orion"
    if path.exists() and not path.is_dir():
        raise CacheDirError(f"ORION_CACHE_DIR={str(path)!r} is not a directory; point ORION_CACHE_DIR at a "
                            f"directory (it is created if missing) or set ORION_CACHE_DIR=off")
    return path


@lru_cache(maxsize=1)
def _compiler_fingerprint() -> str:
    """SHA-256 of the compiler's Python sources (part of every key)."""
    root = Path(orion.__file__).parent
    h = hashlib.sha256(orion.__version__.encode())
    for part in _COMPILER_PARTS:
        for path in sorted((root / part).rglob("*.py")) if (root / part).is_dir() else [root / part]:
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


def program_key(description: dict) -> str:
    """The cache key of a program described by JSON-able ``description`` (include a weights hash)."""
    blob = json.dumps({"program": description, "compiler": _compiler_fingerprint()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _checksum(data: bytes) -> dict[str, int]:
    return {"size": len(data), "crc32": zlib.crc32(data)}


def _save(directory: Path, lowered: Lowered) -> None:
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheDirError(f"ORION_CACHE_DIR: cannot create {directory.parent} ({exc}); point ORION_CACHE_DIR at "
                            f"a writable directory or set ORION_CACHE_DIR=off") from exc
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=".tmp-"))
    try:
        layout = {"dtype": lowered.layout.dtype, "inputs": [asdict(s) for s in lowered.layout.inputs],
                  "outputs": [asdict(s) for s in lowered.layout.outputs]}
        files = {"model.mil": lowered.mil.encode(), "layout.json": json.dumps(layout).encode()}
        files.update({f"weights/{Path(path).name}": data for path, data in lowered.weights.items()})
        (tmp / "weights").mkdir()
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        (tmp / MANIFEST).write_text(json.dumps({name: _checksum(data) for name, data in files.items()}))
        tmp.rename(directory)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process won the race, or the disk is full: not fatal


def _read_verified(directory: Path) -> dict[str, bytes]:
    """Every file of the entry by relative name, checked against the manifest."""
    manifest = json.loads((directory / MANIFEST).read_text())
    on_disk = {f"weights/{f.name}" for f in (directory / "weights").iterdir()} | {"model.mil", "layout.json"}
    if set(manifest) != on_disk:
        raise DamagedEntry(f"files {sorted(on_disk ^ set(manifest))} differ from the manifest")
    files = {}
    for name, expected in manifest.items():
        data = (directory / name).read_bytes()
        if _checksum(data) != expected:
            raise DamagedEntry(f"{name} has {len(data)} bytes and a different checksum from the manifest's "
                               f"{expected['size']} bytes")
        files[name] = data
    return files


def _load(directory: Path) -> Lowered:
    files = _read_verified(directory)
    layout_json = json.loads(files.pop("layout.json"))
    spec = lambda d: IOSpec(**{**d, "shape": tuple(d["shape"]), "padded": tuple(d["padded"])})  # noqa: E731
    layout = IOLayout(layout_json["dtype"], [spec(d) for d in layout_json["inputs"]],
                      [spec(d) for d in layout_json["outputs"]])
    mil = files.pop("model.mil").decode()
    weights = {f"@model_path/{name}": data for name, data in sorted(files.items())}
    return Lowered(mil, weights, layout, report=None)


def lower_cached(description: dict, build: Callable[[], Graph], **lower_options) -> tuple[Lowered, bool]:
    """The lowered program for ``description``: from the cache when there, else built with ``build()``
    and lowered with ``lower_options``, then stored. Returns ``(lowered, was_cached)``."""
    root = cache_dir()
    key = program_key({**description, "lower": lower_options})
    if root is not None and (root / key).is_dir():
        try:
            return _load(root / key), True
        except (OSError, ValueError, KeyError, TypeError, DamagedEntry) as exc:
            print(f"orion: program cache entry {root / key} is damaged ({exc}); rebuilding it",
                  file=sys.stderr, flush=True)
            shutil.rmtree(root / key, ignore_errors=True)
    lowered = compiler.lower_graph(build(), **lower_options)
    if root is not None:
        _save(root / key, lowered)
    return lowered, False
