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
from orion.limits import MIN_SURFACE_BYTES

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


def _attempt(mil: str, arrays: dict[str, np.ndarray], expected: dict[str, np.ndarray], backend: str, *,
             weights: dict[str, bytes] | None = None, nbytes: int | None = None,
             in_sizes: dict[str, int] | None = None) -> tuple[str, str]:
    hardware = backend == "ane"
    smallest = min([nbytes or orion.MIN_SURFACE_BYTES, *(in_sizes or {}).values()])

    def refused(e: orion.ConstraintError) -> tuple[str, str]:
        # the emulator's refusal is the modelled answer; on the ANE it means Orion's own runtime check
        # stopped the probe before the hardware saw it
        return ("not_probed", f"Orion's runtime refuses it before the hardware: {e}") if hardware else ("refused", str(e))

    try:
        p = orion.compile(mil, weights, profile="permissive" if hardware else "hardware",
                          min_surface_bytes=(smallest if hardware else None))
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
                    backend, nbytes=65536, in_sizes={"x": MIN_SURFACE_BYTES, "y": 65536})


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


def _quantized_weights(backend: str) -> tuple[str, str]:
    """A 1x1 conv whose weight is int8 data with per-output-channel fp16 scales (what quant="int8" emits)."""
    c, s = 64, (1, 64, 1, 64)
    x = _rng_input(s)
    rng = np.random.default_rng(1)
    q = rng.integers(-127, 128, size=(c, c, 1, 1)).astype(np.int8)
    scale = (np.exp2(rng.integers(-10, -6, size=c)) * rng.integers(8, 16, size=c)).astype(np.float16)
    paths = {"q": "@model_path/weights/q.bin", "sc": "@model_path/weights/sc.bin"}
    blob = lambda name, t: (f'{t} {name} = const()[name=string("{name}"), '  # noqa: E731
                            f'val={t}(BLOBFILE(path=string("{paths[name]}"), offset=uint64(64)))];')
    mil = _mil({"x": s}, [blob("q", _t((c, c, 1, 1), "int8")), blob("sc", _t((c,))), _const("zp", "int8", "0"),
                          _const("ax", "int32", "0"),
                          _op_typed("W", _t((c, c, 1, 1)), "constexpr_affine_dequantize", axis="ax",
                                    quantized_data="q", scale="sc", zero_point="zp"),
                          _const("st", "int32", "1,1", (2,)), _const("pd", "int32", "0,0,0,0", (4,)),
                          _const("dl", "int32", "1,1", (2,)), _const("gr", "int32", "1"),
                          _const("pt", "string", '"valid"'),
                          _op("y", s, "conv", dilations="dl", groups="gr", pad="pd", pad_type="pt", strides="st",
                              weight="W", x="x")], ["y"])
    w = q[:, :, 0, 0].astype(np.float32) * scale.astype(np.float32)[:, None]
    want = w @ x[0, :, 0, :].astype(np.float32)
    weights = {paths["q"]: blobfile.write(q), paths["sc"]: blobfile.write(scale)}
    return _attempt(mil, {"x": x}, {"y": want.reshape(s)}, backend, weights=weights)


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
          _patch_path),
    Probe("weight_reload_in_place", "ANE-24", "does overwriting weight files and unload/load change outputs?",
          _not_probed("needs direct access to the model directory; Orion never reloads in place")),
    Probe("quantized_ops", "ANE-35", "do quantize and dequantize (int8, scalar scale) compile and run?",
          _quantized_ops, relaxes="relaxed_ops=" + ",".join(QUANTIZED_OPS)),
    Probe("quantized_weights", "ANE-35", "does a 1x1 conv with an int8 weight (constexpr_affine_dequantize, "
          "per-channel scales) compile and run?", _quantized_weights,
          relaxes="relaxed_ops=" + ",".join(QUANTIZED_WEIGHT_OPS)),
    Probe("fusion_depth", "ANE-09", "how many fused layers compile?",
          _not_probed("needs a layer-sized program; run the GPT-2 fusion sweep instead")),
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
                                  "relaxes": p.relaxes}
    return report


@dataclass(frozen=True)
class Relaxations:
    """Conservative rules a probe report proved safe on this machine (None: keep the conservative rule)."""

    min_surface_bytes: int | None = None
    ops: tuple[str, ...] = ()
    """Disputed ops (ANE-35) proved to compile and run here: pass as ``orion.compile(..., relaxed_ops=ops)``."""
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
    return Relaxations(min_surface_bytes=8192 if small else None, ops=ops,
                       source=f"ane probe report, {report.get('chip')} / {report.get('os')}")


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
        lines.append(f"  {pid:24s} {r['rule']}  {r['outcome']:15s} {r['question']}")
    return "\n".join(lines)
