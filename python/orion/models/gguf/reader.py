"""A llama.cpp GGUF file: its metadata by key, and its tensors dequantized to float32 by the ``gguf``
package (by llama.cpp's authors; every type it dequantizes: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
the K-quants and the I-quants), in numpy's ``[rows, columns]`` order.

The header (metadata and tensor table) of a little-endian GGUF v2/v3 file is parsed here in one pass
(:func:`_parse`): the package's ``GGUFReader`` makes a numpy view per value, which took 3.5 s for the
98,000 strings of SmolLM2-135M's vocabulary and merges, on every load, where this takes 0.08 s. Any other
file goes to ``GGUFReader``; tests/models/test_gguf.py checks that both read the same metadata and tensor bytes.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from orion.errors import OrionError
from orion.models.weights_io import Layout, MappedSafetensors, copy_agrees, copy_header, mapped_copy
from orion.runtime.pages import release_pages

INSTALL_HINT = "pip install 'orion-ane[gguf]' (or pip install gguf)"


class GGUFError(OrionError, ValueError):
    """A GGUF file cannot be read, or holds a model Orion does not run."""


@lru_cache(maxsize=1)
def _package_version() -> str:
    """The gguf package's version (its dequantization makes the converted copies)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "unknown"


def _gguf_module() -> Any:
    try:
        import gguf
    except ImportError:
        raise GGUFError(f"reading GGUF files needs the gguf package (llama.cpp's reader): {INSTALL_HINT}") from None
    return gguf


class GGUFFile:
    """One GGUF file: ``metadata`` (key -> value, arrays as lists), ``architecture``, and its tensors by name."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise GGUFError(f"{self.path}: no such file; give a llama.cpp .gguf model file")
        gguf = _gguf_module()
        try:
            self.metadata, tensors = _parse(self.path, gguf)
        except _Unusual:
            self.metadata, tensors = _read_with_package(self.path, gguf)
        except (ValueError, OSError, IndexError, KeyError, struct.error) as err:
            raise GGUFError(f"{self.path}: not a readable GGUF file ({err}); it is truncated or another format") from None
        self.tensors = {t.name: t for t in tensors}
        self._types = gguf.GGMLQuantizationType
        self._dequantize = gguf.quants.dequantize
        self.architecture = self.get("general.architecture", str)
        self.copy: MappedSafetensors | None = None  # the converted copy float32() reads (prepare_tensors)
        self._row_orders: dict[str, np.ndarray] = {}

    def prepare_tensors(self, row_orders: Mapping[str, np.ndarray] | None = None) -> None:
        """How :meth:`float32` reads from here on: the tensors in ``row_orders`` with their first axis permuted (row
        ``i`` is the file's row ``row_orders[name][i]``), and, with the program cache on, from the file's converted
        copy: every tensor dequantized to float32 (and permuted) and checked finite once, on first use, then
        mapped. Without the cache (or with a copy over half its cap) each tensor is dequantized when asked."""
        orders = {name: np.asarray(order, dtype=np.int64) for name, order in (row_orders or {}).items()}
        if self.copy is not None and orders.keys() == self._row_orders.keys() and all(
                np.array_equal(order, self._row_orders[name]) for name, order in orders.items()):
            return
        self._row_orders = orders
        kind = self._copy_kind()
        layout = copy_header(((name, "F32", self.shape(name)) for name in sorted(self.tensors)), kind)
        self.copy = mapped_copy(self.path, None, kind, layout, partial(self._write_copy, layout),
                                partial(copy_agrees, layout=layout, expected=self._last_row))

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        """Metadata ``key`` (``kind``: the Python type(s) it must have); missing without a default is an error."""
        if key not in self.metadata:
            if default is ...:
                raise GGUFError(f"{self.path}: no metadata {key!r}, which a {self.metadata.get('general.architecture')!r} "
                                "model needs; the file is incomplete (re-convert it with llama.cpp)")
            return default
        value = self.metadata[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise GGUFError(f"{self.path}: metadata {key!r} is {value!r}, expected a {' or '.join(k.__name__ for k in kinds)}")
        return value

    def arch(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        """Architecture metadata ``<architecture>.<key>`` (e.g. ``llama.block_count``)."""
        return self.get(f"{self.architecture}.{key}", kind, default)

    def has(self, name: str) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        """Tensor ``name``'s numpy shape (GGUF stores ggml's reversed order)."""
        return tuple(int(n) for n in reversed(self.tensors[name].shape))

    def float32(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """Tensor ``name`` dequantized to float32, of ``shape`` (checked against the file): a read-only view of
        the converted copy when there is one, else a new array."""
        if name not in self.tensors:
            raise GGUFError(f"{self.path}: no tensor {name!r}, which this {self.architecture} model needs")
        found = self.shape(name)
        if found != tuple(shape):
            raise GGUFError(f"{self.path}: tensor {name!r} has shape {found}, expected {tuple(shape)} from the "
                            f"file's {self.architecture}.* metadata")
        if self.copy is not None:
            return self.copy.array(name)
        array = self._dequantized(name)
        return array[self._row_orders[name]] if name in self._row_orders else array

    def _dequantized(self, name: str, rows: slice = slice(None)) -> np.ndarray:
        """Tensor ``name`` (``rows`` of its first axis, as stored) dequantized to a new float32 array; refused
        unless finite."""
        tensor = self.tensors[name]
        try:
            array = self._dequantize(tensor.data[rows], tensor.tensor_type)
        except NotImplementedError:
            raise GGUFError(f"{self.path}: tensor {name!r} is stored as {tensor.tensor_type.name}, which the gguf "
                            f"package cannot dequantize; re-quantize the model to another type (e.g. Q8_0, Q4_K_M)") from None
        shape = self.shape(name)
        array = np.array(array, dtype=np.float32).reshape((-1, *shape[1:]) if rows != slice(None) else shape)
        if not np.isfinite(array).all():
            raise GGUFError(f"{self.path}: tensor {name!r} holds NaN or infinite values; the file is corrupt")
        return array

    def _copy_kind(self) -> str:
        """What makes the converted copy: the gguf package's dequantization and the row orders."""
        orders = hashlib.sha256()
        for name in sorted(self._row_orders):
            orders.update(name.encode() + b"\0" + self._row_orders[name].astype("<i8").tobytes())
        return f"gguf {_package_version()} float32 copy, rows {orders.hexdigest()}"

    def _write_copy(self, layout: Layout, out: BinaryIO) -> None:
        """Writes the converted copy (``layout``: every tensor as F32, by its GGUF name, in name order) a tensor at
        a time, then drops the pages of the file that it read."""
        head, offsets, _ = layout
        out.write(head)
        for name in offsets:
            array = self._dequantized(name)
            out.write(memoryview(array[self._row_orders[name]] if name in self._row_orders else array).cast("B"))
        release_pages(t.data for t in self.tensors.values())

    def _last_row(self, name: str) -> Iterator[tuple[int, bytes]]:
        """Tensor ``name``'s last row (along its first axis), dequantized, where the converted copy holds it (for
        ``copy_agrees``; a row costs the gguf package ~0.15 ms)."""
        shape = self.shape(name)
        if shape and shape[0]:
            last = shape[0] - 1
            stored = int(self._row_orders[name][last]) if name in self._row_orders else last
            want = self._dequantized(name, slice(stored, stored + 1)).tobytes()
            yield last * len(want), want

    def type_names(self) -> dict[str, int]:
        """How many tensors of each ggml type the file holds (e.g. ``{"Q4_1": 210, "F32": 61}``)."""
        counts: dict[str, int] = {}
        for tensor in self.tensors.values():
            counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
        return counts


@dataclass(frozen=True)
class _Tensor:
    """A tensor of the file, as ``GGUFReader``'s: ggml's dims (``shape``, innermost first), its type, and its
    bytes as a numpy view of the file (typed for plain types, uint8 rows for quantized ones)."""

    name: str
    shape: tuple[int, ...]
    tensor_type: Any
    data: np.ndarray


class _Unusual(Exception):
    """A GGUF file this module's parser leaves to the package's reader (big-endian, version 1)."""


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_PLAIN = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8, "I16": np.int16, "I32": np.int32,
          "I64": np.int64}


def _parse(path: Path, gguf: Any) -> tuple[dict[str, Any], list[_Tensor]]:
    """The metadata (key -> value, arrays as lists, without ``GGUF.*``) and tensors of a little-endian GGUF v2/v3
    file (the layout llama.cpp writes: gguf.md in its repository)."""
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    if magic != b"GGUF":
        raise ValueError(f"magic {magic!r}, not b'GGUF'")
    if version not in (2, 3):
        raise _Unusual
    at = 24

    def string() -> str:
        nonlocal at
        (n,) = struct.unpack_from("<Q", buf, at)
        at += 8 + n
        return buf[at - n:at].decode("utf-8")

    def value(kind: int) -> Any:
        nonlocal at
        if kind == _STRING:
            return string()
        if kind == _ARRAY:
            item, count = struct.unpack_from("<IQ", buf, at)
            at += 12
            if item in _SCALARS and item != 7:  # numbers: one view
                dtype = np.dtype(_SCALARS[item])
                values = np.frombuffer(buf, dtype, count, at).tolist()
                at += count * dtype.itemsize
                return values
            if item == _STRING:  # a vocabulary's or merges' strings: one loop, no call per string
                strings, length = [], struct.Struct("<Q").unpack_from
                for _ in range(count):
                    (n,) = length(buf, at)
                    strings.append(buf[at + 8:at + 8 + n].decode("utf-8"))
                    at += 8 + n
                return strings
            return [value(item) for _ in range(count)]
        if kind not in _SCALARS:
            raise ValueError(f"metadata value type {kind} is not GGUF's")
        (v,) = struct.unpack_from(_SCALARS[kind], buf, at)
        at += struct.calcsize(_SCALARS[kind])
        return v

    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = string()
        (kind,) = struct.unpack_from("<I", buf, at)
        at += 4
        metadata[key] = value(kind)
    infos = []
    for _ in range(n_tensors):
        name = string()
        (dims,) = struct.unpack_from("<I", buf, at)
        shape = struct.unpack_from(f"<{dims}Q", buf, at + 4)
        kind, offset = struct.unpack_from("<IQ", buf, at + 4 + 8 * dims)
        at += 16 + 8 * dims
        infos.append((name, shape, gguf.GGMLQuantizationType(kind), offset))
    alignment = int(metadata.get("general.alignment", 32))
    start = -(-at // alignment) * alignment
    tensors, names = [], set()
    for name, shape, kind, offset in infos:
        if name in names:
            raise ValueError(f"tensor {name!r} appears twice")
        names.add(name)
        np_shape = tuple(reversed(shape))
        if kind.name in _PLAIN:
            dtype, count = np.dtype(_PLAIN[kind.name]), int(np.prod(shape))
        else:
            block, size = gguf.GGML_QUANT_SIZES[kind]
            dtype, count = np.dtype(np.uint8), int(np.prod(shape)) // block * size
            np_shape = gguf.quants.quant_shape_to_byte_shape(np_shape, kind)
        data = np.frombuffer(buf, dtype, count, start + offset).reshape(np_shape)
        tensors.append(_Tensor(name, shape, kind, data))
    return metadata, tensors


def _read_with_package(path: Path, gguf: Any) -> tuple[dict[str, Any], list[Any]]:
    """What :func:`_parse` gives, by the package's ``GGUFReader`` (any file it reads)."""
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError) as err:
        raise GGUFError(f"{path}: not a readable GGUF file ({err}); it is truncated or another format") from None
    metadata: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            metadata[key] = field.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as err:
            raise GGUFError(f"{path}: metadata {key!r} is unreadable ({err})") from None
    return metadata, list(reader.tensors)
