"""Weights I/O shared by the models: safetensors files (single or sharded, read through a read-only
map, BF16 without a bfloat16 dtype, written in F32/F16/BF16), progress settings for large
checkpoints, and the content hash that identifies a model's weights in the program cache.

Loaded weights keep the precision the file stores and are not copied when it is F32 or F16: each
array is a read-only float32 or float16 view of the file's map, so only the pages something reads
are in memory, and :meth:`WeightsSource.release_pages` drops them again after the programs are
built (which hold their own fp16 copy: the only resident one). A file with BF16 (or F64) tensors is converted
once, BF16 to F16 (bf16 values in fp16's normal range are exact in fp16, and the programs compute in fp16
anyway) and F64 to F32, into a copy in the program cache (``program_cache.converted_file``), whose map then
serves as an F16 file's does: a start maps it instead of converting again, and its pages are dropped as a map's
are. With the cache off (or not writable) the tensors are converted into memory. Rows of a table looked up a few at a
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import BinaryIO

import numpy as np

from orion import origins
from orion._core import kernels
from orion.errors import OrionError
from orion.graph import lineage
from orion.runtime.pages import map_of, release_pages

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# The dtypes a model directory is written in: name -> safetensors code (write_safetensors).
SAVE_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
PROGRESS_EVERY = 50  # tensors between progress lines
PROGRESS_MIN_BYTES = 64 << 20  # with progress=None, report only for files at least this large


WEIGHT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))  # what a model's weight arrays may be


# Safetensors dtypes a model reads converted, and what to; F32 and F16 are mapped as they are (little-endian).
CONVERTED_DTYPES = {"BF16": "F16", "F64": "F32"}
COPY_VERSION = 1  # the layout of converted copies (_copy_layout)


class MappedSafetensors:
    """A safetensors file mapped read-only; ``array(name)`` gives one tensor at its stored precision
    (a view of the map), ``float32(name)`` as a float32 array. ``copy``: the map of the file's converted copy
    (``convert`` and a BF16 or F64 tensor in it, a little-endian machine and the cache on), where ``array``
    reads the converted tensors."""

    def __init__(self, path: Path, convert: bool = True) -> None:
        self.path = path
        self.file = path.open("rb")  # kept open: the file as mapped, even if its name is replaced later
        weakref.finalize(self, self.file.close)  # closed with this object (no ResourceWarning whenever it is collected)
        self.map = mmap.mmap(self.file.fileno(), 0, access=mmap.ACCESS_READ)
        (header_len,) = struct.unpack_from("<Q", self.map, 0)
        self.header = json.loads(self.map[8:8 + header_len])
        self.data_start = 8 + header_len
        self.address = np.frombuffer(self.map, dtype=np.uint8, count=1).ctypes.data  # where the map starts
        self.digest: str | None = None  # what names this file's bytes when known without hashing it (a copy's)
        self.copy: MappedSafetensors | None = None
        if convert and sys.byteorder == "little" and any(
                e["dtype"] in CONVERTED_DTYPES for n, e in self.header.items() if n != "__metadata__"):
            self.copy = _converted_copy(self)

    def views(self) -> list[MappedSafetensors]:
        """The maps arrays of this file may view: its own, and its converted copy's."""
        return [self] if self.copy is None else [self, self.copy]

    def offset_of(self, array: np.ndarray) -> int | None:
        """The file offset of ``array``'s first byte when it is a C-contiguous view of this map, else None."""
        start = array.ctypes.data - self.address
        if not array.flags.c_contiguous or start < 0 or start + array.nbytes > len(self.map):
            return None
        return start if map_of(array) is self.map else None

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a read-only array of a :data:`WEIGHT_DTYPES` type: a view of the map when
        stored as F32 or F16 (on a little-endian machine), else of the converted copy's, else converted
        (BF16 to float16, F64 to float32)."""
        entry = self.header[name]
        if entry["dtype"] in ("F32", "F16") and sys.byteorder == "little":
            array = self._stored(name)
        elif self.copy is not None:
            array = self.copy.array(name)
        else:
            array = _converted(self._stored(name), entry["dtype"])
            array.flags.writeable = False
        array = array.reshape(entry["shape"])
        origins.record(array, f"{self.path.name}: tensor {name!r}")  # errors about its values name it
        return array

    def float32(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a read-only float32 array: a view of the map when stored as F32 (on a
        little-endian machine), else converted (F16, F64; BF16 widened without a bfloat16 dtype)."""
        entry = self.header[name]
        raw = self._stored(name)
        if entry["dtype"] == "BF16":
            array = _bf16_to_f32(raw)
        elif entry["dtype"] == "F32" and sys.byteorder == "little":
            array = raw
        else:
            array = raw.astype(np.float32)
        array = array.reshape(entry["shape"])
        array.flags.writeable = False
        origins.record(array, f"{self.path.name}: tensor {name!r}")  # errors about its values name it
        return array

    def _stored(self, name: str) -> np.ndarray:
        """Tensor ``name``'s elements as stored (BF16 as uint16), flat: a view of the map."""
        entry = self.header[name]
        start, end = entry["data_offsets"]
        stored = np.dtype(_STORED[entry["dtype"]])
        return np.frombuffer(self.map, dtype=stored, count=(end - start) // stored.itemsize,
                             offset=self.data_start + start)


_STORED = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "BF16": "<u2"}


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _converted(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Stored elements ``raw`` of safetensors type ``dtype`` as float16 (BF16, F16) or float32 (F64, F32). Values
    beyond the type's range become infinite (a program baking one is refused: ANE-25)."""
    with np.errstate(over="ignore"):
        if dtype == "BF16":
            return _bf16_to_f32(raw).astype(np.float16)
        return raw.astype(np.float32 if dtype in ("F64", "F32") else np.float16)


def copy_header(tensors: Iterable[tuple[str, str, Sequence[int]]], about: str) -> tuple[bytes, dict[str, int], int]:
    """A safetensors header of ``tensors`` (name, dtype, shape), stored in that order: its bytes with the 8-byte
    length before them, padded so the data starts at a multiple of 64 bytes (``about`` in its metadata), each
    tensor's data offset and the data's size."""
    header: dict[str, object] = {"__metadata__": {"format": "pt", "orion": about}}
    offsets, offset = {}, 0
    for name, dtype, shape in tensors:
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(_STORED[dtype]).itemsize
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offsets[name] = offset
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 64)
    return struct.pack("<Q", len(text)) + text, offsets, offset


def _copy_layout(f: MappedSafetensors) -> tuple[bytes, dict[str, int], int]:
    """:func:`copy_header` of ``f``'s converted copy: BF16 stored as F16 and F64 as F32, the F32 tensors first
    (so each is aligned for its type)."""
    def dtype(name: str) -> str:
        return CONVERTED_DTYPES.get(f.header[name]["dtype"], f.header[name]["dtype"])

    names = sorted((n for n in f.header if n != "__metadata__"), key=lambda n: dtype(n) != "F32")
    return copy_header(((n, dtype(n), f.header[n]["shape"]) for n in names), f"converted copy {COPY_VERSION}")


COPY_CHUNK = 1 << 22  # elements converted at a time (16 MiB of float32)


Layout = tuple[bytes, dict[str, int], int]  # a converted copy's header, data offsets and data size (copy_header)


def _write_copy(f: MappedSafetensors, layout: Layout, out: BinaryIO) -> None:
    """Writes ``f``'s converted copy (laid out as :func:`_copy_layout` says), a chunk at a time, then drops the
    pages of ``f`` that it read."""
    head, offsets, _ = layout
    out.write(head)
    for name in offsets:
        raw, dtype = f._stored(name), f.header[name]["dtype"]
        for i in range(0, raw.size, COPY_CHUNK):
            part = raw[i:i + COPY_CHUNK]
            out.write(memoryview(_converted(part, dtype) if dtype in CONVERTED_DTYPES else part).cast("B"))
    release_pages([f.map])


COPY_SAMPLES = 8  # elements of each tensor a converted copy is checked at, against the file's conversion


def copy_agrees(path: Path, layout: Layout, expected: Callable[[str], Iterable[tuple[int, bytes]]]) -> bool:
    """Whether the file at ``path`` is the converted copy ``layout`` describes: its header and size, and for each
    tensor the bytes ``expected(name)`` gives (``(offset in the tensor's data, bytes)`` pairs), read with ``pread``
    (no page of the copy is mapped)."""
    head, offsets, data_bytes = layout
    with path.open("rb") as copy:
        fd = copy.fileno()
        if os.fstat(fd).st_size != len(head) + data_bytes or os.pread(fd, len(head), 0) != head:
            return False
        return all(os.pread(fd, len(want), len(head) + offset + at) == want
                   for name, offset in offsets.items() for at, want in expected(name))


def _copy_samples(f: MappedSafetensors, name: str) -> Iterator[tuple[int, bytes]]:
    """Tensor ``name``'s first, last and evenly spaced elements, converted, where ``f``'s converted copy holds them
    (for :func:`copy_agrees`; read from ``f`` with ``pread``, so no page of it is mapped)."""
    entry = f.header[name]
    stored = np.dtype(_STORED[entry["dtype"]])
    start = f.data_start + entry["data_offsets"][0]
    count = (entry["data_offsets"][1] - entry["data_offsets"][0]) // stored.itemsize
    for i in sorted({0, count - 1, *range(0, count, max(count // COPY_SAMPLES, 1))}) if count else []:
        raw = np.frombuffer(os.pread(f.file.fileno(), stored.itemsize, start + i * stored.itemsize), stored)
        want = (_converted(raw, entry["dtype"]) if entry["dtype"] in CONVERTED_DTYPES else raw).tobytes()
        yield i * len(want), want


def _converted_copy(f: MappedSafetensors) -> MappedSafetensors | None:
    """The map of ``f``'s converted copy in the program cache (written on first use), or None with the cache off
    or not writable."""
    layout = _copy_layout(f)
    return mapped_copy(f.path, f.file, f"converted copy {COPY_VERSION}", layout, partial(_write_copy, f, layout),
                       partial(copy_agrees, layout=layout, expected=partial(_copy_samples, f)))


def mapped_copy(source: Path, file: BinaryIO | None, kind: str, layout: Layout, write: Callable[[BinaryIO], None],
                valid: Callable[[Path], bool]) -> MappedSafetensors | None:
    """The map of the converted copy (a safetensors file of F16/F32 tensors laid out as ``layout``) that ``kind`` of
    conversion makes of file ``source`` (``program_cache.converted_file``: written by ``write`` unless there and
    ``valid``), its ``digest`` set; None when the cache does not take it."""
    from orion.program_cache import converted_file

    head, _, data_bytes = layout
    found = converted_file(source, file, kind, len(head) + data_bytes, write, valid)
    if found is None:
        return None
    copy = MappedSafetensors(found[0], convert=False)
    copy.digest = found[1]
    return copy


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
            file_sha = file_digest(f.path, f.file) if f.digest is None else f.digest
            for mapped in f.views():
                lineage.name_source(mapped.map, file_sha if mapped is f else mapped.digest)
            h.update(bytes.fromhex(file_sha))
        return h.hexdigest()

    def release_pages(self) -> None:
        """Drops the files' pages from this process's memory (they stay readable)."""
        release_pages(m.map for f in self.files for m in f.views())



def table_rows(table: np.ndarray, ids: Sequence[int] | range, source: WeightsSource | None) -> np.ndarray:
    """``table[ids]`` (a new float32 array ``[len(ids), width]``) of a 2-D float32 or float16 ``table``. When
    ``table`` is a view of one of ``source``'s file maps, each row (a ``range`` of rows at once) is read from
    the file with ``os.preadv``, so no page of the map becomes resident; otherwise by indexing."""
    if source is not None and table.ndim == 2 and table.dtype in WEIGHT_DTYPES:
        for f in (m for mapped in source.files for m in mapped.views()):
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
    """Rows ``ids`` of the ``shape`` ``dtype`` table stored at ``offset`` in ``f``'s file, read with ``pread`` holding
    the GIL (``kernels.read_rows``: os.preadv releases it, and a decode step's reads then waited on the server's event
    loop)."""
    count, width = shape
    out = np.empty((len(ids), width), dtype=dtype)
    rows = list(ids)
    read = kernels.read_rows(f.file.fileno(), offset, width * dtype.itemsize, count, rows, out)
    if read < len(rows):
        raise OSError(f"{f.path}: short read of row {rows[read]} (was the file truncated?)")
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
