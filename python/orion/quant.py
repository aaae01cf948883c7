"""W8A16 int8 weights: each linear weight's rows (output channels) quantized symmetrically to int8 with
one scale per row, chosen so that every dequantized weight ``q * scale`` is an fp16 value exactly.

A graph holds such a weight as a const whose value is the dequantized weight (every pass and the
numpy references see the values the ANE computes with) and whose ``attrs["int8"]`` is the
:class:`Int8Weight`; emission writes it as an int8 BLOBFILE feeding ``constexpr_affine_dequantize``
(ANE-35: disputed, so a program holding one compiles only when the op is relaxed by a probe report,
or under the permissive profile; see :func:`compile_options`).

Scales have at most 4 significant bits: with ``|q| <= 127`` (7 bits) each product has at most 11,
which fp16 holds exactly (scales are kept at or above ``2**-21``, so products stay on fp16's grid).
The emulator's int8 kernel relies on it to form each weight in fp32 with no rounding step; it still
accepts any scale and zero point (dequantizing those weights to fp16 once, at compile time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from orion import origins
from orion.constraints import violation
from orion.errors import OrionError
from orion.limits import FP16_MAX

QUANT_MODES = ("fp16", "int8")
INT8_OP = "constexpr_affine_dequantize"
MIN_SCALE = 2.0**-21  # 8 * 2**-24: a 4-bit scale at or above it keeps q * scale on fp16's subnormal grid


class QuantError(OrionError, ValueError):
    """A quantization mode or weight that Orion cannot store as asked."""


@dataclass(frozen=True, eq=False)
class Int8Weight:
    """``q`` int8 ``[Cout, ...]`` and ``scale`` float32 ``[Cout]`` (fp16 values): W[o] = q[o] * scale[o]."""

    q: np.ndarray
    scale: np.ndarray

    def dequantized(self) -> np.ndarray:
        """The weight the hardware computes with, float64 (exact: every value is an fp16 value)."""
        shape = (-1,) + (1,) * (self.q.ndim - 1)
        return self.q.astype(np.float64) * self.scale.astype(np.float64).reshape(shape)

    def reshaped(self, shape: tuple[int, ...]) -> Int8Weight:
        """The same weight in ``shape`` (same leading output-channel axis)."""
        return Int8Weight(self.q.reshape(shape), self.scale)


def int8_scales(absmax: np.ndarray) -> np.ndarray:
    """Per-row scales: ``absmax / 127`` rounded up to 4 significant bits (so no weight clips), at least
    :data:`MIN_SCALE`; rows of zeros get scale 1."""
    want = np.asarray(absmax, dtype=np.float64) / 127.0
    want = np.where(want > 0, np.maximum(want, MIN_SCALE), 1.0)
    step = np.exp2(np.floor(np.log2(want)) - 3)  # the unit of the 4th significant bit
    return (np.ceil(want / step) * step).astype(np.float32)  # ceil may give 16 * step: still 4 bits


def quantize_int8(weight: np.ndarray, name: str = "weight") -> Int8Weight:
    """Per-output-channel symmetric int8 of ``weight`` ``[Cout, ...]`` (see the module docstring);
    computed in float32 (``q = rint(w / scale)``, ties to even)."""
    w = np.asarray(weight)
    if w.ndim < 2 or w.shape[0] == 0:
        raise QuantError(f"{name}: int8 needs a weight [Cout, Cin, ...] with at least one row, got shape {list(w.shape)}")
    rows = w.reshape(w.shape[0], -1).astype(np.float32, copy=False)
    absmax = np.maximum(rows.max(axis=1), -rows.min(axis=1)) if rows.shape[1] else np.zeros(w.shape[0], np.float32)
    if not np.all(np.isfinite(absmax)) or (absmax.size and absmax.max() > FP16_MAX):  # NaN fails isfinite
        origin = origins.origin_of(weight)
        nan = int(np.isnan(rows).sum())
        raise violation("ANE-25", name, f"the weight{f' (from {origin})' if origin else ''} has "
                        f"{f'{nan} NaN values' if nan else 'values that are infinite or beyond fp16 range'}",
                        "the checkpoint is damaged or was saved from a diverged run: use a good copy" if nan else
                        "clamp or rescale the weight into fp16 range before quantizing it")
    scale = int8_scales(absmax)
    limit = np.minimum(127.0, np.floor(FP16_MAX / scale.astype(np.float64))).astype(np.float32)[:, None]
    q = np.divide(rows, scale[:, None])
    np.rint(q, out=q)
    np.clip(q, -limit, limit, out=q)  # products stay <= 65504
    return Int8Weight(q.astype(np.int8).reshape(w.shape), scale)


def check_mode(quant: str) -> str:
    """``quant`` if it is one of :data:`QUANT_MODES`."""
    if quant not in QUANT_MODES:
        raise QuantError(f"quant={quant!r}: use one of {', '.join(map(repr, QUANT_MODES))} "
                         "('int8': W8A16, int8 linear weights with per-output-channel scales)")
    return quant


def weight_operand(g: Any, weight: np.ndarray, quant: str, name: str) -> Any:
    """A linear's const weight as ``quant`` stores it: the array itself (fp16), or an int8 const node
    ``<name>_weight`` (``g`` is the :class:`orion.graph.Graph` being built)."""
    if check_mode(quant) == "fp16":
        return weight
    return g.const_int8(f"{name}_weight", quantize_int8(weight, g.scoped(f"{name}_weight")))


def compile_options(quant: str, profile: str = "hardware", probe_report: Any = None) -> dict[str, Any]:
    """The ``profile`` and ``relaxed_ops`` that compile a model's programs for ``quant``.

    int8 weights need :data:`INT8_OP`, disputed on the ANE (ANE-35): they compile under the hardware
    profile only when ``probe_report`` (a ``python -m orion doctor --probe --out PATH`` report from this
    machine, or its :class:`orion.probes.Relaxations`) proved the op works here, or under
    ``profile="permissive"``. Anything else raises ``ConstraintError`` (ANE-35) saying so."""
    from orion import probes

    check_mode(quant)
    if profile not in ("hardware", "permissive"):
        raise QuantError(f"profile={profile!r}: use 'hardware' or 'permissive'")
    relax = probes.load_report(probe_report) if isinstance(probe_report, (str, bytes)) or \
        hasattr(probe_report, "__fspath__") else (probe_report or probes.Relaxations())
    options: dict[str, Any] = {"profile": profile, "relaxed_ops": tuple(relax.ops)}
    if quant == "int8" and profile == "hardware" and INT8_OP not in relax.ops:
        raise violation("ANE-35", "quant='int8'",
                        f"int8 weights compile to {INT8_OP}, which some ANE generations refuse, and no probe report "
                        f"relaxed it ({relax.source or 'no probe_report given'})",
                        "run `python -m orion doctor --probe --out report.json` on this Mac and pass "
                        "probe_report='report.json' (it relaxes the op if its quantized_weights probe works), or "
                        "pass profile='permissive' (Orion's op bans lifted: the emulator computes what the ANE would; "
                        "a real ANE may refuse the program); on the command line, --quant int8 with --probe-report "
                        "PATH, or --quant int8 alone, which uses the permissive profile and says so")
    return options


def weight_bytes(quant: str) -> int:
    """Bytes per weight-matrix element stored as ``quant`` (the scales are negligible)."""
    return 1 if check_mode(quant) == "int8" else 2


def quant_identity(quant: str) -> dict[str, str]:
    """What a model's program-cache identity adds for ``quant`` (nothing for fp16, so fp16 keys stay)."""
    return {} if check_mode(quant) == "fp16" else {"quant": quant}


def add_arguments(parser: Any) -> None:
    """``--quant`` and ``--probe-report``: the command-line form of a model's ``quant`` options."""
    parser.add_argument("--quant", choices=QUANT_MODES, default="fp16",
                        help="how linear and LM-head weights are stored: fp16, or int8 (W8A16, per-output-channel "
                             "scales; disputed on the ANE, ANE-35: without --probe-report it compiles with the "
                             "permissive profile, and says so)")
    parser.add_argument("--probe-report", default=None, metavar="PATH",
                        help="a `python -m orion doctor --probe --out PATH` report of this machine: --quant int8 then "
                             "compiles under the hardware profile if the report relaxes constexpr_affine_dequantize")


def model_options(quant: str, probe_report: str | None = None, note: Any = print) -> dict[str, Any]:
    """The model options for the command line's ``--quant``/``--probe-report``: int8 without a report
    uses the permissive profile, after a one-line ``note`` that the op is disputed."""
    if check_mode(quant) == "fp16":
        return {}
    if probe_report is not None:
        return {"quant": quant, "probe_report": probe_report}
    note(f"note: --quant int8 compiles to {INT8_OP}, disputed on the ANE (ANE-35); using profile='permissive' "
         "(pass --probe-report PATH to use this machine's probe report instead)")
    return {"quant": quant, "profile": "permissive"}
