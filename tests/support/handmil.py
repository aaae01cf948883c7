"""Hand-written MIL text for tests, built with plain string formatting (independent of the emitter)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_DTYPES = {np.dtype(np.float16): "fp16", np.dtype(np.float32): "fp32", np.dtype(np.int32): "int32",
           np.dtype(np.int8): "int8", np.dtype(np.uint8): "uint8", np.dtype(np.bool_): "bool"}


def ttype(dtype: str, shape: Sequence[int]) -> str:
    return f"tensor<{dtype}, [{', '.join(str(d) for d in shape)}]>"


def program(inputs: dict[str, str], body: Sequence[str], outputs: Sequence[str]) -> str:
    """A program with `inputs` (name -> type text), statements `body` and returned `outputs`."""
    params = ", ".join(f"{t} {n}" for n, t in inputs.items())
    lines = "".join(f"        {s}\n" for s in body)
    return f"program(1.3)\n{{\n    func main<ios18>({params}) {{\n{lines}    }} -> ({', '.join(outputs)});\n}}\n"


def const(name: str, dtype: str, value: object, shape: Sequence[int] | None = None) -> str:
    """A const() statement: a scalar when shape is None, else a literal list."""
    def lit(v: object) -> str:
        if dtype == "bool":
            return "true" if v else "false"
        if dtype == "string":
            return f'"{v}"'
        return repr(float(v)) if dtype in ("fp16", "fp32") else str(int(v))
    if shape is None:
        return f'{dtype} {name} = const()[name=string("{name}"), val={dtype}({lit(value)})];'
    values = ",".join(lit(v) for v in np.asarray(value).ravel())
    return f'{ttype(dtype, shape)} {name} = const()[name=string("{name}"), val={ttype(dtype, shape)}([{values}])];'


def blob_const(name: str, dtype: str, shape: Sequence[int], path: str, offset: int = 64) -> str:
    t = ttype(dtype, shape)
    return (f'{t} {name} = const()[name=string("{name}"), '
            f'val={t}(BLOBFILE(path=string("{path}"), offset=uint64({offset})))];')


def op(out: str, out_type: str, name: str, **args: str | Sequence[str]) -> str:
    """`out_type out = name(args...)`; args in alphabetical order, a list/tuple value is a tuple."""
    def arg(v: str | Sequence[str]) -> str:
        return v if isinstance(v, str) else f"({', '.join(v)})"
    spelled = ", ".join(f"{k}={arg(v)}" for k, v in sorted(args.items()))
    return f'{out_type} {out} = {name}({spelled})[name=string("{out}")];'


def blobfile(payload: bytes) -> bytes:
    """A one-tensor fp16 BLOBFILE laid out by hand from docs/hardware.md §5."""
    return blobfile_many([payload])[0]


def blobfile_many(payloads: Sequence[bytes]) -> tuple[bytes, list[int]]:
    """One fp16 BLOBFILE holding every payload, laid out by hand as coremltools' StorageWriter does (count
    field, 64-byte aligned chunks), and each payload's MIL offset."""
    out = bytearray(64)
    out[0:4] = len(payloads).to_bytes(4, "little")
    out[4] = 2
    offsets = []
    for payload in payloads:
        out += bytes(-len(out) % 64)
        offsets.append(len(out))
        chunk = bytearray(64)
        chunk[0:4] = (0xDEADBEEF).to_bytes(4, "little")
        chunk[4] = 1  # fp16
        chunk[8:12] = len(payload).to_bytes(4, "little")
        chunk[16:20] = (len(out) + 64).to_bytes(4, "little")
        out += chunk + payload
    return bytes(out), offsets


SEVERAL_SURFACES = {"surface_counts": (16, 16)}
"""``orion.compile`` options for a hand-written program with several input or output surfaces that tests
something else: the counts a probe report proving 16 of each allows (the hardware profile's modelled rule
binds one input surface and six outputs, ANE-37, which ``tests/compiler/test_io_packing.py`` tests)."""
