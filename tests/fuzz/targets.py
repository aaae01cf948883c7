"""Fuzz targets: Orion's public entry points fed arbitrary bytes.

Each target takes one input (bytes) and must either succeed or raise an :class:`orion.OrionError`.
Anything else is a finding: a signal kills the process (the engine records a crash), and any other
exception propagates (the engine records it too). ``run.py`` drives these under atheris/libFuzzer.

Targets:
- ``mil``: MIL text, mutated as bytes, compiled under both profiles; what compiles is evaluated on
  surfaces it allocates and unloaded.
- ``grammar``: MIL programs assembled from the fuzz input by a small grammar (ops, shapes, arguments
  of the MIL dialect), so that mutations reach deep into type checking and the kernels.
- ``blobfile``: BLOBFILE bytes read back, and used as the weight file of a conv program.
- ``weights``: the weight dictionary of ``orion.compile``/``with_weights`` (paths, buffer kinds).
- ``model_dir``: a Hugging Face model directory with one of its files damaged, loaded (no compile).
- ``server``: HTTP requests to the OpenAI server (``target_server.py``); a 500 is a finding too.
- ``resume``: ``train --resume`` on a damaged run directory (``target_resume.py``).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from json_values import Draw
from target_resume import resume
from target_server import server

import orion
from orion import blobfile

MAX_EVAL_BYTES = 1 << 22  # evaluate only programs whose surfaces stay small: fuzzing is about the checks
CONV_MIL = """program(1.3)
{
    func main<ios18>(tensor<fp16, [1, 4, 1, 32]> x) {
        tensor<fp16, [4, 4, 1, 1]> w = const()[name=string("w"), val=tensor<fp16, [4, 4, 1, 1]>(BLOBFILE(path=string("@model_path/weights/w.bin"), offset=uint64(64)))];
        tensor<int32, [2]> d = const()[name=string("d"), val=tensor<int32, [2]>([1, 1])];
        int32 g = const()[name=string("g"), val=int32(1)];
        tensor<int32, [4]> p = const()[name=string("p"), val=tensor<int32, [4]>([0, 0, 0, 0])];
        string pt = const()[name=string("pt"), val=string("valid")];
        tensor<int32, [2]> s = const()[name=string("s"), val=tensor<int32, [2]>([1, 1])];
        tensor<fp16, [1, 4, 1, 32]> y = conv(dilations=d, groups=g, pad=p, pad_type=pt, strides=s, weight=w, x=x)[name=string("y")];
    } -> (y);
}
"""
W_PATH = "@model_path/weights/w.bin"


def _run(program: orion.Program) -> None:
    """Evaluate a compiled program once on zeroed surfaces, if they are small, then unload it."""
    try:
        sizes = [int(np.prod(s.shape, dtype=np.int64)) * s.dtype.itemsize
                 for s in [*program.inputs.values(), *program.outputs.values()]]
        if sizes and max(sizes) <= MAX_EVAL_BYTES and sum(sizes) <= 4 * MAX_EVAL_BYTES:
            ins, outs = program.allocate_surfaces()
            program.evaluate(ins, outs)
    finally:
        program.unload()


def _compile_and_run(text: bytes | str, weights: dict, profile: str) -> None:
    try:
        program = orion.compile(text, weights, profile=profile)
    except orion.OrionError:
        return
    try:
        _run(program)
    except orion.OrionError:
        pass


_BLOB_CONST = re.compile(rb"tensor<(\w+),\s*\[([^\]]*)\]>\(BLOBFILE\(path=string\(\"([^\"]*)\"\)")


def _weights_for(text: bytes) -> dict[str, bytes]:
    """A BLOBFILE of ones for every weight path the text names, sized from its declared type when small."""
    files = {}
    for dtype, dims, path in _BLOB_CONST.findall(text):
        try:
            count = int(np.prod([int(d) for d in dims.split(b",") if d.strip()], dtype=np.int64))
        except (ValueError, OverflowError):
            count = 1
        kind = np.int8 if dtype in (b"int8", b"uint8") else np.float16
        files[path.decode("utf-8", "replace")] = blobfile.write(np.ones(min(max(count, 1), 1 << 16), kind))
    return files


def mil(data: bytes) -> None:
    """Mutated MIL text; the first byte picks the profile. Every weight file it names is supplied."""
    if not data:
        return
    profile = "permissive" if data[0] & 1 else "hardware"
    _compile_and_run(data[1:], _weights_for(data[1:]), profile)


# -- grammar ---------------------------------------------------------------------------------------
# op -> its arguments: a bare name is a tensor operand, (name, kind) a const of that kind.
_OPS: dict[str, list] = {
    **{op: ["x", "y"] for op in ("add", "sub", "mul", "real_div")},
    **{op: ["x"] for op in ("tanh", "sigmoid", "exp", "relu", "identity", "gelu", "silu", "rsqrt", "sqrt")},
    "pow": ["x", ("y", "float")],
    "softmax": [("axis", "int"), "x"],
    **{op: [("axes", "ints"), ("keep_dims", "bool"), "x"] for op in ("reduce_sum", "reduce_max", "reduce_mean")},
    "reshape": [("shape", "ints"), "x"],
    "transpose": [("perm", "ints"), "x"],
    "cast": [("dtype", "string"), "x"],
    "slice_by_size": [("begin", "ints"), ("size", "ints"), "x"],
    "slice_by_index": [("begin", "ints"), ("end", "ints"), "x"],
    "matmul": [("transpose_x", "bool"), ("transpose_y", "bool"), "x", "y"],
    "conv": [("dilations", "ints"), ("groups", "int"), ("pad", "ints"), ("pad_type", "string"), ("strides", "ints"),
             ("weight", "ints"), "x"],
    "concat": [("axis", "int"), ("interleave", "bool"), "values"],
    "quantize": ["input", ("scale", "float"), ("zero_point", "int"), ("output_dtype", "string")],
    "dequantize": ["input", ("scale", "float"), ("zero_point", "int")],
    "constexpr_affine_dequantize": [("axis", "int"), ("quantized_data", "ints"), ("scale", "float"),
                                    ("zero_point", "int")],
}
_DTYPES = ["fp16", "fp32", "int32", "bool", "int8", "uint8", "int16", "uint16", "uint64", "string"]
_ODD_DIMS = [0, 1, 3, 7, 33, 257, 1 << 16, (1 << 31) - 1, 1 << 40, -1]


class _Reader(Draw):
    """The fuzz input's choices (:class:`json_values.Draw`), plus the MIL grammar's shapes and dtypes."""

    def dim(self, usual: int) -> int:
        return self.pick(_ODD_DIMS) if self.rare() else usual

    def shape(self) -> list[int]:
        if self.rare():
            return [self.dim(1) for _ in range(self.byte() % 7)]
        return [1, self.dim(self.pick([1, 4, 8, 16])), 1, self.dim(self.pick([1, 32, 64]))]

    def dtype(self) -> str:
        return self.pick(_DTYPES) if self.rare() else self.pick(["fp16", "fp16", "fp32"])


def _ttype(dtype: str, shape: list[int]) -> str:
    return f"tensor<{dtype}, [{', '.join(map(str, shape))}]>"


def _const(r: _Reader, name: str, kind: str, like: list[int]) -> str:
    """A const() statement of ``kind``, mostly with values that make sense for an operand of shape ``like``."""
    if kind == "int":
        return f'int32 {name} = const()[name=string("{name}"), val=int32({r.dim(r.pick([-1, 1, 3]))})];'
    if kind == "bool":
        return f'bool {name} = const()[name=string("{name}"), val=bool({r.pick(["true", "false"])})];'
    if kind == "float":
        dtype = r.pick(["fp16", "fp16", "fp32"])
        value = r.pick(["0.5", "-0.5", "2.0", "0.0", "65504.0", "1e9", "-1e-9", "0x1p-3", "-1.0"])
        return f'{dtype} {name} = const()[name=string("{name}"), val={dtype}({value})];'
    if kind == "string":
        value = r.pick(["fp16", "fp32", "valid", "same", "int8", "", "uint8"])
        return f'string {name} = const()[name=string("{name}"), val=string("{value}")];'
    n = len(like) if like and not r.rare() else r.byte() % 6
    values = [r.dim(r.pick([0, 1, *(like or [1])])) for _ in range(n)]
    return f'{_ttype("int32", [n])} {name} = const()[name=string("{name}"), val={_ttype("int32", [n])}([{", ".join(map(str, values))}])];'


def grammar(data: bytes) -> None:
    """A program assembled from grammar choices drawn from ``data``: mostly well-formed, with rules bent
    now and then (odd dims, dtypes, argument kinds, returned names)."""
    r = _Reader(data)
    types = {f"x{i}": (r.dtype(), r.shape()) for i in range(1 + r.byte() % 3)}
    params = ", ".join(f"{_ttype(*t)} {n}" for n, t in types.items())
    body: list[str] = []
    computed: list[str] = []
    for i in range(1 + r.byte() % 8):
        op = r.pick(sorted(_OPS))
        x = r.pick(sorted(types))
        dtype, shape = types[x]
        args = []
        for j, spec in enumerate(_OPS[op]):
            if isinstance(spec, str):
                operand = x if j == 0 or not r.byte() & 1 else r.pick(sorted(types))
                args.append(f"{spec}=({operand}, {x})" if spec == "values" else f"{spec}={operand}")
            else:
                name, kind = spec
                const = f"{op}{i}_{name}"
                body.append(_const(r, const, r.pick(["int", "ints", "bool", "float", "string"]) if r.rare() else kind,
                                   shape))
                args.append(f"{name}={const}")
        out = f"v{i}"
        out_type = (r.dtype(), r.shape()) if r.rare() else (dtype, shape)
        body.append(f'{_ttype(*out_type)} {out} = {op}({", ".join(sorted(args))})[name=string("{out}")];')
        types[out] = out_type
        computed.append(out)
    pool = sorted(types) if r.rare() else computed
    returns = sorted({r.pick(pool) for _ in range(1 + r.byte() % 3)})
    lines = "".join(f"        {s}\n" for s in body)
    text = f"program(1.3)\n{{\n    func main<ios18>({params}) {{\n{lines}    }} -> ({', '.join(returns)});\n}}\n"
    _compile_and_run(text, {}, r.pick(["hardware", "permissive"]))


# -- weights ---------------------------------------------------------------------------------------
def blobfile_bytes(data: bytes) -> None:
    """BLOBFILE bytes: read at a few offsets and dtypes, and compiled as the conv weight file."""
    for offset, dtype in ((64, np.float16), (0, np.float16), (128, np.int8)):
        try:
            blobfile.read(data, offset=offset, dtype=dtype)
        except orion.OrionError:
            pass
    _compile_and_run(CONV_MIL, {W_PATH: data}, "hardware")


def weights(data: bytes) -> None:
    """The weight dictionary: a fuzzed path, buffer kind and content."""
    r = _Reader(data)
    path = r.pick([W_PATH, "@model_path/weights/w.bin\0x", "weights/w.bin", "@model_path/../w.bin", "",
                   "@model_path/weights/" + data[8:24].decode("latin-1")])
    payload = np.frombuffer(data[24:], np.uint8)
    kind = r.byte() % 5
    good = blobfile.write(np.ones((4, 4, 1, 1), np.float16))
    value = (good if kind == 0 else bytearray(data[24:]) if kind == 1 else memoryview(good)[:: 1 + (r.byte() % 3)]
             if kind == 2 else payload[::-1] if kind == 3 else np.frombuffer(good, np.uint8)[::2])
    extra = {path: value}
    if r.byte() & 1:
        extra[W_PATH] = good
    _compile_and_run(CONV_MIL, extra, "hardware")
    try:
        program = orion.compile(CONV_MIL, {W_PATH: good})
    except orion.OrionError:
        return
    try:
        program.with_weights(extra).unload()
    except orion.OrionError:
        pass
    finally:
        program.unload()


# -- model directories -----------------------------------------------------------------------------
_MODEL_DIR: Path | None = None


def _model_dir() -> Path:
    """A valid tiny GPT-2 directory, written once per process."""
    global _MODEL_DIR
    if _MODEL_DIR is None:
        from orion.models.gpt2.config import GPT2Config
        from orion.models.gpt2.weights import random_weights, save_hf

        _MODEL_DIR = Path(tempfile.mkdtemp(prefix="orion-fuzz-model-"))
        config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
        save_hf(_MODEL_DIR, config, random_weights(config, 0))
    return _MODEL_DIR


def model_dir(data: bytes) -> None:
    """One file of a model directory replaced by, spliced with or truncated to fuzzed bytes."""
    from orion.models.gpt2.weights import load_hf

    if not data:
        return
    base = _model_dir()
    work = Path(tempfile.mkdtemp(prefix="orion-fuzz-case-"))
    try:
        for f in base.iterdir():
            shutil.copy(f, work / f.name)
        files = sorted(p.name for p in base.iterdir())
        target = work / files[data[0] % len(files)]
        original = target.read_bytes()
        mode = data[1] % 4 if len(data) > 1 else 0
        body = data[2:]
        if mode == 0:
            target.write_bytes(body)
        elif mode == 1:
            at = int.from_bytes(body[:4].ljust(4, b"\0"), "little") % max(1, len(original))
            target.write_bytes(original[:at] + body[4:] + original[at + len(body[4:]):])
        elif mode == 2:
            target.write_bytes(original[: len(body) % max(1, len(original))])
        elif target.suffix == ".json":
            try:
                doc = json.loads(original)
                key = sorted(doc)[body[0] % len(doc)] if doc and body else None
                if key is not None:
                    doc[key] = json.loads(body[1:].decode("utf-8", "replace") or "null")
                target.write_text(json.dumps(doc))
            except ValueError:
                target.write_bytes(body)
        try:
            load_hf(work)
        except orion.OrionError:
            pass
    finally:
        shutil.rmtree(work, ignore_errors=True)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "mil": mil, "grammar": grammar, "blobfile": blobfile_bytes, "weights": weights, "model_dir": model_dir,
    "server": server, "resume": resume,
}
