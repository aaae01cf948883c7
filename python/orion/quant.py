"""Quantized weights: W8A16 int8, 4- and 6-bit palettized (LUT) and block-wise 4-bit affine.

A graph holds such a weight as a const whose value is the dequantized weight (every pass and the
numpy references see the values the ANE computes with) and whose ``attrs["quantized"]`` is its stored
form; emission writes that form with the op Apple's tools use for it:

- ``int8`` (:class:`Int8Weight`): each row (output channel) symmetric int8 with one scale, emitted as int8
  data feeding ``constexpr_affine_dequantize`` (ANE-35). Scales have at most 4 significant bits: with
  ``|q| <= 127`` (7 bits) each product has at most 11, which fp16 holds exactly (scales are kept at or
  above ``2**-21``, so products stay on fp16's grid). The emulator's int8 kernel relies on it to form
  each weight in fp32 with no rounding step.
- ``lut4`` / ``lut6`` (:class:`LutWeight`): palettized as ANEMLL ships its models (coremltools'
  ``OpPalettizerConfig(mode="kmeans", granularity="per_grouped_channel", group_size=8)``): one LUT of 16
  or 64 fp16 values per group of 8 output channels, found by 1-D k-means (Lloyd's) with each weight counted
  ``|w|`` (6 bits) or ``|w| ** 0.5`` (4 bits) times, so that a group's rare large weights keep entries near
  them, and a 4- or 6-bit index per weight; emitted as ``constexpr_lut_to_dense`` (ANE-38). With an importance
  matrix (:mod:`orion.importance`, llama.cpp's imatrix) each weight also counts as much as its input channel's
  mean square on calibration text: on the real SmolLM2-135M-Instruct lut6 goes from +23.9% to +0.5% perplexity.
- ``int4`` (:class:`Int4Weight`): block-wise asymmetric 4 bits, like llama.cpp's Q4_1 and mlx's
  4-bit: per output channel and block of 32 input channels an fp16 scale and zero point, weight
  ``fp16((q - z) * s)`` with ``q`` in [0, 15]; emitted as iOS 18's ``constexpr_blockwise_shift_scale`` with
  uint4 data and fp16 scale and offset (ANE-38). Zero points are kept within +-1000 and rounded so that
  ``q - z`` is an fp16 value, and its product with ``s`` is exact in fp32: the emulator's 4-bit kernel
  rounds it once, as coremltools' fp16 decompression does.

The LM head of a 4- or 6-bit model is int8 (:func:`head_quant`), as llama.cpp's quantizer keeps ``output.weight``
at 6 bits or more and bitsandbytes leaves ``lm_head`` unquantized: on the real SmolLM2-135M-Instruct a 4-bit LM
head alone costs +6.6% perplexity and an int8 one nothing measurable (docs/quantization.md).

The emulator's conv reads each of these in its stored form, never the dequantized tensor (the 4-bit
modes stream half of int8's bytes); the result equals the fp16 conv of the dequantized weight bit for
bit. The disputed ops compile under the hardware profile only when a probe report relaxes them, or
under the permissive profile (see :func:`compile_options`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from orion import origins
from orion.constraints import violation
from orion.errors import OrionError
from orion.graph import lineage
from orion.limits import FP16_MAX

QUANT_MODES = ("fp16", "int8", "lut4", "lut6", "int4")
INT8_OP = "constexpr_affine_dequantize"
LUT_OP = "constexpr_lut_to_dense"
BLOCKWISE_OP = "constexpr_blockwise_shift_scale"
MODE_OPS = {"int8": INT8_OP, "lut4": LUT_OP, "lut6": LUT_OP, "int4": BLOCKWISE_OP}
"""The disputed op each quantized mode compiles to."""
MODE_RULES = {"int8": "ANE-35", "lut4": "ANE-38", "lut6": "ANE-38", "int4": "ANE-38"}
MODE_PROBES = {"int8": "quantized_weights", "lut4": "lut_weights", "lut6": "lut_weights", "int4": "int4_weights"}
"""The ``doctor --probe`` probe whose success relaxes each mode's op."""
MODE_BYTES = {"fp16": 2.0, "int8": 1.0, "lut4": 0.5, "lut6": 0.75, "int4": 0.5 + 4 / 32}
"""Bytes per weight-matrix element as each mode stores it (int4: 4 bits plus an fp16 scale and zero point per
32 weights, as the emulator packs them; the LUTs are negligible)."""
MODE_HELP = {"int8": "W8A16, int8 linear weights with per-output-channel scales",
             "lut4": "4-bit palettized: a 16-entry fp16 LUT per 8 output channels (ANEMLL's LUT4)",
             "lut6": "6-bit palettized: a 64-entry fp16 LUT per 8 output channels (ANEMLL's LUT6)",
             "int4": "block-wise 4-bit: a scale and zero point per output channel and 32 inputs (like Q4_1)"}
IMPORTANCE_MODES = ("lut4", "lut6")
"""The modes whose quantizer weights each weight's error by an importance matrix (:mod:`orion.importance`)."""
HEAD_QUANT = {"fp16": "fp16", "int8": "int8", "lut4": "int8", "lut6": "int8", "int4": "int8"}
"""How each mode stores the LM head (:func:`head_quant`)."""
MIN_SCALE = 2.0**-21  # 8 * 2**-24: a 4-bit scale at or above it keeps q * scale on fp16's subnormal grid
LUT_GROUP = 8  # output channels per LUT (ANEMLL's per_channel default)
INT4_BLOCK = 32  # input channels per int4 scale (llama.cpp's Q4_0/Q4_1 block)
INT4_MAX_ZERO = 1000.0
"""The largest int4 |zero point|: every ``q - z`` stays below 1024 in magnitude, so rounding z to a step of at
most 1/2 keeps each of them an fp16 value (see :func:`quantize_int4`)."""
KMEANS_ITERATIONS = 10
VALUES_AT_ONCE = 1 << 21
"""About how many weights the 4- and 6-bit quantizers work on at once (whole LUT groups, whole rows): k-means
holds several float64 copies of the groups it runs on, int4's rounding a few of its rows (the LM head's would take
GBs)."""
KMEANS_POWER = {4: 0.5, 6: 1.0}
"""Per index width, the LUT k-means counts each weight ``|w| ** power`` times (docs/quantization.md: plain
k-means leaves a group's rare large weights an error of about one standard deviation, which costs perplexity;
16 entries cannot spare as many for the tails as 64, hence the smaller power for 4 bits)."""


class QuantError(OrionError, ValueError):
    """A quantization mode or weight that Orion cannot store as asked."""


@dataclass(frozen=True, eq=False)
class Int8Weight:
    """``q`` int8 ``[Cout, ...]`` and ``scale`` float32 ``[Cout]`` (fp16 values): W[o] = q[o] * scale[o]
    (see the module docstring)."""

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


@dataclass(frozen=True, eq=False)
class LutWeight:
    """``indices`` uint8 ``[Cout, ...]`` (each < 2**bits) and ``lut`` float32 ``[Cout // group, 2**bits]`` (fp16
    values): W[o, ...] = lut[o // group, indices[o, ...]]."""

    indices: np.ndarray
    lut: np.ndarray
    bits: int
    group: int

    def dequantized(self) -> np.ndarray:
        """The weight the hardware computes with, float64 (exact: every value is an fp16 value)."""
        rows = self.indices.reshape(self.indices.shape[0], -1)
        entries = self.lut.shape[1]
        if rows.size and int(rows.max()) >= entries:
            raise QuantError(f"a LUT weight's indices must be below its {entries} entries, got {int(rows.max())}")
        at = rows + (entries * (np.arange(rows.shape[0], dtype=np.intp) // self.group))[:, None]  # its group's LUT
        return self.lut.astype(np.float64).reshape(-1)[at].reshape(self.indices.shape)

    def reshaped(self, shape: tuple[int, ...]) -> LutWeight:
        """The same weight in ``shape`` (same leading output-channel axis)."""
        return LutWeight(self.indices.reshape(shape), self.lut, self.bits, self.group)


@dataclass(frozen=True, eq=False)
class Int4Weight:
    """``q`` uint8 ``[Cout, Cin, 1...]`` in [0, 15], ``scale`` and ``zero`` float32 ``[Cout, Cin // block]`` (fp16
    values, each ``q - z`` an fp16 value too): W[o, c] = fp16((q[o, c] - z) * s) for the block's (s, z),
    the dequantization coremltools computes in fp16 (q - z is an fp16 value, its product with s exact before
    the one rounding)."""

    q: np.ndarray
    scale: np.ndarray
    zero: np.ndarray
    block: int

    def dequantized(self) -> np.ndarray:
        """The weight the hardware computes with, float64 (every value an fp16 value)."""
        # each weight its block's level: a lookup, not a product per weight
        q = self.q.reshape(self.q.shape[0], -1, self.block)  # [Cout, blocks, block]
        if q.size and int(q.max()) > 15:
            raise QuantError(f"an int4 weight's values must be in [0, 15], got {int(q.max())}")
        at = q + (16 * np.arange(q.shape[0] * q.shape[1], dtype=np.intp)).reshape(q.shape[:2] + (1,))
        return self.levels().astype(np.float64).reshape(-1)[at].reshape(self.q.shape)

    def levels(self) -> np.ndarray:
        """Each block's 16 weights fp16((u - z) * s), u = 0..15: float16 ``[Cout, Cin // block, 16]``."""
        return ((np.arange(16, dtype=np.float64) - self.zero.astype(np.float64)[:, :, None])
                * self.scale.astype(np.float64)[:, :, None]).astype(np.float16)

    def levels_finite(self) -> bool:
        """Whether every level of every block is finite (then so is every weight)."""
        return bool(np.all(np.isfinite(self.levels())))

    def reshaped(self, shape: tuple[int, ...]) -> Int4Weight:
        """The same weight in ``shape``: ``[Cout, Cin]`` with trailing ones (the blocks run along axis 1)."""
        if tuple(shape[:2]) != self.q.shape[:2] or int(np.prod(shape[2:])) != 1:
            raise QuantError(f"an int4 weight {list(self.q.shape)} keeps its [Cout, Cin] axes, not {list(shape)}")
        return Int4Weight(self.q.reshape(shape), self.scale, self.zero, self.block)


def _checked_rows(weight: np.ndarray, name: str, mode: str) -> np.ndarray:
    """``weight`` [Cout, ...] as float64 rows, refusing what cannot be stored (ANE-25)."""
    w = np.asarray(weight)
    if w.ndim < 2 or w.shape[0] == 0 or w[0].size == 0:
        raise QuantError(f"{name}: {mode} needs a weight [Cout, Cin, ...] with at least one row and column, "
                         f"got shape {list(w.shape)}")
    rows = w.reshape(w.shape[0], -1).astype(np.float64)
    if not np.all(np.isfinite(rows)) or np.abs(rows).max() > FP16_MAX:
        origin = origins.origin_of(weight)
        nan = int(np.isnan(rows).sum())
        raise violation("ANE-25", name, f"the weight{f' (from {origin})' if origin else ''} has "
                        f"{f'{nan} NaN values' if nan else 'values that are infinite or beyond fp16 range'}",
                        "the checkpoint is damaged or was saved from a diverged run: use a good copy" if nan else
                        "clamp or rescale the weight into fp16 range before quantizing it")
    return rows


class _RowKeys:
    """``sorted_rows`` [G, N] (each row ascending) mapped for :func:`_count_below`, row g into [g, g + 1) by its own
    range: computed once for the queries that lie within each row's range (k-means' midpoints, asked ten times)."""

    def __init__(self, sorted_rows: np.ndarray, first_row: int = 0) -> None:
        self.rows, self.first_row = sorted_rows, first_row
        self.lo, self.hi = sorted_rows[:, :1], sorted_rows[:, -1:]
        self.span = _key_span(self.lo, self.hi)
        self.row = np.arange(first_row, first_row + sorted_rows.shape[0], dtype=np.float64)[:, None]
        self.keys = (self.row + (sorted_rows - self.lo) / self.span).reshape(-1)

    def count_below(self, queries: np.ndarray) -> np.ndarray:
        """:func:`_count_below` of the rows and ``queries`` (the same numbers: within the rows' ranges its mapping
        is this one)."""
        if not (np.all(queries.min(axis=1, keepdims=True) >= self.lo)
                and np.all(queries.max(axis=1, keepdims=True) <= self.hi)):
            return _count_below(self.rows, queries, self.first_row)
        at = np.searchsorted(self.keys, (self.row + (queries - self.lo) / self.span).reshape(-1), side="left")
        return at.reshape(queries.shape) - (np.arange(self.rows.shape[0])[:, None] * self.rows.shape[1])


def _key_span(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    span = hi - lo
    return np.where(span > 0, span, 1.0) * (1 + 1e-9)


def _count_below(sorted_rows: np.ndarray, queries: np.ndarray, first_row: int = 0) -> np.ndarray:
    """Per row g, how many of ``sorted_rows[g]`` (ascending) are below each of ``queries[g]``: one
    searchsorted over every row, each row's values mapped into its own unit interval [g, g + 1) (or, for a few
    values per row and many queries, a comparison per value: the same counts of the same mapped keys). The rows
    are rows ``first_row`` on of a larger set (their keys, so the counts, those of the whole set's run)."""
    lo = np.minimum(sorted_rows[:, :1], queries.min(axis=1, keepdims=True))
    span = _key_span(lo, np.maximum(sorted_rows[:, -1:], queries.max(axis=1, keepdims=True)))
    row = np.arange(first_row, first_row + sorted_rows.shape[0], dtype=np.float64)[:, None]
    keys = row + (sorted_rows - lo) / span
    if sorted_rows.shape[1] <= 64 < queries.shape[1]:  # a few keys per row (LUT midpoints): count by comparisons
        below = np.zeros(queries.shape, np.uint8)
        mapped = row + (queries - lo) / span
        for k in range(sorted_rows.shape[1]):
            below += keys[:, k:k + 1] < mapped
        return below.astype(np.int64)
    at = np.searchsorted(keys.reshape(-1), (row + (queries - lo) / span).reshape(-1), side="left").reshape(queries.shape)
    return at - (np.arange(sorted_rows.shape[0])[:, None] * sorted_rows.shape[1])


def kmeans_luts(groups: np.ndarray, entries: int, iterations: int = KMEANS_ITERATIONS,
                power: float = 0.0, first_row: int = 0, importance: np.ndarray | None = None) -> np.ndarray:
    """Sorted centroids [G, entries] of each row of ``groups`` [G, N]: 1-D k-means (Lloyd's) with each value
    counted ``|value| ** power`` times (``power`` 0: plain k-means), times ``importance[n]`` when given ([N],
    >= 0: one count per column, the same for every row). It starts from the weighted means of
    ``entries`` bins of equal weight (the extremes kept as centroids: outliers matter); each step assigns by
    the midpoints (a searchsorted on the sorted rows) and recomputes the weighted means from prefix sums. An
    empty cluster keeps its centroid. ``groups`` may be rows ``first_row`` on of a larger set (:func:`_count_below`)."""
    g, n = groups.shape
    if importance is None:
        values = np.sort(groups, axis=1)
        weight = np.abs(values) ** power if power else np.ones_like(values)
    else:
        order = np.argsort(groups, axis=1)
        values = np.take_along_axis(groups, order, axis=1)
        weight = np.asarray(importance, np.float64)[order] * (np.abs(values) ** power if power else 1.0)
    weight += np.finfo(np.float64).tiny  # every value counts a little: a row of zeros still has a mean
    mass = np.concatenate([np.zeros((g, 1)), np.cumsum(weight, axis=1)], axis=1)
    moment = np.concatenate([np.zeros((g, 1)), np.cumsum(weight * values, axis=1)], axis=1)
    rows = np.arange(g)[:, None]

    def means(bounds: np.ndarray, fallback: np.ndarray) -> np.ndarray:
        w = mass[rows, bounds[:, 1:]] - mass[rows, bounds[:, :-1]]
        return np.sort(np.where(w > 0, (moment[rows, bounds[:, 1:]] - moment[rows, bounds[:, :-1]]) /
                                np.where(w > 0, w, 1.0), fallback), axis=1)

    share = mass[:, -1:] * np.linspace(0, 1, entries + 1)[None, :]  # equal-weight bins: index of each edge
    edges = _count_below(mass[:, 1:], share, first_row).clip(0, n)
    edges[:, 0], edges[:, -1] = 0, n
    spread = values[:, :1] + np.linspace(0, 1, entries)[None, :] * (values[:, -1:] - values[:, :1])
    centroids = means(edges, spread)
    centroids[:, 0], centroids[:, -1] = values[:, 0], values[:, -1]
    keys = _RowKeys(values, first_row)
    for _ in range(iterations):
        cut = keys.count_below((centroids[:, 1:] + centroids[:, :-1]) / 2)
        centroids = means(np.concatenate([np.zeros((g, 1), np.int64), cut, np.full((g, 1), n)], axis=1), centroids)
    return centroids


def quantize_lut(weight: np.ndarray, bits: int, name: str = "weight", group: int = LUT_GROUP,
                 importance: np.ndarray | None = None) -> LutWeight:
    """Palettize ``weight`` [Cout, Cin, ...]: one 2**bits-entry fp16 LUT per ``group`` output channels (k-means
    weighted by ``|w| ** KMEANS_POWER[bits]``, times ``importance[c]`` [Cin] of each weight's input channel when
    given, :func:`kmeans_luts`; a smaller group dividing Cout when ``group`` does not), each weight its nearest LUT
    entry."""
    if bits not in (4, 6):
        raise QuantError(f"{name}: LUTs of {bits} bits are not supported: use 4 or 6")
    rows = _checked_rows(weight, name, f"lut{bits}")
    cout = rows.shape[0]
    group = max(d for d in range(1, min(group, cout) + 1) if cout % d == 0)
    grouped = rows.reshape(cout // group, -1)
    columns = None if importance is None else np.tile(_checked_importance(importance, rows, name), group)
    entries = 1 << bits
    lut, indices = np.empty((grouped.shape[0], entries)), np.empty(grouped.shape, np.uint8)
    at_once = max(1, VALUES_AT_ONCE // grouped.shape[1])
    for start in range(0, grouped.shape[0], at_once):  # bounded temporaries, the same numbers
        part = slice(start, start + at_once)
        lut[part] = kmeans_luts(grouped[part], entries, power=KMEANS_POWER[bits], first_row=start,
                                importance=columns).astype(np.float16)  # fp16 entries, still sorted
        # nearest entry (ties: the lower)
        indices[part] = _count_below(lut[part, 1:] * 0.5 + lut[part, :-1] * 0.5, grouped[part], start)
    return LutWeight(indices.reshape(np.shape(weight)), lut.astype(np.float32), bits, group)


def _checked_importance(importance: np.ndarray, rows: np.ndarray, name: str) -> np.ndarray:
    """``importance`` as float64 [Cin] for ``rows`` [Cout, Cin] (a 1x1 conv's trailing axes are 1)."""
    values = np.asarray(importance, np.float64)
    if values.shape != (rows.shape[1],) or not np.all(np.isfinite(values)) or np.any(values < 0):
        raise QuantError(f"{name}: importance of shape {list(values.shape)}, expected [{rows.shape[1]}] finite values "
                         ">= 0 (one per input channel). Fix: collect it on this model (orion.importance)")
    return values


def quantize_int4(weight: np.ndarray, name: str = "weight", block: int = INT4_BLOCK) -> Int4Weight:
    """Block-wise asymmetric 4-bit of ``weight`` [Cout, Cin, 1...], as llama.cpp's Q4_1: per output channel and
    ``block`` input channels (a smaller power of two dividing Cin when ``block`` does not), the fp16 scale
    ``s = (max - min) / 15`` and the zero point ``z = -min / s`` (rounded so that every ``q - z`` is an fp16
    value), so the 16 levels ``(q - z) * s`` span the block's range; each weight takes the nearest level. A
    block whose range is under 1.5% of its largest |w| gets ``s = max|w| / 1000`` instead (rounded up), which
    keeps ``|z| <= 1000`` (:data:`INT4_MAX_ZERO`) at an error of at most max|w| / 2000, about fp16's rounding."""
    rows = _checked_rows(weight, name, "int4")
    cout, cin = rows.shape
    if tuple(np.shape(weight)[:2]) != (cout, cin):
        raise QuantError(f"{name}: int4 needs a weight [Cout, Cin] (trailing ones allowed), got {list(np.shape(weight))}")
    while block > 1 and cin % block:
        block //= 2
    blocks = rows.reshape(cout, cin // block, block)
    lo, hi = blocks.min(axis=2), blocks.max(axis=2)
    span = np.where(hi > lo, hi - lo, np.abs(lo)) / 15.0
    # a block far from zero for its range (blocks of 2 do this often) would need |z| beyond fp16's integers
    # (2048) or its range: the scale is kept at or above max|w| / INT4_MAX_ZERO, an error about fp16's own
    floor = np.maximum(np.abs(lo), np.abs(hi)) / INT4_MAX_ZERO
    scale = np.where(span > 0, np.maximum(span, floor), 1.0).astype(np.float16)
    scale = np.where(scale < floor, np.nextafter(scale, np.float16(np.inf)), scale).astype(np.float64)  # rounded up
    scale = np.maximum(scale, 2.0**-24)  # a subnormal span rounds to 0: the smallest fp16 scale
    zero = -lo / scale  # |zero| <= INT4_MAX_ZERO, so every |q - z| < 1024
    # to the fp16 grid of |q - z| (q in [0, 15]), so that q - z is an fp16 value for every q
    step = np.exp2(np.floor(np.log2(np.maximum(np.maximum(np.abs(zero), np.abs(15 - zero)), 1.0))) - 10)
    zero = np.round(zero / step) * step
    q = np.empty(blocks.shape, np.uint8)
    at_once = max(1, VALUES_AT_ONCE // cin)
    for start in range(0, cout, at_once):  # bounded temporaries, the same numbers
        part = slice(start, start + at_once)
        q[part] = np.clip(np.rint(blocks[part] / scale[part, :, None] + zero[part, :, None]), 0, 15)
    weight4 = Int4Weight(q.reshape(np.shape(weight)), scale.astype(np.float32), zero.astype(np.float32), block)
    if not weight4.levels_finite() and not np.all(np.isfinite(weight4.dequantized())):
        raise violation("ANE-25", name, "an int4 block's dequantized range exceeds fp16", "rescale the weight")
    return weight4


def quantize(weight: np.ndarray, quant: str, name: str = "weight",
             importance: np.ndarray | None = None) -> Int8Weight | LutWeight | Int4Weight:
    """``weight`` [Cout, ...] in the stored form of ``quant`` (any mode but fp16); ``importance`` [Cin] of its input
    channels (:mod:`orion.importance`) for the modes that use one (:data:`IMPORTANCE_MODES`)."""
    mode = check_mode(quant)
    if importance is not None and mode not in IMPORTANCE_MODES:
        raise QuantError(f"{name}: {mode} does not use an importance matrix; {IMPORTANCE_MODES} do")
    if mode == "int8":
        return quantize_int8(weight, name)
    if mode in ("lut4", "lut6"):
        return quantize_lut(weight, int(mode[3:]), name, importance=importance)
    if mode == "int4":
        return quantize_int4(weight, name)
    raise QuantError(f"{name}: fp16 weights are not quantized")


def check_mode(quant: str) -> str:
    """``quant`` if it is one of :data:`QUANT_MODES`."""
    if quant not in QUANT_MODES:
        raise QuantError(f"quant={quant!r}: use one of {', '.join(map(repr, QUANT_MODES))} ("
                         + "; ".join(f"'{m}': {h}" for m, h in MODE_HELP.items()) + ")")
    return quant


_QUANTIZED: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
QUANTIZED_HELD = 1024
"""Quantized weights remembered per process (by mode and content): a model's prefill buckets, chunk and
decode programs quantize each weight once, not once per program (k-means is the slow part of a build)."""


def quantize_once(weight: np.ndarray, quant: str, name: str = "weight",
                  importance: np.ndarray | None = None) -> Int8Weight | LutWeight | Int4Weight:
    """:func:`quantize`, remembered by the weight's values and the importance's (its BLAKE2b digest): a checkpoint's
    weight (or an array derived from its weights, as a fused projection) by its lineage key
    (:mod:`orion.graph.lineage`, for as long as the checkpoint is open: named, not hashed), any other by its bytes'
    BLAKE2b digest, dtype and shape."""
    weighted = None if importance is None else \
        hashlib.blake2b(np.ascontiguousarray(importance, np.float64).data, digest_size=20).digest()
    source = lineage.key_of(weight)
    if source is not None:
        fact = f"quantized {quant} {weighted.hex() if weighted else ''}"
        held = lineage.recall(source, fact)
        if held is None:
            held = quantize(np.ascontiguousarray(weight), quant, name, importance)
            lineage.remember(source, fact, held)
        return held
    w = np.ascontiguousarray(weight)
    key = (quant, w.dtype.str, w.shape, hashlib.blake2b(w.data, digest_size=20).digest(), weighted)
    held = _QUANTIZED.get(key)
    if held is None:
        held = _QUANTIZED[key] = quantize(w, quant, name, importance)
        if len(_QUANTIZED) > QUANTIZED_HELD:
            _QUANTIZED.popitem(last=False)
    else:
        _QUANTIZED.move_to_end(key)
    return held


def weight_operand(g: Any, weight: np.ndarray, quant: str, name: str, importance: np.ndarray | None = None) -> Any:
    """A linear's const weight as ``quant`` stores it: the array itself (fp16), or a quantized const node
    ``<name>_weight`` (``g`` is the :class:`orion.graph.Graph` being built); ``importance`` as :func:`quantize`'s."""
    if check_mode(quant) == "fp16":
        return weight
    return g.const_quantized(f"{name}_weight", quantize_once(weight, quant, g.scoped(f"{name}_weight"), importance))


def compile_options(quant: str, profile: str = "hardware", probe_report: Any = None) -> dict[str, Any]:
    """The ``profile`` and ``relaxed_ops`` that compile a model's programs for ``quant``.

    Quantized weights need a disputed op (:data:`MODE_OPS`: ANE-35 for int8, ANE-38 for the 4- and 6-bit
    modes): they compile under the hardware profile only when ``probe_report`` (a ``python -m orion doctor
    --probe --out PATH`` report from this machine, or its :class:`orion.probes.Relaxations`) proved the op
    works here, or under ``profile="permissive"``. Anything else raises ``ConstraintError`` saying so."""
    from orion import probes

    check_mode(quant)
    if profile not in ("hardware", "permissive"):
        raise QuantError(f"profile={profile!r}: use 'hardware' or 'permissive'")
    relax = probes.load_report(probe_report) if isinstance(probe_report, (str, bytes)) or \
        hasattr(probe_report, "__fspath__") else (probe_report or probes.Relaxations())
    options: dict[str, Any] = {"profile": profile, "relaxed_ops": tuple(relax.ops)}
    for mode in dict.fromkeys((quant, head_quant(quant))):  # the layers' op, then the LM head's
        op = MODE_OPS.get(mode)
        if op and profile == "hardware" and op not in relax.ops:
            stored = f"{quant} weights compile" if mode == quant else f"a {quant} model's LM head is {mode}, which compiles"
            raise violation(MODE_RULES[mode], f"quant={quant!r}",
                            f"{stored} to {op}, which some ANE generations refuse, and no probe report "
                            f"relaxed it ({relax.source or 'no probe_report given'})",
                            "run `python -m orion doctor --probe --out report.json` on this Mac and pass "
                            f"probe_report='report.json' (it relaxes the op if its {MODE_PROBES[mode]} probe works), "
                            "or pass profile='permissive' (Orion's op bans lifted: the emulator computes what the ANE "
                            f"would; a real ANE may refuse the program); on the command line, --quant {quant} with "
                            f"--probe-report PATH, or --quant {quant} alone, which uses the permissive profile and says so")
    return options


def head_quant(quant: str) -> str:
    """How a ``quant`` model stores its LM head (:data:`HEAD_QUANT`): as its layers, except int8 for the 4- and 6-bit
    modes. The logits are the most sensitive product of the model (the real SmolLM2-135M-Instruct: +6.6% perplexity
    for an int4 LM head, none for int8), and llama.cpp's quantizer keeps ``output.weight`` at 6+ bits for the same
    reason."""
    return HEAD_QUANT[check_mode(quant)]


def weight_bytes(quant: str) -> float:
    """Bytes per weight-matrix element stored as ``quant`` (:data:`MODE_BYTES`)."""
    return MODE_BYTES[check_mode(quant)]


def quant_identity(quant: str, importance: Any = None) -> dict[str, str]:
    """What a model's program-cache identity adds for ``quant`` (nothing for fp16, so fp16 keys stay): the
    mode, the LM head's when it differs, and, for the LUT modes, the k-means settings that chose the LUTs and the
    digest of the ``importance`` (an :class:`orion.importance.Importance`) that weighted them, if any (a cache
    written by another quantizer must not serve its LUTs)."""
    if check_mode(quant) == "fp16":
        return {}
    head = {} if head_quant(quant) == quant else {"head": head_quant(quant)}
    if quant in ("lut4", "lut6"):
        weighted = {} if importance is None else {"importance": importance.digest}
        return {"quant": quant, "quantizer": f"kmeans-power{KMEANS_POWER[int(quant[3:])]:g}-steps{KMEANS_ITERATIONS}",
                **weighted, **head}
    return {"quant": quant, **head}


def add_arguments(parser: Any) -> None:
    """``--quant`` and ``--probe-report``: the command-line form of a model's ``quant`` options."""
    parser.add_argument("--quant", choices=QUANT_MODES, default="fp16",
                        help="how linear and LM-head weights are stored: fp16; int8 (W8A16, per-output-channel "
                             "scales; disputed on the ANE, ANE-35); lut4 / lut6 (4-/6-bit palettized, a LUT per 8 "
                             "output channels, as ANEMLL ships) or int4 (block-wise 4-bit, per 32 inputs) (disputed, "
                             "ANE-38); the LM head of a 4- or 6-bit model is int8. Without --probe-report a quantized "
                             "mode compiles with the permissive profile, and says so")
    parser.add_argument("--probe-report", default=None, metavar="PATH",
                        help="a `python -m orion doctor --probe --out PATH` report of this machine: a quantized "
                             "--quant then compiles under the hardware profile if the report relaxes its op")
    parser.add_argument("--imatrix", default=None, metavar="PATH",
                        help="an importance matrix of this model (`python -m orion imatrix`) for --quant lut4/lut6: "
                             "the LUTs then favour the weights of inputs that are large on real text")


def model_options(quant: str, probe_report: str | None = None, note: Any = print,
                  imatrix: str | None = None) -> dict[str, Any]:
    """The model options for the command line's ``--quant``/``--probe-report``/``--imatrix``: a quantized mode
    without a report uses the permissive profile, after a one-line ``note`` that its op is disputed."""
    if check_mode(quant) == "fp16" and imatrix is None:
        return {}
    weighted = {} if imatrix is None else {"imatrix": imatrix}
    if quant == "fp16" or probe_report is not None:  # (fp16 with an imatrix: the model says it does not use one)
        return {"quant": quant, **({} if probe_report is None else {"probe_report": probe_report}), **weighted}
    note(f"note: --quant {quant} compiles to {MODE_OPS[quant]}, disputed on the ANE ({MODE_RULES[quant]}); using "
         "profile='permissive' (pass --probe-report PATH to use this machine's probe report instead)")
    if quant in IMPORTANCE_MODES and imatrix is None:
        note(f"note: --quant {quant} without --imatrix fits its LUTs to the weights alone (the real SmolLM2-135M: lut6 "
             "+24% perplexity, +0.5% with an importance matrix); make one with `python -m orion imatrix`")
    return {"quant": quant, "profile": "permissive", **weighted}
