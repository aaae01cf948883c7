"""Weights I/O shared by the models: safetensors files (single or sharded, read through a read-only
map, BF16 without a bfloat16 dtype, written in F32/F16/BF16), progress settings for large
checkpoints, and the content hash that identifies a model's weights in the program cache.

Loaded weights keep the precision the file stores and are not copied when it is F32 or F16: each
array is a read-only float32 or float16 view of the file's map, so only the pages something reads
are in memory, and :meth:`WeightsSource.release_pages` drops them again after the programs are
built (which hold their own fp16 copy: the only resident one). BF16 tensors are converted once to
float16 arrays (one converted copy; bf16 values in fp16's normal range are exact in fp16, and the
programs compute in fp16 anyway), F64 ones to float32. Rows of a table looked up a few at a
time (a token embedding) are read from the file (:func:`table_rows`), not through the map: a
mapped page counts in the process's memory once touched, and this kernel maps a whole large folio
(about 2 MiB) per touch, so a lookup of 1,000 tokens would make the whole table resident. While a model's arrays are still
the loaded ones, each file's digest, computed once per file version (``program_cache.file_digest``: a SHA-256
of its 64 MiB pieces' SHA-256s), stands for its bytes in the content hash: a warm start hashes no weights."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import sys
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from orion import origins
from orion.errors import OrionError
from orion.graph import lineage
from orion.runtime.pages import map_of, release_pages

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PROGRESS_EVERY = 50  # tensors between progress lines
PROGRESS_MIN_BYTES = 64 << 20  # with progress=None, report only for files at least this large


WEIGHT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))  # what a model's weight arrays may be


class MappedSafetensors:
    """A safetensors file mapped read-only; ``array(name)`` gives one tensor at its stored precision
    (a view of the map), ``float32(name)`` as a float32 array."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path.open("rb")  # kept open: the file as mapped, even if its name is replaced later
        weakref.finalize(self, self.file.close)  # closed with this object (no ResourceWarning whenever it is collected)
        self.map = mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_READ)
        (header_len,) = struct.unpack_from("<Q", self.map, 0)
        self.header = json.loads(self.map[8:8 + header_len])
        self.data_start = 8 + header_len
        self.address = np.frombuffer(self.map, dtype=np.uint8, count=1).ctypes.data  # where the map starts

    def offset_of(self, array: np.ndarray) -> int | None:
        """The file offset of ``array``'s first byte when it is a C-contiguous view of this map, else None."""
        start = array.ctypes.data - self.address
        if not array.flags.c_contiguous or start < 0 or start + array.nbytes > len(self.map):
            return None
        return start if map_of(array) is self.map else None

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a read-only array of a :data:`WEIGHT_DTYPES` type: a view of the map when
        stored as F32 or F16 (on a little-endian machine), else converted (BF16 to float16, F64 to float32)."""
        entry = self.header[name]
        if entry["dtype"] in ("F32", "F16") and sys.byteorder == "little":
            start, end = entry["data_offsets"]
            dtype = np.dtype(np.float32 if entry["dtype"] == "F32" else np.float16)
            array = np.frombuffer(self.map, dtype=dtype, count=(end - start) // dtype.itemsize,
                                  offset=self.data_start + start).reshape(entry["shape"])
            origins.record(array, f"{self.path.name}: tensor {name!r}")
            return array
        wide = self.float32(name)
        array = wide.astype(np.float16) if entry["dtype"] == "BF16" else wide
        array.flags.writeable = False
        origins.record(array, f"{self.path.name}: tensor {name!r}")
        return array

    def float32(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a read-only float32 array: a view of the map when stored as F32 (on a
        little-endian machine), else converted (F16, F64; BF16 widened without a bfloat16 dtype)."""
        entry = self.header[name]
        start, end = entry["data_offsets"]
        stored = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "BF16": "<u2"}[entry["dtype"]]
        raw = np.frombuffer(self.map, dtype=stored, count=(end - start) // int(stored[-1]),
                            offset=self.data_start + start)
        if entry["dtype"] == "BF16":
            array = (raw.astype(np.uint32) << 16).view(np.float32)
        elif entry["dtype"] == "F32" and sys.byteorder == "little":
            array = raw
        else:
            array = raw.astype(np.float32)
        array = array.reshape(entry["shape"])
        array.flags.writeable = False
        origins.record(array, f"{self.path.name}: tensor {name!r}")  # errors about its values name it
        return array


@dataclass(eq=False)
class WeightsSource:
    """Where loaded weights came from: the checkpoint files, their maps (kept open) and every array as
    loaded, by Orion name. ``matches`` says whether a model's arrays are still exactly those."""

    files: list[MappedSafetensors]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def matches(self, arrays: Iterable[tuple[str, np.ndarray]]) -> bool:
        """True when ``arrays`` are the loaded arrays themselves (read-only, so unchanged), no more, no fewer."""
        current = dict(arrays)
        return current.keys() == self.arrays.keys() and all(current[k] is a for k, a in self.arrays.items())

    def digest(self) -> str:
        """SHA-256 over the files' own digests (``program_cache.file_digest``, each computed once per file version).
        Each file's stands for its map's bytes from then on (``lineage.name_source``): weight files of its values are
        named by it."""
        from orion.program_cache import file_digest

        h = hashlib.sha256()
        for f in self.files:
            file_sha = file_digest(f.path, f.file)
            lineage.name_source(f.map, file_sha)
            h.update(bytes.fromhex(file_sha))
        return h.hexdigest()

    def release_pages(self) -> None:
        """Drops the files' pages from this process's memory (they stay readable)."""
        release_pages(f.map for f in self.files)



def table_rows(table: np.ndarray, ids: Sequence[int] | range, source: WeightsSource | None) -> np.ndarray:
    """``table[ids]`` (a new float32 array ``[len(ids), width]``) of a 2-D float32 or float16 ``table``. When
    ``table`` is a view of one of ``source``'s file maps, each row (a ``range`` of rows at once) is read from
    the file with ``os.preadv``, so no page of the map becomes resident; otherwise by indexing."""
    if source is not None and table.ndim == 2 and table.dtype in WEIGHT_DTYPES:
        for f in source.files:
            offset = f.offset_of(table)
            if offset is not None:
                return _read_rows(f, offset, table.shape, table.dtype, ids).astype(np.float32, copy=False)
    return np.asarray(table[list(ids) if isinstance(ids, range) else ids], dtype=np.float32)


def table_matvec(table: np.ndarray, h: np.ndarray, rows: int = 8192) -> np.ndarray:
    """``table @ h`` in float32 for a 2-D float32 or float16 ``table`` ``[n, width]`` and float32 ``h``
    ``[width]``, converting ``rows`` rows at a time (no float32 copy of a float16 table)."""
    if table.dtype == np.float32:
        return table @ h
    return np.concatenate([table[i:i + rows].astype(np.float32) @ h for i in range(0, table.shape[0], rows)])


def _read_rows(f: MappedSafetensors, offset: int, shape: tuple[int, ...], dtype: np.dtype,
               ids: Sequence[int] | range) -> np.ndarray:
    """Rows ``ids`` of the ``shape`` ``dtype`` table stored at ``offset`` in ``f``'s file, read with ``preadv``."""
    count, width = shape
    row_bytes = width * dtype.itemsize
    out = np.empty((len(ids), width), dtype=dtype)
    buffer = memoryview(out).cast("B")
    if isinstance(ids, range) and ids.step == 1:  # one read of consecutive rows
        runs = [(0, ids.start, len(ids))] if len(ids) else []
    else:
        runs = [(j, int(i), 1) for j, i in enumerate(ids)]
    for at, first, n in runs:
        if first < 0 or first + n > count:
            raise IndexError(f"row {first if first < 0 else first + n - 1} is outside the table's {count} rows")
        want = n * row_bytes
        if os.preadv(f.file.fileno(), [buffer[at * row_bytes: at * row_bytes + want]], offset + first * row_bytes) != want:
            raise OSError(f"{f.path}: short read of {n} row(s) at row {first} (was the file truncated?)")
    return out


def _encode(array: np.ndarray, dtype: str) -> bytes:
    """Little-endian bytes of ``array`` in safetensors dtype ``dtype`` (bf16 rounded to nearest even)."""
    if dtype == "BF16":
        bits = np.ascontiguousarray(array, dtype="<f4").view("<u4").astype(np.uint64)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()
    return np.ascontiguousarray(array, dtype="<f4" if dtype == "F32" else "<f2").tobytes()


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str) -> int:
    """Write ``tensors`` to a safetensors file in ``dtype`` (F32, F16 or BF16); returns the data bytes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, array in tensors.items():
        blob = _encode(array, dtype)
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)
    return offset


def safetensors_files(directory: Path, error: type[OrionError], help: str) -> dict[Path, set[str] | None]:
    """The weight files of a Hugging Face directory -> the tensor names its index assigns to each
    (None: a single unindexed ``model.safetensors``). Problems raise ``error`` ending with ``help``
    (what the directory should hold)."""
    if not directory.is_dir():
        raise error(f"{directory}: no such directory; {help}")
    single, index = directory / WEIGHTS_FILE, directory / INDEX_FILE
    if single.is_file():
        return {single: None}
    if not index.is_file():
        hint = ""
        if any(directory.glob("pytorch_model*.bin")):
            hint = ("; it has pytorch_model*.bin only: re-save it as safetensors "
                    "(save_pretrained(safe_serialization=True))")
        raise error(f"{directory}: neither {WEIGHTS_FILE} nor {INDEX_FILE}; {help}{hint}")
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, RecursionError, KeyError, TypeError) as exc:
        raise error(f"{index}: not a safetensors index with a 'weight_map' ({exc!r})") from exc
    shards: dict[Path, set[str] | None] = {}
    for name, file in weight_map.items():
        path = directory / str(file)
        if Path(str(file)).is_absolute() or ".." in Path(str(file)).parts or not path.is_file():
            raise error(f"{index}: tensor {name!r} is in shard {file!r}, which is not a file in {directory}")
        shards.setdefault(path, set()).add(name)  # type: ignore[union-attr]
    return shards


def check_weight_shapes(owner: str, arrays: Iterable[tuple[str, np.ndarray]], shapes: dict[str, tuple[int, ...]],
                        error: type[OrionError]) -> None:
    """Raise ``error`` unless every ``(name, array)`` is a float32 or float16 array (:data:`WEIGHT_DTYPES`,
    float16 as an F16 or BF16 checkpoint loads) of the shape ``shapes`` gives for the last part of its dotted
    name (``blocks.3.w_qkv`` -> ``w_qkv``)."""
    for name, array in arrays:
        expected = shapes[name.split(".")[-1]]
        if not isinstance(array, np.ndarray) or array.dtype not in WEIGHT_DTYPES or array.shape != expected:
            found = (array.dtype, array.shape) if isinstance(array, np.ndarray) else type(array).__name__
            raise error(f"{owner}.{name}: expected float32 or float16 {expected}, found {found}")


def content_hash(tag: str, config_text: str, arrays: Iterable[tuple[str, np.ndarray]],
                 source: WeightsSource | None = None) -> str:
    """sha256 (hex) of a format ``tag``, the configuration's text and every array's name, shape and raw
    bytes; when the arrays are still ``source``'s, its files' digest stands for the bytes (no array is read)."""
    arrays = list(arrays)
    digest = hashlib.sha256(tag.encode() + b"\0")
    digest.update(config_text.encode())
    if source is not None and source.matches(arrays):
        digest.update(b"\0files\0" + source.digest().encode())
        for name, array in arrays:
            digest.update(f"\0{name}{array.shape}\0".encode())
        return digest.hexdigest()
    for name, array in arrays:
        digest.update(f"\0{name}{array.shape}\0".encode())
        digest.update(memoryview(np.ascontiguousarray(array)).cast("B"))
    return digest.hexdigest()
