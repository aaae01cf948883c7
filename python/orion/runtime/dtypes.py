"""MIL dtype names and their numpy equivalents."""

from __future__ import annotations

import numpy as np

_NUMPY_OF_MIL: dict[str, np.dtype] = {
    "fp16": np.dtype(np.float16),
    "fp32": np.dtype(np.float32),
    "int32": np.dtype(np.int32),
    "int16": np.dtype(np.int16),
    "int8": np.dtype(np.int8),
    "uint16": np.dtype(np.uint16),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}


def numpy_dtype(mil_dtype: str) -> np.dtype:
    """The numpy dtype of a MIL tensor dtype (``"fp16"`` -> ``float16``)."""
    try:
        return _NUMPY_OF_MIL[mil_dtype]
    except KeyError:
        raise ValueError(f"MIL dtype {mil_dtype!r} has no numpy equivalent (known: {sorted(_NUMPY_OF_MIL)})") from None


def mil_dtype(dtype: np.dtype | type | str) -> str:
    """The MIL name of a numpy dtype (``float16`` -> ``"fp16"``)."""
    dt = np.dtype(dtype)
    for name, candidate in _NUMPY_OF_MIL.items():
        if candidate == dt:
            return name
    raise ValueError(f"numpy dtype {dt} has no MIL equivalent (use one of {sorted(_NUMPY_OF_MIL)})")
