"""The default corpus every machine already has: the sources (code and docstrings) of Python's standard library.

``stdlib_text()`` concatenates every ``.py`` file under ``sysconfig.get_paths()["stdlib"]`` in sorted
order of its relative POSIX path, each preceded by a line ``# file: <relative path>``, skipping
``site-packages``/``dist-packages``, test suites (directories named ``test``, ``tests``, ``idle_test``)
and files that are not UTF-8. The text is deterministic for a given Python installation (it differs
between Python versions; ``describe()`` names the version and hashes the text).
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from orion.train.errors import DataError

_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})


def stdlib_root() -> Path:
    """Where this interpreter's standard library lives."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_documents() -> Iterator[tuple[str, str]]:
    """``(relative path, source text)`` of each standard-library module, in the corpus order."""
    root = stdlib_root()
    if not root.is_dir():
        raise DataError(f"the standard library directory {root} does not exist; pass text files to prepare instead")
    files = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*.py")
                   if not _SKIPPED_DIRS.intersection(p.relative_to(root).parts[:-1]))
    for relative, path in files:
        try:
            yield relative, path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def stdlib_text(max_bytes: int | None = None) -> str:
    """The corpus as one string; with ``max_bytes``, its first ``max_bytes`` UTF-8 bytes, cut back to a
    whole line."""
    if max_bytes is not None and max_bytes <= 0:
        raise DataError(f"stdlib_text: max_bytes={max_bytes} must be > 0")
    pieces, size = [], 0
    for relative, text in stdlib_documents():
        piece = f"# file: {relative}\n{text}\n"
        pieces.append(piece)
        size += len(piece.encode())
        if max_bytes is not None and size >= max_bytes:
            break
    corpus = "".join(pieces)
    if max_bytes is not None:
        cut = corpus.encode()[:max_bytes].decode("utf-8", errors="ignore")
        corpus = cut[: cut.rfind("\n") + 1] or cut
    return corpus


def describe(text: str) -> dict[str, str | int]:
    """What identifies a corpus text: the Python version it came from, its size and SHA-256."""
    data = text.encode()
    return {"source": f"Python {sys.version.split()[0]} standard library ({stdlib_root()})", "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}
