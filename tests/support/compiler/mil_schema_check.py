"""Independent schema check: replay each op of a parsed MIL program through coremltools' MIL builder
(iOS18 opset) and compare every declared output type with coremltools' own type inference.

coremltools 9.0 is optional (``pip install coremltools==9.0 'numpy<2.4'`` in a venv); :func:`coremltools`
returns None when it is not installed (an installed but broken coremltools raises).
"""

from __future__ import annotations

import importlib.util
import struct
from typing import Any

import numpy as np

NUMPY = {"fp16": np.float16, "fp32": np.float32, "int32": np.int32, "bool": np.bool_, "int8": np.int8, "uint8": np.uint8}


def coremltools() -> Any | None:
    """The coremltools module, or None when it is not installed."""
    if importlib.util.find_spec("coremltools") is None:
        return None
    import coremltools as ct

    return ct


def _kind(value: Any) -> str:
    return str(value.kind).rsplit(".", 1)[-1]


def _blob(value: Any, weights: dict[str, bytes]) -> np.ndarray:
    data = weights[value.blob_path]
    header = int(value.blob_offset)
    assert struct.unpack_from("<I", data, header)[0] == 0xDEADBEEF, f"{value.blob_path}: no chunk at {header}"
    size, start = struct.unpack_from("<II", data, header + 8)[0], struct.unpack_from("<I", data, header + 16)[0]
    return np.frombuffer(data[start:start + size], dtype=NUMPY[value.type.dtype]).reshape(list(value.type.shape))


def const_value(value: Any, weights: dict[str, bytes]) -> Any:
    """The numpy/python value of a parsed ``const`` val."""
    dtype = value.type.dtype
    kind = _kind(value)
    if kind == "blob":
        return _blob(value, weights)
    if kind == "list":
        return np.array(list(value.numbers), dtype=NUMPY[dtype]).reshape(list(value.type.shape))
    if dtype == "string":
        return value.text
    return NUMPY[dtype](value.numbers[0])


def replay(program: Any, weights: dict[str, bytes]) -> list[str]:
    """Mismatches between declared types and coremltools' inference ("" list when all agree)."""
    ct = coremltools()
    from coremltools.converters.mil.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    mismatches: list[str] = []
    specs = [mb.TensorSpec(shape=tuple(t.shape), dtype=types.string_to_builtin(t.dtype)) for _, t in program.inputs]
    names = [name for name, _ in program.inputs]

    def run(args: list[Any]) -> Any:
        env = dict(zip(names, args))
        for op in program.operations:
            if op.op == "const":
                var = mb.const(val=const_value(op.val, weights), name=op.name)
            else:
                var = getattr(mb, op.op)(**{a.name: env[a.refs[0]] for a in op.args}, name=op.name)
            env[op.output] = var
            got = f"{types.builtin_to_string(var.dtype)} {list(var.shape)}"
            want = f"{op.type.dtype} {list(op.type.shape)}"
            if got != want:
                mismatches.append(f"{op.output} = {op.op}(...): declared {want}, coremltools infers {got}")
        return tuple(env[o] for o in program.outputs)

    # mb.program reads the input names off the function's code object: build one with those parameters.
    scope: dict[str, Any] = {"run": run}
    exec(f"def main({', '.join(names)}):\n    return run([{', '.join(names)}])", scope)  # noqa: S102
    mb.program(input_specs=specs, opset_version=ct.target.iOS18)(scope["main"])
    return mismatches
