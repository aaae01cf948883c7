"""On-disk cache of lowered programs (MIL text, BLOBFILE weights, I/O layout), keyed by content.

Lowering a large model (graph building, legalization, passes, fp16 weight files) is the slow part
of start-up; a second run with the same weights, shapes and compiler reads the files back and goes
straight to ``orion.compile``. The key covers the caller's description of the program, Orion's
version and the compiler's own source, so a changed compiler never reuses stale programs.
``ORION_CACHE_DIR`` moves the cache (default ``~/.cache/orion``); ``ORION_CACHE_DIR=off`` disables it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path
from typing import Callable

import orion
from orion import compiler
from orion.compiler import Lowered
from orion.graph import Graph
from orion.legalize.io import IOLayout, IOSpec

_COMPILER_PARTS = ("compiler.py", "ops", "graph", "legalize", "passes", "emit.py", "models")


def cache_dir() -> Path | None:
    """Where lowered programs are kept, or None when caching is off."""
    setting = os.environ.get("ORION_CACHE_DIR", "")
    if setting.lower() == "off":
        return None
    return Path(setting) if setting else Path.home() / ".cache" / "orion"


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


def _save(directory: Path, lowered: Lowered) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=".tmp-"))
    try:
        (tmp / "model.mil").write_text(lowered.mil)
        (tmp / "weights").mkdir()
        for path, data in lowered.weights.items():
            (tmp / "weights" / Path(path).name).write_bytes(data)
        layout = {"dtype": lowered.layout.dtype, "inputs": [asdict(s) for s in lowered.layout.inputs],
                  "outputs": [asdict(s) for s in lowered.layout.outputs]}
        (tmp / "layout.json").write_text(json.dumps(layout))
        tmp.rename(directory)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another process won the race, or the disk is full: not fatal


def _load(directory: Path) -> Lowered:
    layout_json = json.loads((directory / "layout.json").read_text())
    spec = lambda d: IOSpec(**{**d, "shape": tuple(d["shape"]), "padded": tuple(d["padded"])})  # noqa: E731
    layout = IOLayout(layout_json["dtype"], [spec(d) for d in layout_json["inputs"]],
                      [spec(d) for d in layout_json["outputs"]])
    weights = {f"@model_path/weights/{f.name}": f.read_bytes() for f in sorted((directory / "weights").iterdir())}
    return Lowered((directory / "model.mil").read_text(), weights, layout, report=None)


def lower_cached(description: dict, build: Callable[[], Graph], **lower_options) -> tuple[Lowered, bool]:
    """The lowered program for ``description``: from the cache when there, else built with ``build()``
    and lowered with ``lower_options``, then stored. Returns ``(lowered, was_cached)``."""
    root = cache_dir()
    key = program_key({**description, "lower": lower_options})
    if root is not None and (root / key / "layout.json").is_file():
        try:
            return _load(root / key), True
        except (OSError, ValueError, KeyError, TypeError):
            shutil.rmtree(root / key, ignore_errors=True)  # a damaged entry is rebuilt
    lowered = compiler.lower_graph(build(), **lower_options)
    if root is not None:
        _save(root / key, lowered)
    return lowered, False
