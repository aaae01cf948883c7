"""Weights I/O shared by the models: safetensors files (single or sharded, BF16 read without a
bfloat16 dtype, written in F32/F16/BF16), progress settings for large checkpoints, and the content
hash that identifies a model's weights in the program cache."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from orion.errors import OrionError

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PROGRESS_EVERY = 50  # tensors between progress lines
PROGRESS_MIN_BYTES = 64 << 20  # with progress=None, report only for files at least this large


def raw_bf16(path: Path, name: str) -> np.ndarray:
    """A BF16 tensor read from the file's bytes (numpy has no bfloat16), widened to float32."""
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        entry = json.loads(f.read(header_len))[name]
        start, end = entry["data_offsets"]
        f.seek(8 + header_len + start)
        half = np.frombuffer(f.read(end - start), dtype="<u2")
    return (half.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


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
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise error(f"{index}: not a safetensors index with a 'weight_map' ({exc!r})") from exc
    shards: dict[Path, set[str] | None] = {}
    for name, file in weight_map.items():
        path = directory / str(file)
        if Path(str(file)).is_absolute() or ".." in Path(str(file)).parts or not path.is_file():
            raise error(f"{index}: tensor {name!r} is in shard {file!r}, which is not a file in {directory}")
        shards.setdefault(path, set()).add(name)  # type: ignore[union-attr]
    return shards


def check_float32_shapes(owner: str, arrays: Iterable[tuple[str, np.ndarray]], shapes: dict[str, tuple[int, ...]],
                         error: type[OrionError]) -> None:
    """Raise ``error`` unless every ``(name, array)`` is a float32 array of the shape ``shapes`` gives for
    the last part of its dotted name (``blocks.3.w_qkv`` -> ``w_qkv``)."""
    for name, array in arrays:
        expected = shapes[name.split(".")[-1]]
        if not isinstance(array, np.ndarray) or array.dtype != np.float32 or array.shape != expected:
            found = (array.dtype, array.shape) if isinstance(array, np.ndarray) else type(array).__name__
            raise error(f"{owner}.{name}: expected float32 {expected}, found {found}")


def content_hash(tag: str, config_text: str, arrays: Iterable[tuple[str, np.ndarray]]) -> str:
    """sha256 (hex) of a format ``tag``, the configuration's text and every array's name, shape and raw bytes."""
    digest = hashlib.sha256(tag.encode() + b"\0")
    digest.update(config_text.encode())
    for name, array in arrays:
        digest.update(f"\0{name}{array.shape}\0".encode())
        digest.update(memoryview(np.ascontiguousarray(array)).cast("B"))
    return digest.hexdigest()
