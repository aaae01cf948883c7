"""``python -m orion doctor --probe``: tiny programs that settle, on the machine they run on, the rules
the public reports disagree about (docs/hardware.md sections 3, 4, 6 and 7), and the report the compiler reads back.

On the ane backend each probe runs with Orion's own op bans lifted (``profile="permissive"``) and, for
surface probes, Orion's surface minimum lowered, so the hardware decides. On the emulator the probes
show the *modelled* (conservative) behaviour. The report is JSON::

    {"schema": 1, "orion": "0.1.0", "backend": "ane", "chip": "...", "os": "...", "machine": "...",
     "probes": {"<id>": {"rule": "ANE-12", "question": "...", "outcome": "works", "detail": "..."}}}

Outcomes: ``works`` (ran, output matches numpy), ``wrong_data`` (ran, output differs: silent wrong
data), ``compile_fails``, ``evaluate_fails``, ``refused`` (Orion's modelled rule refused it; the
emulator's answer), ``not_probed`` (needs hardware access Orion does not have yet).

:func:`load_report` turns a saved report into :class:`Relaxations` for ``orion.compile_graph(...,
probe_report=...)``; only probes run on the ``ane`` backend of *this* machine relax anything.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import orion
from orion import blobfile
from orion.limits import MAX_INPUT_SURFACES, MAX_OUTPUT_SURFACES, MIN_SURFACE_BYTES

SCHEMA = 1
HEADER = "program(1.3)\n{\n    func main<ios18>(%s) {\n%s    } -> (%s);\n}\n"


def _t(shape: tuple[int, ...], dtype: str = "fp16") -> str:
    return f"tensor<{dtype}, [{', '.join(map(str, shape))}]>"


def _mil(params: dict[str, tuple[int, ...]], body: list[str], outputs: list[str]) -> str:
    return HEADER % (", ".join(f"{_t(s)} {n}" for n, s in params.items()), "".join(f"        {b}\n" for b in body),
                     ", ".join(outputs))


def _const(name: str, dtype: str, value: str, shape: tuple[int, ...] | None = None) -> str:
    t = _t(shape, dtype) if shape else dtype
    v = f"{t}([{value}])" if shape else f"{dtype}({value})"
    return f'{t} {name} = const()[name=string("{name}"), val={v}];'


def _op(out: str, shape: tuple[int, ...], name: str, **args: str) -> str:
    return _op_typed(out, _t(shape), name, **args)


def _op_typed(out: str, type_text: str, name: str, **args: str) -> str:
    return f'{type_text} {out} = {name}({", ".join(f"{k}={v}" for k, v in sorted(args.items()))})[name=string("{out}")];'


@dataclass
class Probe:
    id: str
    rule: str
    question: str
    run: Callable[[str], tuple[str, str]]  # backend -> (outcome, detail)
    relaxes: str = ""  # what a "works" on the ane backend lets the compiler relax
    settles: str = ""  # what the answer decides, whatever it is


def _attempt(mil: str, arrays: dict[str, np.ndarray], expected: dict[str, np.ndarray], backend: str, *,
             weights: dict[str, bytes] | None = None, nbytes: int | None = None,
             in_sizes: dict[str, int] | None = None, surface_counts: tuple[int, int] | None = None,
             build_info: bool = True) -> tuple[str, str]:
    hardware = backend == "ane"
    smallest = min([nbytes or orion.MIN_SURFACE_BYTES, *(in_sizes or {}).values()])

    def refused(e: orion.ConstraintError) -> tuple[str, str]:
        # the emulator's refusal is the modelled answer; on the ANE it means Orion's own runtime check
        # stopped the probe before the hardware saw it
        return ("not_probed", f"Orion's runtime refuses it before the hardware: {e}") if hardware else ("refused", str(e))

    try:
        p = orion.compile(mil, weights, profile="permissive" if hardware else "hardware",
                          min_surface_bytes=(smallest if hardware else None), surface_counts=surface_counts,
                          build_info=build_info)
    except orion.ConstraintError as e:
        return refused(e)
    except orion.CompileError as e:
        return "compile_fails", str(e)
    try:
        ins = {n: orion.Surface(a.shape, "fp16", nbytes=(in_sizes or {}).get(n, nbytes)) for n, a in arrays.items()}
        outs = {n: orion.Surface(s.shape, "fp16", nbytes=nbytes) for n, s in p.outputs.items()}
        for n, a in arrays.items():
            ins[n].write(a)
        p.evaluate(ins, outs)
    except orion.ConstraintError as e:
        return refused(e)
    except (orion.EvaluateError, ValueError) as e:
        return "evaluate_fails", str(e)
    finally:
        p.unload()
    for name, want in expected.items():
        got = outs[name].read().astype(np.float32)
        if not np.allclose(got, want, rtol=2e-2, atol=2e-2):
            return "wrong_data", f"output {name}: max error {float(np.max(np.abs(got - want))):.4g}"
    return "works", "output matches numpy"


def _rng_input(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float16)


def _concat(backend: str) -> tuple[str, str]:
    s = (1, 64, 1, 384)
    x = _rng_input(s)
    mil = _mil({"x": s}, [_const("ax", "int32", "1"), _const("il", "bool", "false"),
                          _op("y", (1, 128, 1, 384), "concat", values="(x, x)", axis="ax", interleave="il")], ["y"])
    return _attempt(mil, {"x": x}, {"y": np.concatenate([x, x], axis=1).astype(np.float32)}, backend, nbytes=98304,
                    in_sizes={"x": MIN_SURFACE_BYTES})


def _conv_padding(backend: str) -> tuple[str, str]:
    """The pad/concat legalization's step: a [1, 1, 1, 1] conv of weight 1 whose custom padding adds zeros
    around W (here 16 on each side of the sequence); inf must stay where it is."""
    s, wide = (1, 64, 1, 384), (1, 64, 1, 416)
    x = _rng_input(s)
    x[0, 3, 0, 5], x[0, 9, 0, 0], x[0, 63, 0, 383] = np.inf, -np.inf, np.inf
    mil = _mil({"x": s}, [_const("rows", "int32", "1, 1, 64, 384", (4,)), _const("back", "int32", "1, 64, 1, 416", (4,)),
                          _const("W", "fp16", "1.0", (1, 1, 1, 1)), _const("dl", "int32", "1, 1", (2,)),
                          _const("gr", "int32", "1"), _const("pd", "int32", "0, 0, 16, 16", (4,)),
                          _const("pt", "string", '"custom"'), _const("st", "int32", "1, 1", (2,)),
                          _op_typed("r", _t((1, 1, 64, 384)), "reshape", shape="rows", x="x"),
                          _op("c", (1, 1, 64, 416), "conv", dilations="dl", groups="gr", pad="pd", pad_type="pt",
                              strides="st", weight="W", x="r"),
                          _op_typed("y", _t(wide), "reshape", shape="back", x="c")], ["y"])
    want = np.pad(x.astype(np.float32), [(0, 0), (0, 0), (0, 0), (16, 16)])
    return _attempt(mil, {"x": x}, {"y": want}, backend, nbytes=int(np.prod(wide)) * 2,
                    in_sizes={"x": MIN_SURFACE_BYTES})


def _reduce_mean(backend: str) -> tuple[str, str]:
    s = (1, 64, 1, 384)
    x = _rng_input(s)
    mil = _mil({"x": s}, [_const("ax", "int32", "1", (1,)), _const("kd", "bool", "true"),
                          _op("m", (1, 1, 1, 384), "reduce_mean", x="x", axes="ax", keep_dims="kd"),
                          _op("y", s, "add", x="x", y="m")], ["y"])
    want = (x.astype(np.float32) + x.astype(np.float32).mean(axis=1, keepdims=True))
    return _attempt(mil, {"x": x}, {"y": want}, backend)


def _softmax_extent(backend: str) -> tuple[str, str]:
    s = (1, 64, 1, 400)  # 400 lanes: not a power of two
    x = _rng_input(s)
    mil = _mil({"x": s}, [_const("ax", "int32", "3"), _op("y", s, "softmax", x="x", axis="ax")], ["y"])
    e = np.exp(x.astype(np.float32) - x.astype(np.float32).max(axis=3, keepdims=True))
    return _attempt(mil, {"x": x}, {"y": e / e.sum(axis=3, keepdims=True)}, backend, nbytes=51200)


def _small_surface(backend: str) -> tuple[str, str]:
    s = (1, 64, 1, 64)  # fp16: 8,192 bytes, the size [M] saw work on M5
    x = _rng_input(s)
    mil = _mil({"x": s}, [_op("y", s, "tanh", x="x")], ["y"])
    return _attempt(mil, {"x": x}, {"y": np.tanh(x.astype(np.float32))}, backend, nbytes=8192)


def _channel_vector(backend: str) -> tuple[str, str]:
    s = (1, 768, 1, 1)  # a [1,C,1,1] tensor in a surface padded to the minimum
    x = _rng_input(s)
    mil = _mil({"x": s}, [_op("y", s, "tanh", x="x")], ["y"])
    return _attempt(mil, {"x": x}, {"y": np.tanh(x.astype(np.float32))}, backend, nbytes=MIN_SURFACE_BYTES)


def _nonuniform(backend: str) -> tuple[str, str]:
    a, b = (1, 64, 1, 384), (1, 64, 1, 512)
    x, y = _rng_input(a, 1), _rng_input(b, 2)
    mil = _mil({"x": a, "y": b}, [_op("u", a, "tanh", x="x"), _op("v", b, "tanh", x="y")], ["u", "v"])
    return _attempt(mil, {"x": x, "y": y}, {"u": np.tanh(x.astype(np.float32)), "v": np.tanh(y.astype(np.float32))},
                    backend, nbytes=65536, in_sizes={"x": MIN_SURFACE_BYTES, "y": 65536},
                    surface_counts=(2, 2))  # the question is the sizes: the count rule (ANE-37) is not probed here


def _patch_path(backend: str) -> tuple[str, str]:
    c = 64
    s = (1, c, 1, 384)
    x = _rng_input(s)
    path = "@model_path/weights/w.bin"
    mil = _mil({"x": s}, [
        f'{_t((c, c, 1, 1))} W = const()[name=string("W"), val={_t((c, c, 1, 1))}(BLOBFILE(path=string("{path}"), '
        'offset=uint64(64)))];',
        _const("dl", "int32", "1, 1", (2,)), _const("gr", "int32", "1"), _const("pd", "int32", "0, 0, 0, 0", (4,)),
        _const("pt", "string", '"valid"'), _const("st", "int32", "1, 1", (2,)),
        _op("y", s, "conv", dilations="dl", groups="gr", pad="pd", pad_type="pt", strides="st", weight="W", x="x")],
        ["y"])
    w1, w2 = (np.random.default_rng(k).standard_normal((c, c, 1, 1)) / 8 for k in (1, 2))
    try:
        p = orion.compile(mil, {path: blobfile.write(w1)})
        q = p.with_weights({path: blobfile.write(w2)})
        got = q(x=x)["y"].astype(np.float32)
        p.unload()
        q.unload()
    except orion.OrionError as e:
        return "compile_fails", str(e)
    want = np.einsum("oi,is->os", w2[:, :, 0, 0].astype(np.float16).astype(np.float32), x[0, :, 0, :].astype(np.float32))
    ok = np.allclose(got[0, :, 0, :], want, rtol=2e-2, atol=2e-2)
    return ("works", "outputs follow the new weights without a compile") if ok else ("wrong_data", "stale weights")


QUANTIZED_OPS = ("quantize", "dequantize")
"""The disputed ops (ANE-35) the quantize probe settles."""
QUANTIZED_WEIGHT_OPS = ("constexpr_affine_dequantize",)
"""The disputed op (ANE-35) the int8-weight probe settles (``quant="int8"`` models need it)."""


def _quantized_ops(backend: str) -> tuple[str, str]:
    s = (1, 64, 1, 64)
    x = _rng_input(s)
    mil = _mil({"x": s}, [_const("sc", "fp16", "0.03125"), _const("zp", "int8", "0"), _const("dt", "string", '"int8"'),
                          (f'{_t(s, "int8")} q = quantize(input=x, output_dtype=dt, scale=sc, zero_point=zp)'
                           '[name=string("q")];'),
                          _op("y", s, "dequantize", input="q", scale="sc", zero_point="zp")], ["y"])
    want = np.clip(np.round(x.astype(np.float32) / 0.03125), -128, 127) * 0.03125
    return _attempt(mil, {"x": x}, {"y": want}, backend)


def _conv_consts() -> list[str]:
    return [_const("st", "int32", "1,1", (2,)), _const("pd", "int32", "0,0,0,0", (4,)), _const("dl", "int32", "1,1", (2,)),
            _const("gr", "int32", "1"), _const("pt", "string", '"valid"')]


def _conv(out: str, shape: tuple[int, ...], weight: str, x: str = "x") -> str:
    return _op(out, shape, "conv", dilations="dl", groups="gr", pad="pd", pad_type="pt", strides="st", weight=weight,
               x=x)


def _blob(name: str, type_text: str, path: str, offset: int = 64) -> str:
    return (f'{type_text} {name} = const()[name=string("{name}"), '
            f'val={type_text}(BLOBFILE(path=string("{path}"), offset=uint64({offset})))];')


def _quantized_weights(backend: str, *, attribute_form: bool = True) -> tuple[str, str]:
    """A 1x1 conv whose weight is int8 data with per-output-channel fp16 scales (what quant="int8" emits):
    ``constexpr_affine_dequantize`` with its parameters as attributes (coremltools' and [M]'s form, what Orion
    emits) or as named-const operands (Orion's old form, the one [E]'s failing probe used)."""
    c, s = 64, (1, 64, 1, 64)
    x = _rng_input(s)
    rng = np.random.default_rng(1)
    q = rng.integers(-127, 128, size=(c, c, 1, 1)).astype(np.int8)
    scale = (np.exp2(rng.integers(-10, -6, size=c)) * rng.integers(8, 16, size=c)).astype(np.float16)
    path = "@model_path/weights/int8.bin"
    data, (q_at, sc_at) = blobfile.write_many([q, scale])  # one file: int8 (code 4) then fp16 (code 1)
    qt, st = _t((c, c, 1, 1), "int8"), _t((c,))
    if attribute_form:
        dequantize = [f'{_t((c, c, 1, 1))} W = constexpr_affine_dequantize()[axis=int32(0), name=string("W"), '
                      f'quantized_data={qt}(BLOBFILE(path=string("{path}"), offset=uint64({q_at}))), '
                      f'scale={st}(BLOBFILE(path=string("{path}"), offset=uint64({sc_at}))), zero_point=int8(0)];']
    else:
        dequantize = [_blob("q", qt, path, q_at), _blob("sc", st, path, sc_at), _const("zp", "int8", "0"),
                      _const("ax", "int32", "0"),
                      _op_typed("W", _t((c, c, 1, 1)), "constexpr_affine_dequantize", axis="ax", quantized_data="q",
                                scale="sc", zero_point="zp")]
    mil = _mil({"x": s}, [*dequantize, *_conv_consts(), _conv("y", s, "W")], ["y"])
    w = q[:, :, 0, 0].astype(np.float32) * scale.astype(np.float32)[:, None]
    want = w @ x[0, :, 0, :].astype(np.float32)
    return _attempt(mil, {"x": x}, {"y": want.reshape(s)}, backend, weights={path: data})


LUT_WEIGHT_OPS = ("constexpr_lut_to_dense",)
"""The disputed op (ANE-38) the LUT-weight probe settles (``quant="lut4"``/``"lut6"`` models need it)."""
INT4_WEIGHT_OPS = ("constexpr_blockwise_shift_scale",)
"""The disputed op (ANE-38) the int4-weight probe settles (``quant="int4"`` models need it)."""


def _low_bit_weights(backend: str, mode: str) -> tuple[str, str]:
    """A 1x1 conv whose weight is stored as ``quant=mode`` stores it, in the iOS 18 form coremltools writes
    and ``orion.emit`` emits: ``constexpr_lut_to_dense`` with uint4/uint6 indices and an fp16 LUT per 8
    output channels, or ``constexpr_blockwise_shift_scale`` with uint4 data and offsets and fp16 scales per
    32 inputs, their parameters inline BLOBFILE values in one weight file."""
    from orion import quant

    c, s = 64, (1, 64, 1, 64)
    x = _rng_input(s)
    shape = (c, c, 1, 1)
    w = quant.quantize(np.random.default_rng(2).standard_normal(shape) * 0.1, mode, "W")
    path = "@model_path/weights/low_bit.bin"

    def blob(type_text: str, at: int) -> str:
        return f'{type_text}(BLOBFILE(path=string("{path}"), offset=uint64({at})))'

    if isinstance(w, quant.LutWeight):
        lut = w.lut.astype(np.float16).reshape(c // w.group, 1, 1, 1, -1, 1)
        data, (i_at, l_at) = blobfile.write_many([blobfile.SubByte(w.indices, f"uint{w.bits}"), lut])
        args = f"indices={blob(_t(shape, f'uint{w.bits}'), i_at)}, lut={blob(_t(lut.shape), l_at)}"
    else:
        blocks = w.scale.shape + (1, 1)
        data, (d_at, o_at, s_at) = blobfile.write_many([blobfile.SubByte(w.q, "uint4"),
                                                        w.zero.astype(np.float16).reshape(blocks),
                                                        w.scale.astype(np.float16).reshape(blocks)])
        args = (f"data={blob(_t(shape, 'uint4'), d_at)}, offset={blob(_t(blocks), o_at)}, "
                f"scale={blob(_t(blocks), s_at)}")
    line = f'{_t(shape)} W = {quant.MODE_OPS[mode]}({args})[name=string("W")];'
    mil = _mil({"x": s}, [line, *_conv_consts(), _conv("y", s, "W")], ["y"])
    want = w.dequantized().reshape(c, c) @ x[0, :, 0, :].astype(np.float64)
    return _attempt(mil, {"x": x}, {"y": want.reshape(s)}, backend, weights={path: data})


def _build_info(backend: str, *, present: bool) -> tuple[str, str]:
    """The same tanh program with and without a buildInfo block (orion.compile adds one unless told not to)."""
    s = (1, 64, 1, 384)
    x = _rng_input(s)
    mil = _mil({"x": s}, [_op("y", s, "tanh", x="x")], ["y"])
    return _attempt(mil, {"x": x}, {"y": np.tanh(x.astype(np.float32))}, backend, build_info=present)


def _wide_lanes(backend: str) -> tuple[str, str]:
    """24,576 lanes: the widest Orion's I/O padding emits is 24,575, above the 16,384 one source claims."""
    s = (1, 2, 1, 24576)
    x = _rng_input(s)
    mil = _mil({"x": s}, [_op("y", s, "tanh", x="x")], ["y"])
    return _attempt(mil, {"x": x}, {"y": np.tanh(x.astype(np.float32))}, backend)


def _padded_io(backend: str) -> tuple[str, str]:
    """A [1,64,1,32] linear through the compiler: its I/O padding exposes the small tensors as [1,k,1,C*S],
    cut with slice_by_size and reshape, and widens the output with a broadcast add."""
    from orion.graph import Graph

    rng = np.random.default_rng(3)
    w = (rng.standard_normal((64, 64)) / 8).astype(np.float16)
    x = _rng_input((1, 64, 1, 32), 4)
    g = Graph("probe_padded_io")
    g.output(g.linear(g.input("x", [1, 64, 1, 32]), w), "y")
    try:
        compiled = orion.compile_graph(g)
    except orion.ConstraintError as e:
        return ("not_probed", f"Orion's rules refuse it: {e}") if backend == "ane" else ("refused", str(e))
    except orion.CompileError as e:
        return "compile_fails", str(e)
    padded = [list(spec.padded) for spec in compiled.layout.inputs]
    try:
        got = compiled(x=x)["y"].astype(np.float32)
    except orion.EvaluateError as e:
        return "evaluate_fails", str(e)
    finally:
        compiled.program.unload()
    want = (w.astype(np.float32) @ x[0, :, 0, :].astype(np.float32))[None, :, None, :]
    if not np.allclose(got, want, rtol=2e-2, atol=2e-2):
        return "wrong_data", f"max error {float(np.max(np.abs(got - want))):.4g} (inputs exposed as {padded})"
    return "works", f"output matches numpy (inputs exposed as {padded})"


def _patch_two_weights(backend: str, *, one_file: bool) -> tuple[str, str]:
    """The weight patch (docs/hardware.md §6) of a conv + bias program, its two weights in one BLOBFILE
    (what Orion writes) or in two, compared with a fresh compile of the new weights and with numpy."""
    c = 64
    s = (1, c, 1, 384)
    x = _rng_input(s)
    paths = ("@model_path/weights/all.bin",) * 2 if one_file else ("@model_path/weights/w.bin",
                                                                    "@model_path/weights/b.bin")
    rng = np.random.default_rng(5)
    sets = [((rng.standard_normal((c, c, 1, 1)) / 8).astype(np.float16), rng.standard_normal((1, c, 1, 1)).astype(np.float16))
            for _ in range(2)]

    def files(w: np.ndarray, b: np.ndarray) -> tuple[dict[str, bytes], list[int]]:
        if one_file:
            data, offsets = blobfile.write_many([w, b])
            return {paths[0]: data}, offsets
        return {paths[0]: blobfile.write(w), paths[1]: blobfile.write(b)}, [64, 64]

    first, offsets = files(*sets[0])
    mil = _mil({"x": s}, [_blob("W", _t((c, c, 1, 1)), paths[0], offsets[0]), _blob("B", _t((1, c, 1, 1)), paths[1], offsets[1]),
                          *_conv_consts(), _conv("cv", s, "W"), _op("y", s, "add", x="cv", y="B")], ["y"])
    second = files(*sets[1])[0]
    try:
        p = orion.compile(mil, first)
        q = p.with_weights(second, unverified_patch=True)
        patched = q(x=x)["y"].astype(np.float32)
        p.unload()
        q.unload()
        with orion.compile(mil, second) as fresh:
            compiled = fresh(x=x)["y"].astype(np.float32)
    except orion.OrionError as e:
        return "compile_fails", str(e)
    w, b = (a.astype(np.float32) for a in sets[1])
    want = (w[:, :, 0, 0] @ x[0, :, 0, :].astype(np.float32) + b[0, :, 0, :])[None, :, None, :]
    if not np.array_equal(patched, compiled):
        return "wrong_data", (f"patched outputs differ from a fresh compile (max {float(np.max(np.abs(patched - compiled))):.4g}"
                              f"; from numpy {float(np.max(np.abs(patched - want))):.4g})")
    if not np.allclose(patched, want, rtol=2e-2, atol=2e-2):
        return "wrong_data", "stale weights"
    return "works", "patched outputs equal a fresh compile's, bit for bit"


SURFACE_COUNTS = (2, 4, 8, 16)
"""The input and the output surface counts the ``inputs_<n>`` / ``outputs_<n>`` probes try (ANE-37)."""
_COUNT_SHAPE = (1, 64, 1, 384)  # 49,152 bytes: every surface of a count probe has the minimum size (ANE-12, -13)


def _inputs(n: int) -> Callable[[str], tuple[str, str]]:
    """``y = x0 + x1 + ...`` over ``n`` input surfaces of one size."""
    def probe(backend: str) -> tuple[str, str]:
        xs = {f"x{i:02d}": _rng_input(_COUNT_SHAPE, i) for i in range(n)}
        names = list(xs)
        body = [_op("s01", _COUNT_SHAPE, "add", x=names[0], y=names[1])]
        body += [_op(f"s{i:02d}", _COUNT_SHAPE, "add", x=f"s{i - 1:02d}", y=names[i]) for i in range(2, n)]
        mil = _mil({k: _COUNT_SHAPE for k in names}, body, [f"s{n - 1:02d}"])
        want = sum(x.astype(np.float32) for x in xs.values())
        return _attempt(mil, xs, {f"s{n - 1:02d}": want}, backend)
    return probe


def _outputs(n: int) -> Callable[[str], tuple[str, str]]:
    """``y_i = x * (i + 1)`` into ``n`` output surfaces of one size."""
    def probe(backend: str) -> tuple[str, str]:
        x = _rng_input(_COUNT_SHAPE, 1)
        body = []
        for i in range(n):
            body += [_const(f"k{i:02d}", "fp16", f"{i + 1}.0"), _op(f"y{i:02d}", _COUNT_SHAPE, "mul", x="x", y=f"k{i:02d}")]
        want = {f"y{i:02d}": x.astype(np.float32) * (i + 1) for i in range(n)}
        return _attempt(_mil({"x": _COUNT_SHAPE}, body, list(want)), {"x": x}, want, backend)
    return probe


def _not_probed(reason: str) -> Callable[[str], tuple[str, str]]:
    return lambda backend: ("not_probed", reason)


PROBES: tuple[Probe, ...] = (
    Probe("concat", "ANE-01", "does concat (axis const, interleave const) compile and run?", _concat),
    Probe("conv_padding", "ANE-01", "does a 1x1 conv with custom zero padding (Orion's pad and concat) run, inf "
          "kept in place?", _conv_padding),
    Probe("reduce_mean", "ANE-07", "does reduce_mean compile and run?", _reduce_mean),
    Probe("softmax_non_pow2", "ANE-08", "does softmax over 400 lanes (not a power of two) run?", _softmax_extent),
    Probe("surface_8k", "ANE-12", "does an 8,192-byte surface evaluate?", _small_surface,
          relaxes="min_surface_bytes=8192"),
    Probe("channel_vector", "ANE-21", "does a [1,768,1,1] fp16 tensor in a 49,152-byte surface read right?",
          _channel_vector),
    Probe("nonuniform_io", "ANE-13", "do inputs of different surface sizes evaluate?", _nonuniform),
    Probe("weight_patch", "ANE-24", "does the weight-patch path (docs/hardware.md §6) give the new weights' outputs?",
          _patch_path, settles="whether Program.with_weights works at all on this machine (one weight file)"),
    Probe("weight_patch_one_file", "ANE-24", "does the patch of a program with two weights in one BLOBFILE equal a "
          "fresh compile?", lambda backend: _patch_two_weights(backend, one_file=True),
          settles="whether the compiled 'data' is the one weight file when it holds several tensors (Orion's layout)"),
    Probe("weight_patch_multi_file", "ANE-24", "does the patch of a program with two weight files equal a fresh "
          "compile?", lambda backend: _patch_two_weights(backend, one_file=False),
          relaxes="with_weights(..., unverified_patch=True)",
          settles="whether 'data' as the weight files concatenated in key order is right; the ane backend refuses "
                  "such patches until it is"),
    Probe("weight_reload_in_place", "ANE-24", "does overwriting weight files and unload/load change outputs?",
          _not_probed("needs direct access to the model directory; Orion never reloads in place")),
    Probe("quantized_ops", "ANE-35", "do quantize and dequantize (int8, scalar scale) compile and run?",
          _quantized_ops, relaxes="relaxed_ops=" + ",".join(QUANTIZED_OPS)),
    Probe("quantized_weights", "ANE-35", "does a 1x1 conv with an int8 weight (constexpr_affine_dequantize in the "
          "attribute form, per-channel scales) compile and run?", _quantized_weights,
          relaxes="relaxed_ops=" + ",".join(QUANTIZED_WEIGHT_OPS),
          settles="whether quant='int8' models can run here (Orion emits this form)"),
    Probe("quantized_weights_operand", "ANE-35", "does the same int8 conv with constexpr_affine_dequantize's "
          "parameters as named-const operands compile and run?",
          lambda backend: _quantized_weights(backend, attribute_form=False),
          settles="whether ANE-35's reported failure ([E], operand form) is the syntax or the op"),
    Probe("lut_weights", "ANE-38", "does a 1x1 conv with a 4-bit palettized weight (constexpr_lut_to_dense, uint4 "
          "indices, an fp16 LUT per 8 output channels, coremltools' iOS 18 form) compile and run?",
          lambda backend: _low_bit_weights(backend, "lut4"), relaxes="relaxed_ops=" + ",".join(LUT_WEIGHT_OPS),
          settles="whether quant='lut4' and 'lut6' models can run here (ANEMLL runs LUTs through Core ML)"),
    Probe("lut6_weights", "ANE-38", "does the same conv with 6-bit indices (uint6, 64-entry LUTs) compile and run?",
          lambda backend: _low_bit_weights(backend, "lut6"),
          settles="whether the uint6 indices of quant='lut6' work where uint4 does (lut_weights relaxes the op)"),
    Probe("int4_weights", "ANE-38", "does a 1x1 conv with a block-wise 4-bit weight (constexpr_blockwise_shift_scale, "
          "uint4 data, fp16 offsets and scales per 32 inputs) compile and run?",
          lambda backend: _low_bit_weights(backend, "int4"), relaxes="relaxed_ops=" + ",".join(INT4_WEIGHT_OPS),
          settles="whether quant='int4' models can run here (one public report saw int4 block-wise fail)"),
    Probe("build_info_present", "MIL", "does a program with the default buildInfo block (what orion.compile adds) "
          "compile and run?", lambda backend: _build_info(backend, present=True),
          settles="the baseline for build_info_absent"),
    Probe("build_info_absent", "MIL", "does the same program without a buildInfo block compile and run?",
          lambda backend: _build_info(backend, present=False),
          settles="whether the ANE compiler needs buildInfo (orion.compile adds it either way)"),
    Probe("wide_lanes", "ANE-21", "does a [1,2,1,24576] fp16 tensor (lanes above 16,384) evaluate right?",
          _wide_lanes, settles="whether the widest padded I/O Orion emits (24,575 lanes) is within the hardware's limit"),
    Probe("padded_io", "ANE-12", "does a [1,64,1,32] linear, its I/O padded by Orion's rewrite (slice_by_size, "
          "reshape, broadcast add), give the right output?", _padded_io,
          settles="whether small decode and LoRA tensors can use Orion's I/O padding"),
    Probe("fusion_depth", "ANE-09", "how many fused layers compile?",
          _not_probed("needs a layer-sized program; run the GPT-2 fusion sweep instead")),
    *(Probe(f"inputs_{n}", "ANE-37", f"does a request with {n} input surfaces of one size evaluate right "
            "(maderix/ANE saw several inputs fail with 0x1d)?", _inputs(n),
            relaxes=f"surface_counts: {n} inputs (with every smaller count) instead of one packed surface")
      for n in SURFACE_COUNTS),
    *(Probe(f"outputs_{n}", "ANE-37", f"does a request with {n} output surfaces of one size evaluate right "
            "(mechramc/Orion ran up to 6)?", _outputs(n),
            relaxes=f"surface_counts: {n} outputs (with every smaller count) instead of 6")
      for n in SURFACE_COUNTS),
)


def machine() -> dict[str, str]:
    """Chip, OS version and architecture of this machine (what a report is valid for)."""
    chip = platform.processor() or platform.machine()
    if platform.system() == "Darwin":
        try:
            chip = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=5).stdout.strip() or chip
        except OSError:
            pass
        os_version = "macOS " + platform.mac_ver()[0]
    else:
        os_version = f"{platform.system()} {platform.release()}"
    return {"chip": chip, "os": os_version, "machine": platform.machine()}


def run(probes: tuple[Probe, ...] = PROBES) -> dict[str, Any]:
    """Runs every probe on the current backend; returns the report (see the module docstring)."""
    backend = orion.backend()
    report: dict[str, Any] = {"schema": SCHEMA, "orion": orion.__version__, "backend": backend, **machine(),
                              "probes": {}}
    for p in probes:
        outcome, detail = p.run(backend)
        report["probes"][p.id] = {"rule": p.rule, "question": p.question, "outcome": outcome, "detail": detail,
                                  "relaxes": p.relaxes, "settles": p.settles}
    return report


@dataclass(frozen=True)
class Relaxations:
    """Conservative rules a probe report proved safe on this machine (None: keep the conservative rule)."""

    min_surface_bytes: int | None = None
    multi_file_patch: bool = False
    """``weight_patch_multi_file`` worked: ``Program.with_weights(..., unverified_patch=True)`` is safe here."""
    surface_counts: tuple[int, int] | None = None
    """``(inputs, outputs)`` surfaces a program may bind (ANE-37): ``orion.compile(..., surface_counts=)``."""
    ops: tuple[str, ...] = ()
    """Disputed ops (ANE-35, ANE-38) proved to compile and run here: ``orion.compile(..., relaxed_ops=ops)``."""
    source: str = ""


def relaxations(report: dict[str, Any], *, require_same_machine: bool = True) -> Relaxations:
    """What ``report`` allows: nothing unless it was produced by the ane backend (and, by default, on
    this chip and OS version). A report that is not one :func:`run` writes raises OrionError."""
    if not isinstance(report, dict):
        raise orion.OrionError(f"a probe report is a JSON object, not a {type(report).__name__}: rerun "
                               "`python -m orion doctor --probe`")
    if report.get("schema") != SCHEMA:
        raise orion.OrionError(f"probe report schema {report.get('schema')!r} is not {SCHEMA}: rerun "
                               "`python -m orion doctor --probe`")
    if report.get("backend") != "ane":
        return Relaxations(source="report from the emulator: nothing is relaxed")
    here = machine()
    if require_same_machine and any(report.get(k) != here[k] for k in ("chip", "os", "machine")):
        return Relaxations(source=f"report from {report.get('chip')} / {report.get('os')}, not this machine: "
                                  "nothing is relaxed")
    probes = report.get("probes", {})
    if not (isinstance(probes, dict) and all(isinstance(p, dict) for p in probes.values())):
        raise orion.OrionError("probe report: 'probes' is not an object of probe results: rerun "
                               "`python -m orion doctor --probe`")
    works = lambda probe: probes.get(probe, {}).get("outcome") == "works"  # noqa: E731
    small = works("surface_8k")
    ops = (QUANTIZED_OPS if works("quantized_ops") else ()) + (QUANTIZED_WEIGHT_OPS if works("quantized_weights") else ())
    ops += (LUT_WEIGHT_OPS if works("lut_weights") else ()) + (INT4_WEIGHT_OPS if works("int4_weights") else ())
    return Relaxations(min_surface_bytes=8192 if small else None, ops=ops, surface_counts=proven_counts(probes),
                       multi_file_patch=works("weight_patch_multi_file"),
                       source=f"ane probe report, {report.get('chip')} / {report.get('os')}")


def proven_counts(probes: dict[str, Any]) -> tuple[int, int] | None:
    """``(inputs, outputs)``: for each side the largest count whose probe worked along with every smaller
    one's, at least the conservative 1 input and 6 outputs; None when no count probe worked."""
    def proven(side: str, floor: int) -> int:
        best = floor
        for n in SURFACE_COUNTS:
            if probes.get(f"{side}_{n}", {}).get("outcome") != "works":
                break
            best = max(best, n)
        return best

    counts = (proven("inputs", MAX_INPUT_SURFACES), proven("outputs", MAX_OUTPUT_SURFACES))
    return None if counts == (MAX_INPUT_SURFACES, MAX_OUTPUT_SURFACES) else counts


def load_report(path: str | os.PathLike, *, require_same_machine: bool = True) -> Relaxations:
    """Reads a report saved by ``python -m orion doctor --probe --out PATH``."""
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, ValueError, RecursionError) as exc:
        raise orion.OrionError(f"probe report {path}: not a readable JSON file ({exc}). Fix: rerun "
                               "`python -m orion doctor --probe --out PATH`") from None
    return relaxations(report, require_same_machine=require_same_machine)


def format_report(report: dict[str, Any]) -> str:
    lines = [f"probes on backend '{report['backend']}' ({report['chip']}, {report['os']}):"]
    for pid, r in report["probes"].items():
        lines.append(f"  {pid:26s} {r['rule']}  {r['outcome']:15s} {r['question']}")
    return "\n".join(lines)


def summary(report: dict[str, Any], path: str) -> str:
    """What the report settled, what it relaxes, and the file to share."""
    probes = report["probes"]
    answered = {pid: r for pid, r in probes.items() if r["outcome"] not in ("not_probed", "refused")}
    lines = ["summary:"]
    if report["backend"] != "ane":
        lines.append(f"  settled nothing about the hardware: backend '{report['backend']}' answers with Orion's own "
                     f"rules ({sum(r['outcome'] == 'refused' for r in probes.values())} refused, "
                     f"{sum(r['outcome'] == 'works' for r in probes.values())} work as modelled)")
    else:
        for pid, r in answered.items():
            decided = r.get("settles") or r["question"]
            lines.append(f"  {pid}: {r['outcome']} -> {decided}")
        relax = relaxations(report, require_same_machine=False)
        granted = [f"min_surface_bytes={relax.min_surface_bytes}"] if relax.min_surface_bytes else []
        granted += [f"relaxed_ops={','.join(relax.ops)}"] if relax.ops else []
        granted += ["with_weights(unverified_patch=True)"] if relax.multi_file_patch else []
        lines.append(f"  relaxes: {', '.join(granted) or 'nothing'}")
        open_ = [pid for pid, r in probes.items() if r["outcome"] == "not_probed"]
        if open_:
            lines.append(f"  still open: {', '.join(open_)}")
    lines.append(f"  share: {path} (attach it to an Orion issue with your chip and macOS version)")
    return "\n".join(lines)
