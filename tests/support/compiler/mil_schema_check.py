"""Independent schema check: replay each op of a parsed MIL program through coremltools' MIL builder
(iOS18 opset) and compare every declared output type with coremltools' own type inference.

coremltools 9.0 is optional (``pip install coremltools==9.0 'numpy<2.4'`` in a venv); :func:`coremltools`
returns None when it is not installed (an installed but broken coremltools raises).
"""

from __future__ import annotations

import hashlib
import importlib.util
import struct
import threading
from typing import Any

import numpy as np

NUMPY = {"fp16": np.float16, "fp32": np.float32, "int32": np.int32, "bool": np.bool_, "int8": np.int8, "uint8": np.uint8}
SUB_BYTE = {"int4": 4, "uint4": 4, "uint6": 6}  # bits per element


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
    dtype, shape = value.type.dtype, list(value.type.shape)
    if dtype in SUB_BYTE:  # packed LSB first (coremltools' MILBlob); coremltools' own numpy dtype for it
        from coremltools.converters.mil.mil import types

        bits = SUB_BYTE[dtype]
        count = int(np.prod(shape))
        flat = np.unpackbits(np.frombuffer(data[start:start + size], np.uint8), bitorder="little")[:count * bits]
        values = (flat.reshape(count, bits).astype(np.int64) << np.arange(bits)).sum(axis=1)
        if dtype == "int4":
            values = np.where(values >= 8, values - 16, values)
        return values.astype(getattr(types, f"np_{dtype}_dtype")).reshape(shape)
    return np.frombuffer(data[start:start + size], dtype=NUMPY[dtype]).reshape(shape)


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


def _signature(op: Any, declared: dict[str, Any], consts: dict[str, Any], weights: dict[str, bytes]) -> tuple:
    """What coremltools' inference of `op` reads: its kind, each operand's declared type and (for a
    const that is not a blob) value, and the type `op` declares."""
    def operand(ref: str) -> tuple:
        t = declared[ref]
        value = consts.get(ref)
        shown = "" if value is None or _kind(value) == "blob" else repr(const_value(value, weights))
        return t.dtype, tuple(t.shape), shown
    attributes = tuple((k, v.type.dtype, tuple(v.type.shape), "" if _kind(v) == "blob" else repr(const_value(v, weights)))
                       for k, v in op.attributes)  # a constexpr op's parameters written as attributes
    inline = tuple((a.name, a.literal.type.dtype, tuple(a.literal.type.shape)) for a in op.args if a.literal is not None)
    return (op.op, tuple((a.name, tuple(operand(r) for r in a.refs)) for a in op.args), attributes + inline,
            op.type.dtype, tuple(op.type.shape))


def replay(program: Any, weights: dict[str, bytes], seen: set[tuple] | None = None) -> list[str]:
    """Mismatches between declared types and coremltools' inference (an empty list when all agree).

    Each op is rebuilt on its own, its tensor operands as inputs of their declared types and its
    consts as consts: as every declared type is checked, that checks what rebuilding the whole
    program does. An op whose signature is in `seen` (shared across programs) is not rebuilt again.
    """
    ct = coremltools()
    from coremltools.converters.mil.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    seen = set() if seen is None else seen
    declared: dict[str, Any] = dict(program.inputs)
    consts: dict[str, Any] = {}
    mismatches: list[str] = []
    for op in program.operations:
        declared[op.output] = op.type
        if op.op == "const":
            consts[op.output] = op.val
            continue
        signature = _signature(op, declared, consts, weights)
        if signature in seen:
            continue
        seen.add(signature)
        operands = list(dict.fromkeys(r for a in op.args for r in a.refs if r not in consts))

        def run(args: list[Any], op: Any = op, operands: list[str] = operands) -> Any:
            env = dict(zip(operands, args))
            for ref in dict.fromkeys(r for a in op.args for r in a.refs if r in consts):
                env[ref] = mb.const(val=const_value(consts[ref], weights), name=ref)
            attributes = {k: const_value(v, weights) for k, v in op.attributes}
            attributes.update({a.name: const_value(a.literal, weights) for a in op.args if a.literal is not None})
            var = getattr(mb, op.op)(**{a.name: env[a.refs[0]] for a in op.args if a.literal is None}, **attributes,
                                     name=op.name)
            got = f"{types.builtin_to_string(var.dtype)} {list(var.shape)}"
            want = f"{op.type.dtype} {list(op.type.shape)}"
            if got != want:
                mismatches.append(f"{op.output} = {op.op}(...): declared {want}, coremltools infers {got}")
            return var

        # mb.program reads the input names off the function's code object: build one with those parameters.
        params = [f"x{k}" for k in range(len(operands))]
        scope: dict[str, Any] = {"run": run}
        exec(f"def main({', '.join(params)}):\n    return run([{', '.join(params)}])", scope)  # noqa: S102
        specs = [mb.TensorSpec(shape=tuple(declared[r].shape), dtype=types.string_to_builtin(declared[r].dtype))
                 for r in operands]
        mb.program(input_specs=specs, opset_version=ct.target.iOS18)(scope["main"])
    return mismatches


class Replayer:
    """Replays programs as the suite lowers them (each distinct MIL text once, each op signature once) and keeps
    the mismatches, by test id: not the programs and their weights, which for the suite's published-shape models
    would be gigabytes held to its end. Without coremltools it records nothing (the replay test skips)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a server's worker thread lowers too
        self._texts: set[bytes] = set()
        self._seen: set[tuple] = set()
        self.failures: list[str] = []

    @property
    def programs(self) -> int:
        """Distinct programs replayed."""
        return len(self._texts)

    def __call__(self, test_id: str, text: str, weights: dict[str, bytes]) -> None:
        if coremltools() is None:
            return
        from orion import mil

        key = hashlib.sha256(text.encode()).digest()
        with self._lock:
            if key in self._texts:
                return
            self._texts.add(key)
            try:
                mismatches = replay(mil.parse(text), weights, self._seen)
            except Exception as e:  # noqa: BLE001 -- reported by the replay test, not by the test that lowered
                mismatches = [f"the replay raised {type(e).__name__}: {e}"]
            self.failures.extend(f"{test_id}: {m}" for m in mismatches)
