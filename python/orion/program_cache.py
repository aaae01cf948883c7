"""On-disk cache of lowered programs (MIL text, BLOBFILE weights, I/O layout), keyed by content.

Lowering a large model (graph building, legalization, passes, fp16 weight files) is the slow part
of start-up; a second run with the same weights, shapes and compiler reads the files back and goes
straight to ``orion.compile``. The key covers the caller's description of the program, Orion's
version, the compiler's own source and the native core, so a changed compiler never reuses stale programs.
``ORION_CACHE_DIR`` moves the cache (default ``~/.cache/orion``); ``ORION_CACHE_DIR=off`` disables it.

Weight files are stored once, by content (``blobs/<sha256>``: the file's SHA-256, or for a file of checkpoint
values, the SHA-256 of where they come from, :func:`derived_digest`), and entries reference them: the
prefill buckets and decode programs of one model share the same layer weights on disk, and in
memory (a read entry's weight files are read-only maps of its blobs, one map per blob per process, whose
pages are dropped after the program is compiled: it holds its own copy). An entry lowered here is stored
by one writer thread (:func:`lower_cached` with ``wait=False`` returns at once, and the program compiles
from the bytes in memory): its blobs first, then its own files in a temporary directory renamed into place,
so no entry is seen before every blob it references is whole; :func:`flush` waits. The writer runs at a lower
priority (Linux: 10 nice levels), and past :func:`queue_bound` of queued weight files (a sixteenth of the model's weights,
at most :data:`QUEUE_BYTES`) a caller waits for the entries queued before its own.
Every entry carries a manifest with each file's size and CRC-32 (its blobs' too), checked on every read, a
blob's once per blob version (its CRC is memoized under the blob's path, inode and size, so a replaced or
truncated blob is checked again, but not under its modification time, which a writer referencing the blob
refreshes as a use stamp): a damaged entry (a truncated weight file, a disk error) is rebuilt with a one-line
warning, never used. A program's content hash comes from its blobs' names (their SHA-256), so reading an
entry hashes no weights.

The emulator's packed form of each fp16 conv weight (panels of 16 output channels, what it would
otherwise repack from the weight files at every start) is stored too, once per weight, in ``panels/``:
``<blob>@<offset>-<cout>x<cin>.<layout>.<crc32>``, named by the weight file's blob, the weight's place and
shape, the panel layout (``_core.kernels.conv_panel_layout()``: files of another layout are not read) and
the file's CRC-32. :func:`compile_cached` has the emulator map those files instead of packing; a file is
checked against its CRC once per file version (as a blob is) and by the emulator against the weight at
sampled places, and a damaged one is deleted with a one-line warning and packed again. A process writes
the panels it packed itself after each compile, on the same writer thread (the compiles go on meanwhile; a file
gets its name only once whole, and the process waits for the writer at exit).

A weight file's SHA-256 and CRC-32 are remembered under the lineage key of its values
(``orion.graph.lineage``: a view of a read-only checkpoint map, or a fused array derived from such views),
and a later program baking the same values (a prefill bucket after the decode programs) emits the bytes
queued for writing, or once stored the blob itself (checked as a read entry's blobs are): each weight is
serialized, hashed, checksummed and written once per process.

A checkpoint file stored in a form a model cannot map as it is (BF16 safetensors, GGUF) has its converted copy
in ``converted/`` (:func:`converted_file`), named by the file's digest and the conversion: a start maps the copy
instead of converting the file into memory again. Copies are evicted with the entries, least recently used
first.

The cache has a size cap, ``ORION_CACHE_MAX_SIZE`` (bytes, or with a K/M/G suffix; default
:data:`DEFAULT_MAX_SIZE`): when a new entry takes it over the cap (the cache is walked once per process,
then counted up by what the process adds), the least recently used entries are removed until it
fits, then the blobs no entry references (and their panels). ``python -m orion cache info`` shows it,
``cache clear`` empties it. The cache is safe to share between processes: entries and blobs are written to temporary
names and renamed into place, and unreferenced blobs younger than a minute are kept (another process
may be writing the entry that references them).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import weakref
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from functools import lru_cache, partial
from pathlib import Path
from typing import BinaryIO

import numpy as np

import orion
from orion import _core, compiler, emit
from orion._core import kernels
from orion.compiler import CompiledGraph, Lowered, compile_lowered
from orion.errors import OrionError
from orion.graph import Graph, lineage
from orion.legalize.io import IOLayout, IOSpec

_COMPILER_PARTS = ("compiler.py", "ops", "graph", "legalize", "passes", "emit.py", "blobfile.py", "quant.py", "generation",
                   "models")
MANIFEST = "manifest.json"
BLOBS = "blobs"
PANELS = "panels"  # files of packed conv panels (compile_cached)
CONVERTED = "converted"  # converted copies of checkpoint files (converted_file)
FILES = "files"  # _by_identity's memo (MEMO_LOG): checkpoint digests, blob CRCs
MEMO_LOG = "memo.log"  # in FILES: a line per memoized value, "<key>\t<value>\t<CRC-32>", appended whole
MEMO_LOG_LIMIT = 4 << 20  # a log past this many bytes is started again (its values are computed again as asked)
FORMAT = 2  # the entry layout: 2 = weight files as shared blobs
DEFAULT_MAX_SIZE = 8 << 30
BLOB_GRACE_S = 60.0
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# A file of panels: <blob>@<offset>-<cout>x<cin>.<layout>.<crc32>; its weight's shaped key is <blob>@<offset>/<cout>x<cin>.
_PANEL_FILE = re.compile(r"(?P<blob>[0-9a-f]{64})@(?P<offset>\d+)-(?P<shape>\d+x\d+)\.(?P<layout>\w+)\.(?P<crc>[0-9a-f]{8})")


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
    if not path.is_dir() and path.exists():  # one stat when it is a directory (called per weight file)
        raise CacheDirError(f"ORION_CACHE_DIR={str(path)!r} is not a directory; point ORION_CACHE_DIR at a "
                            f"directory (it is created if missing) or set ORION_CACHE_DIR=off")
    return path


@lru_cache(maxsize=1)
def _compiler_fingerprint() -> str:
    """SHA-256 of the compiler's Python sources and of the native core (its MIL and BLOBFILE writers): part of
    every key and every derived weight-file name, so another build never reuses them."""
    root = Path(orion.__file__).parent
    h = hashlib.sha256(orion.__version__.encode())
    for part in _COMPILER_PARTS:
        for path in sorted((root / part).rglob("*.py")) if (root / part).is_dir() else [root / part]:
            h.update(path.name.encode() + path.read_bytes())
    h.update(Path(_core.__file__).read_bytes())
    return h.hexdigest()


def derived_digest(key: lineage.Key | None) -> str | None:
    """The name of the fp16 weight file of the values of lineage ``key`` by where they come from (``lineage.stable``:
    the checkpoint files' SHA-256, the view or derivation), this build (:func:`_compiler_fingerprint`) and numpy's
    version (which converts them): a SHA-256 (hex) that the file's bytes alone determine, computed without reading
    them. None when the values' files are not hashed (then the file itself is)."""
    text = lineage.stable(key)
    if text is None:
        return None
    return hashlib.sha256(f"orion fp16 weight file\0{_compiler_fingerprint()}\0{np.__version__}\0{text}".encode()).hexdigest()


def program_key(description: dict) -> str:
    """The cache key of a program described by JSON-able ``description`` (include a weights hash)."""
    blob = json.dumps({"program": description, "compiler": _compiler_fingerprint(), "format": FORMAT},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _checksum(data: bytes) -> dict[str, int]:
    return {"size": len(data), "crc32": zlib.crc32(data)}


def _write_in_place(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Writes the file ``path`` by ``write(file)`` into a temporary file beside it, renamed into place: it is never
    seen partly written, and the temporary file goes when writing fails."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_blob(path: Path, data: bytes | memoryview) -> bool:
    """Stores ``data`` as the blob at ``path`` (named by its SHA-256) unless there with its size (then refreshes
    its time, a use stamp); True when this call wrote it (:func:`_write_in_place`)."""
    if path.is_file() and path.stat().st_size == len(data):
        os.utime(path)
        return False
    _write_in_place(path, lambda out: out.write(data))
    return True


# Weight files queued for storing (_save) and not yet written, by blob path: later programs baking the same
# values emit these bytes (emit.FILE_COPY) until the writer has stored them.
_QUEUED_BLOBS: dict[Path, bytes | memoryview] = {}
_QUEUED_ENTRIES: set[Path] = set()  # entries queued for storing and not yet stored (or given up)
# The weight bytes held for the writer at most: past them, _save waits for the oldest entries (a cold start of a
# large model would otherwise hold a copy of all its weights until the disk caught up).
# 128 MiB keeps a cold start's peak RSS under 1.3x the weights (Qwen2.5-0.5B shape, load + first token, 3
# interleaved passes: bound 128 MiB 4.74 s / 1161 MiB, 256 MiB 3.84 s / 1275, 512 MiB 3.19 s / 1388; before the
# writer thread 5.97 s / 1045 MiB).
QUEUE_BYTES = 128 << 20
# A caller that knows its model's weight bytes holds at most this share of them (lower_cached's weight_bytes): 128 MiB
# is half of a small model's weights (GPT-2 124M's cold workload peaked at 456 MiB against 394 with no queue; the
# queue's bytes come on top of the packed weights and a long prompt's activations), and an eighth of Qwen2.5-0.5B's
# left its cold start at 1268-1279 MiB, over 1.3 GB; a sixteenth (59 MiB) 1191-1217 MiB, with no change to the time
# to the first token seen (3 interleaved cold starts each, medians 16.8 and 16.7 s, load average 5). A small model's
# cold start waits more for the writer: GPT-2 124M's took 3.1 s against the 128 MiB queue's 2.4 when the writer lagged.
QUEUE_SHARE = 1 / 16
_QUEUE: deque[tuple[futures.Future, int]] = deque()  # (the writer's future, the weight bytes it holds) of each queued entry


def queue_bound(weight_bytes: int | None) -> int:
    """The weight bytes the writer may hold for a model of ``weight_bytes`` (None: unknown): :data:`QUEUE_SHARE` of
    them, at most :data:`QUEUE_BYTES`."""
    return QUEUE_BYTES if weight_bytes is None else min(QUEUE_BYTES, int(weight_bytes * QUEUE_SHARE))


def _save(directory: Path, lowered: Lowered, queue_bytes: int) -> None:
    """Queues ``lowered`` for storing as entry ``directory`` on the writer thread (:func:`_store`), so the
    caller compiles from the bytes in memory while its weight files are written; :func:`flush` waits for it.
    Past ``queue_bytes`` of queued weight files it waits for the oldest entries, not for this one: its program
    compiles while it is written. A later program baking values of one of its weight files emits the queued bytes
    until they are stored."""
    root = directory.parent
    try:
        (root / BLOBS).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheDirError(f"ORION_CACHE_DIR: cannot create {root} ({exc}); point ORION_CACHE_DIR at "
                            f"a writable directory or set ORION_CACHE_DIR=off") from exc
    digests, sources = lowered.file_digests, lowered.sources or {}
    queued = {}
    for path, data in lowered.weights.items():
        blob = root / BLOBS / digests[path]
        if blob not in _QUEUED_BLOBS and blob not in queued:
            queued[blob] = data
            if path in sources:
                lineage.remember(sources[path], emit.FILE_COPY, partial(_QUEUED_BLOBS.get, blob))
    _QUEUED_BLOBS.update(queued)
    _QUEUED_ENTRIES.add(directory)
    _QUEUE.append((_writer().submit(_store, directory, lowered, set(queued)), sum(map(len, queued.values()))))
    while _QUEUE and (_QUEUE[0][0].done() or len(_QUEUE) > 1 and sum(n for _, n in _QUEUE) > queue_bytes):
        futures.wait([_QUEUE.popleft()[0]])


def _store(directory: Path, lowered: Lowered, queued: set[Path]) -> None:
    """Stores ``lowered`` as entry ``directory`` (on the writer thread): its blobs not stored yet, then its own
    files and a manifest of every file's size and CRC-32 in a temporary directory renamed into place only once
    every blob it references is whole (a crash or an error before leaves no entry; a full disk or a read-only
    cache skips it). Then later programs baking the same values emit the stored blobs, and the cache is kept
    under its cap. ``queued``: the blobs :func:`_save` queued for this entry (no longer queued after)."""
    root, tmp = directory.parent, None
    try:
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
        layout = {"dtype": lowered.layout.dtype, "inputs": [asdict(s) for s in lowered.layout.inputs],
                  "outputs": [asdict(s) for s in lowered.layout.outputs]}
        files = {"model.mil": lowered.mil.encode(), "layout.json": json.dumps(layout).encode()}
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        digests, sources = lowered.file_digests, lowered.sources or {}
        weights, written = {}, {}
        for path, data in lowered.weights.items():
            blob = root / BLOBS / digests[path]
            weights[path] = {"blob": blob.name, **_weight_checksum(data, sources.get(path))}
            if blob not in written and _write_blob(blob, data):
                written[blob] = weights[path]
        manifest = {"files": {name: _checksum(data) for name, data in files.items()}, "weights": weights}
        (tmp / MANIFEST).write_text(json.dumps(manifest))
        tmp.rename(directory)
        tmp = None
        for blob, ref in written.items():  # the checksums of blobs written here are known: a warm start need
            _verified_checksum(_map_blob(blob), blob, {"size": ref["size"], "crc32": ref["crc32"]})  # not compute them
        for path, key in sources.items():  # later programs baking the same values emit the blob, not new bytes
            ref = weights[path]
            lineage.remember(key, emit.FILE_COPY, partial(_stored_copy, root / BLOBS / ref["blob"],
                                                          {"size": ref["size"], "crc32": ref["crc32"]}))
        _keep_under_cap(root, sum(map(len, files.values())) + len(json.dumps(manifest))
                        + sum(ref["size"] for ref in written.values()))
    except OSError:  # another process won the race, or the disk is full: not fatal
        pass
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for blob in queued:
            _QUEUED_BLOBS.pop(blob, None)
        _QUEUED_ENTRIES.discard(directory)


def _stored_copy(path: Path, expected: dict[str, int]) -> memoryview | None:
    """The blob at ``path`` as a shared read-only map when it still has the ``expected`` size and CRC-32
    (checked once per blob version, as a read entry's blobs are), else None."""
    data = _map_blob(path)
    try:
        good = len(data) == expected["size"] and _verified_checksum(data, path) == expected
    except OSError:
        good = False
    return data if good and isinstance(data, memoryview) else None


def _weight_checksum(data: memoryview | bytes, key: lineage.Key | None) -> dict[str, int]:
    """``_checksum(data)`` of a weight file, computed once per process for the file of values of one lineage
    ``key`` (the decode programs and prefill buckets of a model bake the same weights)."""
    found = lineage.recall(key, emit.FILE_CRC32)
    if found is None or found["size"] != len(data):
        found = _checksum(data)
        lineage.remember(key, emit.FILE_CRC32, found)
    return found


# Read-only maps of the blobs in use, by (path, inode, size, mtime): entries that reference one blob
# (a model's prefill buckets and decode programs) share one map, so its pages are in memory once;
# each map's checksum is computed once, when the first entry reads it.
_MAPS: weakref.WeakValueDictionary[tuple, mmap.mmap] = weakref.WeakValueDictionary()
_MAP_CHECKSUMS: weakref.WeakKeyDictionary[mmap.mmap, dict[str, int]] = weakref.WeakKeyDictionary()


def _map_blob(path: Path) -> memoryview | bytes:
    """``path``'s bytes as a view of a shared read-only map (``b""`` when missing or empty: a damaged
    blob). Views compare equal to bytes of the same content."""
    try:
        st = path.stat()
    except OSError:
        return b""
    if st.st_size == 0:
        return b""
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    found = _MAPS.get(key)
    if found is None:
        with open(path, "rb") as f:
            found = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        _MAPS[key] = found
    return memoryview(found)  # holds the map alive


def _verified_checksum(data: memoryview | bytes, path: Path, known: dict[str, int] | None = None) -> dict[str, int]:
    """``_checksum(data)`` of the blob at ``path``: once per shared map in this process, and once per blob
    version across processes (``_by_identity``: a rewritten or truncated blob is checked again). ``known``:
    the checksum of the bytes just written to ``path`` (recorded, not computed again)."""
    shared = data.obj if isinstance(data, memoryview) and isinstance(data.obj, mmap.mmap) else None
    if shared is None:
        return _checksum(data)
    if shared not in _MAP_CHECKSUMS:
        def valid(text: str) -> bool:
            try:
                return json.loads(text)["size"] == len(data)
            except (ValueError, KeyError, TypeError):
                return False

        compute = lambda: json.dumps(known if known is not None else _checksum(data))  # noqa: E731
        _MAP_CHECKSUMS[shared] = json.loads(_by_identity(path, "crc32", compute, valid, times=False,
                                                         root=path.parent.parent))  # the blob's cache
    return _MAP_CHECKSUMS[shared]


def _read_verified(directory: Path) -> tuple[dict[str, bytes], dict[str, bytes], dict[str, str]]:
    """The entry's own files, its weight files (by MIL path; shared read-only maps of the blobs), checked
    against the manifest, and each weight file's SHA-256 (its blob's name)."""
    manifest = json.loads((directory / MANIFEST).read_text())
    own = {name: (directory / name, expected) for name, expected in manifest["files"].items()}
    blobs = directory.parent / BLOBS
    weights = {path: (blobs / ref["blob"], {"size": ref["size"], "crc32": ref["crc32"]})
               for path, ref in manifest["weights"].items()}
    bad = [ref["blob"] for ref in manifest["weights"].values() if not _SHA256_HEX.fullmatch(str(ref["blob"]))]
    if bad:
        raise DamagedEntry(f"blob name {bad[0]!r} is not a SHA-256")
    out: tuple[dict[str, bytes], dict[str, bytes]] = ({}, {})
    for found, table in zip(out, (own, weights), strict=True):
        for name, (path, expected) in table.items():
            if path.parent == blobs:
                data = _map_blob(path)
                found_sum = _verified_checksum(data, path)
            else:
                data = path.read_bytes() if path.is_file() else b""
                found_sum = _checksum(data)
            if found_sum != expected:
                if path.parent == blobs:
                    path.unlink(missing_ok=True)  # a damaged blob is rewritten by the rebuild
                raise DamagedEntry(f"{name} has {len(data)} bytes and a different checksum from the manifest's "
                                   f"{expected['size']} bytes")
            found[name] = data
    return (*out, {path: ref["blob"] for path, ref in manifest["weights"].items()})


def _load(directory: Path) -> Lowered:
    files, weights, digests = _read_verified(directory)
    layout_json = json.loads(files["layout.json"])
    spec = lambda d: IOSpec(**{**d, "shape": tuple(d["shape"]), "padded": tuple(d["padded"])})  # noqa: E731
    layout = IOLayout(layout_json["dtype"], [spec(d) for d in layout_json["inputs"]],
                      [spec(d) for d in layout_json["outputs"]])
    os.utime(directory / MANIFEST)  # most recently used
    return Lowered(files["model.mil"].decode(), dict(sorted(weights.items())), layout, report=None, digests=digests)


def lower_cached(description: dict, build: Callable[[], Graph], *, wait: bool = True, weight_bytes: int | None = None,
                 **lower_options) -> tuple[Lowered, bool]:
    """The lowered program for ``description``: from the cache when there, else built with ``build()``
    and lowered with ``lower_options``, then stored. Returns ``(lowered, was_cached)``; a lowered program's
    weight files are the bytes in memory. ``wait=False`` returns before it is stored (the writer thread
    stores it; :func:`flush` waits), so a cold start compiles while its weight files are written; the writer
    then holds at most :func:`queue_bound` of ``weight_bytes`` (the model's weights; None: unknown)."""
    root = cache_dir()
    key = program_key({**description, "lower": lower_options})
    if root is not None and root / key in _QUEUED_ENTRIES:
        flush()  # asked again before the writer stored it: read it back as stored
    if root is not None and (root / key).is_dir():
        try:
            return _load(root / key), True
        except (OSError, ValueError, KeyError, TypeError, DamagedEntry) as exc:
            print(f"orion: program cache entry {root / key} is damaged ({exc}); rebuilding it",
                  file=sys.stderr, flush=True)
            shutil.rmtree(root / key, ignore_errors=True)
    lowered = compiler.lower_graph(build(), **lower_options)
    if root is not None:
        _save(root / key, lowered, queue_bound(weight_bytes))
        if wait:
            flush()
    return lowered, False


# -- files of packed panels ------------------------------------------------------------------------------
_PANEL_NAMES: dict[Path, dict[str, list[str]]] = {}  # per cache directory: file names in panels/ by blob, read once
_PANELS_CHECKED: set[Path] = set()  # files of panels whose CRC this process has checked (or written)


def _panel_names(root: Path) -> dict[str, list[str]]:
    """The names in ``root/panels`` by the blob they belong to (listed once per process, then kept up to date
    with what this process writes and deletes)."""
    if root not in _PANEL_NAMES:
        by_blob: dict[str, list[str]] = {}
        try:
            names = os.listdir(root / PANELS)
        except OSError:
            names = []
        for name in names:
            if match := _PANEL_FILE.fullmatch(name):
                by_blob.setdefault(match["blob"], []).append(name)
        _PANEL_NAMES[root] = by_blob
    return _PANEL_NAMES[root]


def _forget_panel(root: Path, name: str, delete: bool) -> None:
    names = _panel_names(root).get(name[:64], [])
    if name in names:
        names.remove(name)
    _PANELS_CHECKED.discard(root / PANELS / name)
    if delete:
        (root / PANELS / name).unlink(missing_ok=True)


def _panel_crc(path: Path, known: int | None = None) -> int:
    """The CRC-32 of the file at ``path``, computed once per file version (``_by_identity``); ``known``: that
    of the bytes just written there (recorded, not computed)."""
    def compute() -> str:
        if known is not None:
            return str(known)
        crc = 0
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                crc = zlib.crc32(chunk, crc)
        return str(crc)

    return int(_by_identity(path, "crc32", compute, str.isdigit, times=False, root=path.parent.parent))


def panel_files(root: Path, digests: Iterable[str]) -> dict[str, str]:
    """The stored, checked files of packed panels of the weights in the blobs ``digests``, by the weight's
    shaped key (``orion.compile``'s ``packed_weights``). A damaged file is deleted with a one-line warning
    (the emulator packs its weight again, and it is stored again)."""
    layout = kernels.conv_panel_layout()
    found = {}
    for digest in set(digests):
        for name in list(_panel_names(root).get(digest, [])):
            match = _PANEL_FILE.fullmatch(name)
            if match["layout"] != layout:
                continue
            path = root / PANELS / name
            try:
                good = path in _PANELS_CHECKED or _panel_crc(path) == int(match["crc"], 16)
            except OSError:
                good = False
            if not good:
                print(f"orion: packed weight file {path} is damaged or missing; packing that weight again",
                      file=sys.stderr, flush=True)
                _forget_panel(root, name, delete=True)
                continue
            _PANELS_CHECKED.add(path)
            found[f"{digest}@{match['offset']}/{match['shape']}"] = str(path)
    return found


def store_panels(root: Path, digests: Iterable[str]) -> int:
    """Queues for writing to ``root/panels`` the packed panels of the weights in the blobs ``digests`` that this
    process packed itself and the cache does not hold yet (``_core.kernels.keyed_conv_panels``); returns the
    bytes queued. One writer thread writes them (:func:`flush` waits for it; a process waits for it at exit),
    so a cold start's compiles do not wait for a gigabyte of writes; the views keep the panels alive until
    written, and a file is named (found by :func:`panel_files`) only once it is whole."""
    layout, queued, wanted = kernels.conv_panel_layout(), 0, set(digests)
    names = _panel_names(root)
    for key, panels in kernels.keyed_conv_panels():
        blob, _, shape = key.partition("/")
        digest, _, offset = blob.partition("@")
        stem = f"{blob}-{shape}.{layout}."
        if digest not in wanted or stem in _PENDING or any(n.startswith(stem) for n in names.get(digest, [])):
            continue
        _PENDING.add(stem)
        _writer().submit(_write_panels, root, stem, digest, panels)
        queued += panels.nbytes
    return queued


def _write_panels(root: Path, stem: str, digest: str, panels: object) -> None:
    """Writes one weight's packed panels as ``<stem><crc32>`` (a temporary name renamed into place) and
    records its CRC-32; a full disk or a read-only cache skips it (the weight is packed again next time)."""
    try:
        data = memoryview(panels).cast("B")
        crc = zlib.crc32(data)
        name = f"{stem}{crc:08x}"
        (root / PANELS).mkdir(parents=True, exist_ok=True)
        _write_in_place(root / PANELS / name, lambda out: out.write(data))
        _panel_crc(root / PANELS / name, known=crc)
        _panel_names(root).setdefault(digest, []).append(name)
    except OSError:
        pass
    finally:
        _PENDING.discard(stem)


_WRITER: list[ThreadPoolExecutor] = []  # the one writer thread of entries and files of panels, made on first use
_PENDING: set[str] = set()  # "<blob>@<offset>-<shape>.<layout>." of the files of panels queued and not yet written


def _forget_writer() -> None:
    """In a forked child: the parent's writer thread is not there (a new one is made on first use)."""
    _WRITER.clear()
    _PENDING.clear()
    _QUEUED_BLOBS.clear()
    _QUEUED_ENTRIES.clear()
    _QUEUE.clear()


os.register_at_fork(after_in_child=_forget_writer)


def _yield_to_the_foreground() -> None:
    """The writer thread's start: on Linux (where a thread's id is a pid) its nice value is raised by 10, so the
    compiles and the first token get the cores first and the files are written with the cycles left over."""
    if sys.platform == "linux":
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + 10)
        except OSError:
            pass


def _writer() -> ThreadPoolExecutor:
    if not _WRITER:
        _WRITER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="orion-cache-writer",
                                          initializer=_yield_to_the_foreground))
    return _WRITER[0]


def flush() -> None:
    """Waits until the entries and files of panels queued so far (:func:`lower_cached`, :func:`store_panels`)
    are stored."""
    if _WRITER:
        _WRITER[0].submit(lambda: None).result()  # one thread: everything queued before has run


def compile_cached(lowered: Lowered, **options) -> CompiledGraph:
    """``compile_lowered(lowered, **options)`` with the cache's files of packed panels: the emulator maps the
    stored panels of the program's weights instead of packing them, and the panels it packed are stored
    after. A file the emulator refuses (wrong size or values) is deleted with a one-line warning and the
    program compiled again without it."""
    root = cache_dir()
    if root is None:
        return compile_lowered(lowered, **options)
    files = panel_files(root, lowered.file_digests.values())
    try:
        compiled = compile_lowered(lowered, packed_weights=files, **options)
    except ValueError as exc:
        refused = [path for path in files.values() if f"'{path}'" in str(exc)]
        if not refused:
            raise
        print(f"orion: {exc}; deleting it and packing that weight again", file=sys.stderr, flush=True)
        for path in refused:
            _forget_panel(root, Path(path).name, delete=True)
        return compile_cached(lowered, **options)
    added = store_panels(root, lowered.file_digests.values())
    if added:
        _writer().submit(_keep_under_cap, root, added)  # once written, on the thread that counts the entries
    return compiled


_STORED: dict[Path, int] = {}  # per cache directory: its stored bytes as of this process's last count, plus what it added


def converted_file(source: Path, file: BinaryIO | None, kind: str, size: int, write: Callable[[BinaryIO], None],
                   valid: Callable[[Path], bool]) -> tuple[Path, str] | None:
    """The cache's converted copy of checkpoint file ``source`` (``file``: the version open, as for
    :func:`file_digest`) made by ``kind`` of conversion, and the digest naming its bytes (the source's digest and
    ``kind``): ``converted/<digest>.safetensors``, written by ``write`` (``size`` bytes, :func:`_write_in_place`)
    unless there and ``valid`` (a copy that is not is written again, with a one-line
    warning), its time then refreshed as a use stamp. None when caching is off, the cache cannot be written or
    the copy would take over half of its cap (the caller converts in memory; the source is not hashed)."""
    root = cache_dir()
    if root is None or size > max_size() // 2:
        return None
    digest = hashlib.sha256(f"{file_digest(source, file)}\0{kind}".encode()).hexdigest()
    path = root / CONVERTED / f"{digest}.safetensors"
    try:
        if path.is_file():
            if valid(path):
                os.utime(path)
                return path, digest
            print(f"orion: {path}: damaged converted copy; converting again", file=sys.stderr)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_in_place(path, write)
        _keep_under_cap(root, path.stat().st_size)
    except OSError:
        return None
    return path, digest


def _keep_under_cap(root: Path, added: int) -> None:
    """After storing an entry of ``added`` new bytes: evict (``enforce_cap``) when the cache may exceed
    :func:`max_size`. The cache is walked once per process and after each eviction, not after every entry
    (walking it per entry made a cold start quadratic in its programs); between walks the count only grows
    by what this process adds (an overestimate when others evict, which just walks it again sooner; entries
    other processes add are theirs to count)."""
    cap = max_size()
    try:
        total = _STORED[root] + added if root in _STORED else _stored_bytes(root)
        if total > cap:
            enforce_cap(root, cap)
            total = _stored_bytes(root)
        _STORED[root] = total
    except OSError:  # another process is evicting at the same time: its pass does the work
        _STORED.pop(root, None)


# _by_identity's memo in this process, by the file's identity as given (kind, path unresolved, device, inode, size,
# times or None): the one lookup a file asked for again costs (a warm start of the Qwen2.5-0.5B shape reads its 333
# blobs 873 times, as each entry maps them again; resolving and hashing the identity each time cost ~0.1 CPU s).
_MEMO: dict[tuple[str, str, int, int, int, tuple[int, int] | None], str] = {}
# A file changed this recently may change again with the same times (a file system's clock ticks every few
# ms; Linux's coarse clock lags the true time by up to a tick): _by_identity does not memoize it.
RACY_NS = 100_000_000


@lru_cache(maxsize=64)
def _real_dir(directory: str) -> str:
    """``os.path.realpath`` of a directory, once per process (a warm start asks it for every weight file)."""
    return os.path.realpath(directory)


def _by_identity(path: Path, kind: str, compute: Callable[[], str], valid: Callable[[str], bool],
                 st: os.stat_result | None = None, times: bool = True, root: Path | None = None) -> str:
    """``compute()`` for the file at ``path``, once per file version: memoized in this process and in the
    cache (``files/``) under ``kind`` and the file's identity (resolved path, device, inode, size,
    modification and change times, so any rewrite changes it; ``st``: that file's stat, default the
    path's). ``valid`` checks a memoized value. ``times=False`` leaves the times out: for a blob, which is
    only ever written whole under a new inode (renamed into place) and whose modification time is a use
    stamp (``_write_blob`` refreshes it), so a stamp must not void its memo; a truncation changes its size.
    ``root``: the cache whose ``files/`` holds the memo (default :func:`cache_dir`).

    A file whose times are within :data:`RACY_NS` of now is computed and not memoized: a rewrite of it
    in the same tick of the file system's clock could keep every part of its identity (same size, same
    times), and a memo would then stand for the bytes before it (git's "racily clean" files)."""
    st = path.stat() if st is None else st
    if times and time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_NS:
        return compute()
    given = (kind, str(path), st.st_dev, st.st_ino, st.st_size, (st.st_mtime_ns, st.st_ctime_ns) if times else None)
    if given in _MEMO:
        return _MEMO[given]
    stamp = f"\0{st.st_mtime_ns}\0{st.st_ctime_ns}" if times else ""
    resolved = os.path.join(_real_dir(os.path.dirname(os.path.abspath(path))), os.path.basename(path))
    identity = f"{kind}\0{resolved}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}{stamp}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:32]
    root = cache_dir() if root is None else root
    log = _memo_log(root) if root is not None else {}
    text = _memo_value(log, key)
    if not valid(text):
        text = compute()
        if root is not None and "\n" not in text:
            log[key] = line = _memo_line(key, text)
            try:
                (root / FILES).mkdir(parents=True, exist_ok=True)
                with open(root / FILES / MEMO_LOG, "ab") as out:  # one write of a whole line: never interleaved
                    out.write(line.encode())
            except OSError:  # a read-only cache: compute again next time
                pass
    _MEMO[given] = text
    return text


def _memo_line(key: str, value: str) -> str:
    return f"{key}\t{value}\t{zlib.crc32(f'{key}{value}'.encode()):08x}\n"


_MEMO_LOGS: dict[Path, dict[str, str]] = {}  # per cache directory: its memo log's lines by key, as read once


def _memo_log(root: Path) -> dict[str, str]:
    """``root``'s memo log, its lines by key (the last line of each key): read once per process (a warm start
    asks hundreds, one small file each before), then kept up to date with what this process appends. A line is
    checked when its key is asked (:func:`_memo_value`), not here: a warm start asks a few hundred of the
    log's thousands of lines. A log past :data:`MEMO_LOG_LIMIT` is removed and started again."""
    found = _MEMO_LOGS.get(root)
    if found is None:
        found = {}
        path = root / FILES / MEMO_LOG
        try:
            if path.stat().st_size > MEMO_LOG_LIMIT:
                path.unlink()
            else:
                text = path.read_bytes().decode(errors="replace")
                found = {line.partition("\t")[0]: line for line in text.splitlines(keepends=True)}
        except OSError:
            pass
        _MEMO_LOGS[root] = found
    return found


def _memo_value(log: dict[str, str], key: str) -> str:
    """The value ``log`` holds for ``key``, or "" when it has none or its line is not whole and intact (its
    CRC-32, :func:`_memo_line`: read while another process wrote it, or damaged); the caller computes it again."""
    line = log.get(key, "")
    value = line.partition("\t")[2].rpartition("\t")[0]
    return value if line and line == _memo_line(key, value) else ""


DIGEST_PIECE = 64 << 20  # file_digest hashes a file in pieces of this many bytes, on every core


def file_digest(path: Path, file: BinaryIO | None = None) -> str:
    """A SHA-256 (hex) that the bytes of the file at ``path`` alone determine (or of the open ``file``: the
    version a caller mapped, even if the name was given to another file since), computed once per file version
    (``_by_identity``): the SHA-256 of the file's size and of the SHA-256 of each of its :data:`DIGEST_PIECE`
    pieces, which are hashed on every core (hashlib releases the GIL; one SHA-256 of the Qwen2.5-0.5B
    checkpoint took ~0.7 s on one core). The pieces are read through a private map of the file, each piece's
    pages dropped once hashed, so hashing copies nothing and leaves none of its pages in this process."""
    fd = file.fileno() if file is not None else None

    def compute() -> str:
        with path.open("rb") if fd is None else open(os.dup(fd), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            pieces = []
            if size:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as found:
                    def piece(start: int) -> bytes:
                        with memoryview(found)[start:start + DIGEST_PIECE] as view:
                            digest = hashlib.sha256(view).digest()
                        found.madvise(mmap.MADV_DONTNEED, start, min(DIGEST_PIECE, size - start))
                        return digest

                    starts = range(0, size, DIGEST_PIECE)
                    with ThreadPoolExecutor(min(len(starts), os.cpu_count() or 1)) as pool:
                        pieces = list(pool.map(piece, starts))
        h = hashlib.sha256(f"orion file digest\0{DIGEST_PIECE}\0{size}\0".encode())
        for digest in pieces:
            h.update(digest)
        return h.hexdigest()

    return _by_identity(path, "sha256 of pieces", compute, lambda text: bool(_SHA256_HEX.fullmatch(text)),
                        None if fd is None else os.fstat(fd))


# -- size cap, info and clear ---------------------------------------------------------------------------
def max_size() -> int:
    """The cap in bytes from ``ORION_CACHE_MAX_SIZE`` (e.g. ``500M``, ``8G``), else the default."""
    setting = os.environ.get("ORION_CACHE_MAX_SIZE", "").strip()
    if not setting:
        return DEFAULT_MAX_SIZE
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    number, unit = (setting[:-1], units[setting[-1].upper()]) if setting[-1].upper() in units else (setting, 1)
    try:
        value = float(number) * unit
    except ValueError:
        value = -1
    if not value >= 0:
        raise CacheDirError(f"ORION_CACHE_MAX_SIZE={setting!r}: give a size in bytes or with K, M or G "
                            f"(e.g. 8G)")
    return int(value)


def _entries(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if p.is_dir() and (p / MANIFEST).is_file() and not p.name.startswith(".")]


def _converted(root: Path) -> list[Path]:
    folder = root / CONVERTED
    return [p for p in folder.iterdir() if not p.name.startswith(".")] if folder.is_dir() else []


def _last_use(item: Path) -> float:
    """An entry's (its manifest's) or a converted copy's modification time: a use stamp."""
    return (item / MANIFEST if item.is_dir() else item).stat().st_mtime


def _references(entry: Path) -> set[str]:
    try:
        return {ref["blob"] for ref in json.loads((entry / MANIFEST).read_text()).get("weights", {}).values()}
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return set()


def _file_size(path: str | Path) -> int:
    """A file's bytes; 0 once it is gone (renamed into place or deleted meanwhile by a writer: the panel writer
    thread, another process)."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _size(path: Path) -> int:
    """Bytes of the file, or of the files under the directory (os.walk skips directories that vanish)."""
    if not path.is_dir():
        return _file_size(path)
    return sum(_file_size(os.path.join(folder, name)) for folder, _, names in os.walk(path) for name in names)


def _stored_bytes(root: Path) -> int:
    """Bytes of the entries and blobs (the few bytes of the ``files/`` memo are not counted)."""
    return _size(root) - (_size(root / FILES) if (root / FILES).is_dir() else 0)


def usage(root: Path | None = None) -> dict[str, int]:
    """``{"entries", "blobs", "converted", "bytes"}`` of the cache (zeros when it is off or empty)."""
    root = cache_dir() if root is None else root
    if root is None or not root.is_dir():
        return {"entries": 0, "blobs": 0, "converted": 0, "bytes": 0}
    blobs = [b for b in (root / BLOBS).iterdir()] if (root / BLOBS).is_dir() else []
    return {"entries": len(_entries(root)), "blobs": len(blobs), "converted": len(_converted(root)),
            "bytes": _stored_bytes(root)}


def enforce_cap(root: Path, cap: int) -> None:
    """Remove least recently used entries and converted copies until the cache fits ``cap``, then unreferenced
    blobs."""
    entries = sorted(_entries(root) + _converted(root), key=_last_use)
    refs = {e: _references(e) for e in entries}
    blob_dir = root / BLOBS
    total = _stored_bytes(root)
    if total <= cap:
        return
    count = {}
    for names in refs.values():
        for name in names:
            count[name] = count.get(name, 0) + 1
    for entry in entries[:-1]:  # the newest entry (just written) stays
        if total <= cap:
            break
        total -= _size(entry)
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        for name in refs[entry]:
            count[name] -= 1
            if count[name] == 0 and (blob_dir / name).is_file():
                total -= (blob_dir / name).stat().st_size
                (blob_dir / name).unlink(missing_ok=True)
    _collect_blobs(root, {name for name, n in count.items() if n > 0})


def _collect_blobs(root: Path, keep: set[str], grace_s: float = BLOB_GRACE_S) -> None:
    """Delete blobs outside ``keep``, and the files of panels of weights in them, older than ``grace_s``
    (a writer may be about to reference them)."""
    now = time.time()
    for folder, blob_of in ((root / BLOBS, lambda name: name), (root / PANELS, lambda name: name[:64])):
        for path in folder.iterdir() if folder.is_dir() else []:
            if blob_of(path.name) not in keep and now - path.stat().st_mtime > grace_s:
                path.unlink(missing_ok=True)
    _PANEL_NAMES.pop(root, None)  # listed and checked again when next needed
    _PANELS_CHECKED.clear()


def clear(root: Path | None = None) -> int:
    """Delete every entry and blob of the cache; returns the bytes freed."""
    root = cache_dir() if root is None else root
    if root is None or not root.is_dir():
        return 0
    flush()  # no file of panels lands after the clear
    freed = 0
    for path in root.iterdir():
        if path.name in (BLOBS, PANELS, CONVERTED, FILES) or path.name.startswith(".tmp-") or (path / MANIFEST).is_file():
            freed += _size(path)
            shutil.rmtree(path, ignore_errors=True)
    _PANEL_NAMES.pop(root, None)
    _MEMO_LOGS.pop(root, None)
    _PANELS_CHECKED.clear()
    return freed


def main(action: str) -> int:
    """``python -m orion cache info|clear``."""
    root = cache_dir()
    if root is None:
        print("program cache: off (ORION_CACHE_DIR=off)")
        return 0
    if action == "clear":
        print(f"program cache {root}: removed {clear(root) / 1e6:.1f} MB")
        return 0
    u = usage(root)
    print(f"program cache:   {root} (ORION_CACHE_DIR)")
    print(f"entries:         {u['entries']} programs, {u['blobs']} weight files stored once by content, "
          f"{u['converted']} converted checkpoint files")
    print(f"size:            {u['bytes'] / 1e6:.1f} MB of a {max_size() / 1e6:.0f} MB cap (ORION_CACHE_MAX_SIZE; "
          f"least recently used entries go first)")
    return 0
