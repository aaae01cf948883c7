"""A llama.cpp GGUF file read through the ``gguf`` package (by llama.cpp's authors): its metadata by
key, and its tensors dequantized to float32 (every type the package dequantizes: F32, F16, BF16,
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants and the I-quants), in numpy's ``[rows, columns]`` order."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from orion.errors import OrionError

INSTALL_HINT = "pip install 'orion-ane[gguf]' (or pip install gguf)"


class GGUFError(OrionError, ValueError):
    """A GGUF file cannot be read, or holds a model Orion does not run."""


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
            self._reader = gguf.GGUFReader(self.path)
        except (ValueError, OSError, IndexError, KeyError) as err:
            raise GGUFError(f"{self.path}: not a readable GGUF file ({err}); it is truncated or another format") from None
        self.metadata: dict[str, Any] = {}
        for key, field in self._reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                self.metadata[key] = field.contents()
            except (ValueError, IndexError, UnicodeDecodeError) as err:
                raise GGUFError(f"{self.path}: metadata {key!r} is unreadable ({err})") from None
        self.tensors = {t.name: t for t in self._reader.tensors}
        self._types = gguf.GGMLQuantizationType
        self._dequantize = gguf.quants.dequantize
        self.architecture = self.get("general.architecture", str)

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
        """Tensor ``name`` dequantized to a new float32 array of ``shape`` (checked against the file)."""
        if name not in self.tensors:
            raise GGUFError(f"{self.path}: no tensor {name!r}, which this {self.architecture} model needs")
        found = self.shape(name)
        if found != tuple(shape):
            raise GGUFError(f"{self.path}: tensor {name!r} has shape {found}, expected {tuple(shape)} from the "
                            f"file's {self.architecture}.* metadata")
        tensor = self.tensors[name]
        try:
            array = self._dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError:
            raise GGUFError(f"{self.path}: tensor {name!r} is stored as {tensor.tensor_type.name}, which the gguf "
                            f"package cannot dequantize; re-quantize the model to another type (e.g. Q8_0, Q4_K_M)") from None
        array = np.array(array, dtype=np.float32).reshape(shape)
        if not np.isfinite(array).all():
            raise GGUFError(f"{self.path}: tensor {name!r} holds NaN or infinite values; the file is corrupt")
        return array

    def type_names(self) -> dict[str, int]:
        """How many tensors of each ggml type the file holds (e.g. ``{"Q4_1": 210, "F32": 61}``)."""
        counts: dict[str, int] = {}
        for tensor in self.tensors.values():
            counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
        return counts
