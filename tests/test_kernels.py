"""orion._core.kernels against independent numpy references.

Tolerances: results accumulate in fp32 in an order of the kernel's choosing, so they are compared
with a float64 reference within 2 * K * eps32 * (|A| @ |B|) (K = reduction length); rounded
results must in addition be fp16 values within half an fp16 ulp of that band. Conversions and
rounding are exact and compared bit for bit. The whole file also runs once more in a subprocess
with ORION_SIMD=portable (and ORION_NUM_THREADS=3), and once with ORION_SIMD=avx2 on an AVX-512
machine, so that every SIMD path is covered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from orion import _core
from orion._core import kernels

EPS32 = float(np.finfo(np.float32).eps)
RNG = np.random.default_rng(1234)


def fp32_bound(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    k = a.shape[1]
    return 2.0 * max(k, 1) * EPS32 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))) + 1e-30


def half_ulp16(ref: np.ndarray) -> np.ndarray:
    """Half the fp16 spacing at |ref| (subnormal spacing below the normal range)."""
    mag = np.maximum(np.abs(ref), 2.0**-14)
    return np.exp2(np.floor(np.log2(mag)) - 11)


def assert_close(got: np.ndarray, ref: np.ndarray, bound: np.ndarray, rounded: bool) -> None:
    assert got.dtype == np.float32
    if rounded:
        assert np.array_equal(got, got.astype(np.float16).astype(np.float32)), "not fp16 values"
        bound = bound + half_ulp16(ref) * (1 + 1e-6)
    err = np.abs(got.astype(np.float64) - ref)
    if not np.all(err <= bound):
        worst = np.argmax(err - bound)
        raise AssertionError(f"err {err.flat[worst]} > bound {bound.flat[worst]}")


SIMD_PATHS = ("avx512f+f16c+fma", "avx2+f16c+fma", "portable")


def test_simd_path_and_threads():
    forced = {"portable": "portable", "avx2": "avx2+f16c+fma"}.get(os.environ.get("ORION_SIMD", ""))
    assert kernels.simd_path() in SIMD_PATHS
    if forced and not (forced == "avx2+f16c+fma" and kernels.simd_path() == "portable"):
        assert kernels.simd_path() == forced
    if "ORION_NUM_THREADS" in os.environ:
        assert kernels.num_threads() == int(os.environ["ORION_NUM_THREADS"])
    assert kernels.num_threads() >= 1


# --- round_fp16 ---------------------------------------------------------------------------------


def reference_round(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


def assert_same_bits(got: np.ndarray, ref: np.ndarray) -> None:
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), ref[~nan].view(np.uint32))


def test_round_fp16_all_half_values_are_fixed_points():
    halves = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    assert_same_bits(kernels.round_fp16(halves), halves)


def test_round_fp16_ties_go_to_even():
    finite = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)  # exact in fp32
    mids = np.concatenate([mids, -mids, [np.float32(65520.0)]])  # 65520 ties up to inf
    got = kernels.round_fp16(mids)
    assert_same_bits(got, reference_round(mids))
    assert got[-1] == np.inf
    assert kernels.round_fp16(np.array([2049.0], np.float32))[0] == 2048.0  # tie -> even mantissa
    assert kernels.round_fp16(np.array([2051.0], np.float32))[0] == 2052.0


def test_round_fp16_random_floats_overflow_and_specials():
    bits = RNG.integers(0, 2**32, size=200_001, dtype=np.uint64).astype(np.uint32)
    scaled = (RNG.standard_normal(100_003) * np.exp2(RNG.uniform(-30, 20, 100_003))).astype(np.float32)
    specials = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, -65520.0, 1e9, -1e30,
         2.0**-24, 2.0**-25, 2.0**-25 * 1.0001, 3 * 2.0**-26, 2.0**-14, 2.0**-14 - 2.0**-25, 1e-45],
        dtype=np.float32,
    )
    for x in (bits.view(np.float32), scaled, specials):
        assert_same_bits(kernels.round_fp16(x), reference_round(x))
    got = kernels.round_fp16(specials)
    assert np.isposinf(got[7]) and np.isneginf(got[8]) and np.isposinf(got[9])
    assert np.signbit(got[1]) and got[1] == 0


def test_round_fp16_shapes_and_copies():
    x = RNG.standard_normal((3, 5, 7)).astype(np.float32)
    before = x.copy()
    view = x[:, ::2, 1:]
    got = kernels.round_fp16(view)
    assert got.shape == view.shape
    assert_same_bits(got, reference_round(view))
    assert np.array_equal(x, before), "input must not be modified"
    assert kernels.round_fp16(np.array(1.0001, np.float32)) == np.float32(np.float16(1.0001))
    assert kernels.round_fp16(np.zeros(0, np.float32)).shape == (0,)


def test_round_fp16_rejects_other_dtypes():
    with pytest.raises(ValueError, match="float32"):
        kernels.round_fp16(np.zeros(4, np.float64))
    with pytest.raises(ValueError, match="numpy array"):
        kernels.round_fp16([1.0, 2.0])


# --- store_columns (a decode step's keys and values into the KV cache) ---------------------------


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_store_columns_writes_each_lanes_column_at_its_position(dtype):
    # dst [lanes, width, T] and src [width, S] as the decode surfaces give them: strided views; three pairs in one
    # call (a step's keys and values of every layer), their channels in blocks spread over the threads
    def surfaces(width):
        dst_surface = RNG.standard_normal((8, width, 1, 64)).astype(dtype)
        dst = dst_surface.reshape(8 * width, 1, 64)[:, 0].reshape(8, width, 64)
        return dst, RNG.standard_normal((1, width, 1, 11)).astype(dtype)[0, :, 0]
    pairs = [surfaces(width) for width in (40, 200, 65)]
    lanes, positions = [0, 2, 3, 7], [5, 63, 0, 17]
    wants = [dst.copy() for dst, _ in pairs]
    for want, (_, src) in zip(wants, pairs):
        for lane, pos in zip(lanes, positions):
            want[lane, :, pos] = src[:, lane]
    kernels.store_columns([dst for dst, _ in pairs], [src for _, src in pairs], lanes, positions)
    for want, (dst, _) in zip(wants, pairs):
        np.testing.assert_array_equal(dst, want)
    dst, src = pairs[0]
    kernels.store_columns([dst[:, :, ::2]], [src], [1], [31])  # any strides
    wants[0][1, :, 62] = src[:, 1]
    np.testing.assert_array_equal(dst, wants[0])


def test_store_columns_rejects_bad_input_before_writing_anything():
    dst, src = np.zeros((4, 6, 16), np.float16), np.zeros((6, 4), np.float16)
    cases = [((dst, src.astype(np.float32), [0], [0]), "dtype"),
             ((dst.astype(np.int16), src.astype(np.int16), [0], [0]), "dtype"),
             ((dst, src[:5], [0], [0]), "width"),
             ((dst[0], src, [0], [0]), "width"),
             ((dst, src, [0, 1], [0]), "one position per lane"),
             ((dst, src, [4], [0]), "lane 4"),
             ((dst, src[:, :2], [2], [0]), "lane 2"),
             ((dst, src, [0], [16]), "position 16"),
             ((dst, src, [0], [-1]), "position -1"),
             ((dst.tolist(), src, [0], [0]), "numpy arrays")]
    first = np.zeros_like(dst)
    for (bad_dst, bad_src, lanes, positions), match in cases:
        with pytest.raises(ValueError, match=match):
            kernels.store_columns([first, bad_dst], [src + 1, bad_src], lanes, positions)
        assert not first.any()  # the good pair before the bad one is not written either
    with pytest.raises(ValueError, match="pair 1: every dst and src must have one dtype"):
        kernels.store_columns([dst, dst.astype(np.float32)], [src, src.astype(np.float32)], [0], [0])
    with pytest.raises(ValueError, match="one src per dst"):
        kernels.store_columns([dst, dst], [src], [0], [0])
    dst.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        kernels.store_columns([dst], [src], [0], [0])


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_gather_lanes_gives_each_lanes_channels_of_every_part_in_turn(dtype):
    # The LM head programs' outputs [1, vocab part, 1, lanes]: parts of unequal sizes, one past the kernel's blocks
    parts = [RNG.standard_normal(shape).astype(dtype) for shape in ((1, 2500, 1, 8), (1, 7, 1, 8), (3, 1, 8))]
    lanes = [0, 3, 7, 4]
    got = kernels.gather_lanes(parts, lanes)
    want = np.concatenate([p.reshape(-1, 8) for p in parts]).T[lanes].astype(np.float64)  # exact: fp16 to fp32
    assert got.dtype == np.float32 and got.shape == (4, 2510)
    np.testing.assert_array_equal(got, want)
    assert kernels.gather_lanes(parts, []).shape == (0, 2510)


def test_gather_lanes_rejects_bad_parts():
    good = np.zeros((1, 4, 1, 8), np.float16)
    cases = [(([good, good.astype(np.float32)], [0]), "part 1: give float16 or float32 parts of one dtype"),
             (([good.astype(np.int16)], [0]), "part 0: give float16 or float32"),
             (([good[..., ::2]], [0]), "C-contiguous"),
             (([good], [8]), "lane 8 is outside its 8 lanes"),
             (([good], [-1]), "lane -1")]
    for (parts, lanes), match in cases:
        with pytest.raises(ValueError, match=match):
            kernels.gather_lanes(parts, lanes)


# --- conv1x1 ------------------------------------------------------------------------------------


def conv_case(cout: int, cin: int, S: int, lanes: int | None, round_: bool) -> None:
    weight = RNG.standard_normal((cout, cin)).astype(np.float16)
    x = RNG.standard_normal((cin, S)).astype(np.float32)
    got = kernels.conv1x1(weight, x, lanes=lanes, round=round_)
    live = S if lanes is None else lanes
    assert got.shape == (cout, S)
    w32 = weight.astype(np.float32)
    ref = w32.astype(np.float64) @ x[:, :live].astype(np.float64)
    assert_close(got[:, :live], ref, fp32_bound(w32, x[:, :live]), round_)
    assert np.all(got[:, live:] == 0), "lanes past `lanes` must be left untouched"


@pytest.mark.parametrize("cout", [1, 5, 16, 17, 33, 100])
@pytest.mark.parametrize("cin", [1, 7, 16, 40, 129, 300])
def test_conv1x1_shapes(cout, cin):
    for S in (1, 2, 3, 5, 8, 13, 32, 64):
        conv_case(cout, cin, S, None, round_=True)
    conv_case(cout, cin, 13, 7, round_=False)
    conv_case(cout, cin, 64, 1, round_=True)


@pytest.mark.parametrize("lanes", list(range(0, 20)) + [31, 32, 33, 47, 63, 64])
def test_conv1x1_every_lane_count(lanes):
    conv_case(70, 200, 64, lanes, round_=lanes % 2 == 0)


@pytest.mark.parametrize("lanes", [4, 5, 6, 8, 9, 11, 12, 13, 16, 24, 37])
def test_conv1x1_lanes_sum_alike_in_every_tiling(lanes):
    # From 4 lanes a register tile on, each output sums its inputs c in order in one partial sum, whichever tiles
    # take its lanes and whether the weights are widened in a tile, apart, or not at all (8+ lanes: the first
    # tile widens each slice of rows for the others): each 4 lanes' outputs are bit for bit a 4-lane call's.
    if lanes > 12 and kernels.simd_path() == "portable":
        pytest.skip("the portable tile adds each slice's sum to the earlier ones' (converting path)")
    weight = RNG.standard_normal((40, 300)).astype(np.float16)  # 300 input channels: three slices of rows
    x = RNG.standard_normal((300, lanes)).astype(np.float32)
    whole = kernels.conv1x1(weight, x)
    for s in sorted({*range(0, lanes - 3, 4), lanes - 4}):
        np.testing.assert_array_equal(whole[:, s:s + 4], kernels.conv1x1(weight, np.ascontiguousarray(x[:, s:s + 4])))


def test_conv1x1_sums_alike_on_both_sides_of_the_group_tiles_bound():
    # AVX-512 reads fp16 panels in its group tiles while x ([cin][lanes] fp32) is at most 4 MiB, and converts them once
    # per slice beyond (the other flavours convert by their lane count alone): each output's sum is the same either way.
    weight = RNG.standard_normal((40, 1100)).astype(np.float16)
    x = RNG.standard_normal((1100, 1000)).astype(np.float32)  # 4.4 MB of x
    whole = kernels.conv1x1(weight, x)
    np.testing.assert_array_equal(whole[:, :900], kernels.conv1x1(weight, np.ascontiguousarray(x[:, :900])))  # 3.96 MB
    if kernels.simd_path() != "portable":  # (its many-lane tile adds each slice's sum to the earlier ones')
        np.testing.assert_array_equal(whole[:, 996:], kernels.conv1x1(weight, np.ascontiguousarray(x[:, 996:])))
    w32 = weight.astype(np.float32)
    assert_close(whole, w32.astype(np.float64) @ x.astype(np.float64), fp32_bound(w32, x), True)


def test_conv1x1_large_gpt2_shapes():
    for cout, cin in ((768, 768), (3072, 768), (768, 3072)):
        conv_case(cout, cin, 32, 32, round_=True)
        conv_case(cout, cin, 32, 1, round_=True)


@pytest.mark.parametrize("lanes", [5, 16, 24, 25])
def test_conv1x1_few_lanes_of_long_rows_match_a_contiguous_copy(lanes):
    # A short prompt in a long bucket (16 live lanes of rows 4 KiB apart) reads a compact copy of its lanes:
    # the same sums, bit for bit, as the lanes alone.
    weight = RNG.standard_normal((70, 300)).astype(np.float16)
    x = RNG.standard_normal((300, 1024)).astype(np.float32)
    got = kernels.conv1x1(weight, x, lanes=lanes)
    np.testing.assert_array_equal(got[:, :lanes], kernels.conv1x1(weight, np.ascontiguousarray(x[:, :lanes])))
    assert np.all(got[:, lanes:] == 0)
    conv_case(70, 300, 1024, lanes, round_=True)


def test_conv1x1_prefill_rows():
    conv_case(48, 96, 1024, 1000, round_=True)  # chunked lanes, a pair of panels and a single one
    conv_case(40, 33, 600, 517, round_=False)


@pytest.mark.parametrize("lanes", [1, 4, 7, 8, 12, 20, 25, 64, 300, 1000])
def test_conv1x1_output_rows_do_not_depend_on_their_neighbours(lanes):
    # Each output row sums its inputs the same way whether its panel runs alone or with another one
    # (decode's lanes: the fp16 pair tiles, one lane's and 4+ lanes'; many lanes: the converting pair tile).
    weight = RNG.standard_normal((48, 200)).astype(np.float16)
    x = RNG.standard_normal((200, 1024)).astype(np.float32)
    whole = kernels.conv1x1(weight, x, lanes=lanes)
    for rows in (slice(0, 16), slice(16, 32), slice(32, 48), slice(16, 48)):
        np.testing.assert_array_equal(kernels.conv1x1(weight[rows], x, lanes=lanes), whole[rows])


def test_conv1x1_reproduces_fp16_weights_exactly():
    cout, cin = 37, 45
    bits = RNG.integers(0, 0x7C00, size=(cout, cin), dtype=np.uint16)  # finite, incl. subnormals
    bits |= RNG.integers(0, 2, size=(cout, cin), dtype=np.uint16) << 15
    weight = bits.view(np.float16)
    got = kernels.conv1x1(weight, np.eye(cin, dtype=np.float32), round=False)  # one-hot lanes
    assert np.array_equal(got, weight.astype(np.float32))
    got = kernels.PackedConv1x1(weight)(np.eye(cin, dtype=np.float32)[:, ::-1], round=True)
    assert np.array_equal(got, weight.astype(np.float32)[:, ::-1])


def test_packed_conv1x1_reuse_and_attributes():
    weight = RNG.standard_normal((19, 23)).astype(np.float16)
    packed = kernels.PackedConv1x1(weight)
    assert (packed.cout, packed.cin) == (19, 23)
    x = RNG.standard_normal((23, 9)).astype(np.float32)
    first = packed(x, lanes=4)
    assert np.array_equal(first, packed(x, lanes=4))
    assert np.array_equal(first, kernels.conv1x1(weight, x, lanes=4))


def test_conv1x1_empty_and_degenerate():
    assert kernels.conv1x1(np.zeros((0, 5), np.float16), np.ones((5, 3), np.float32)).shape == (0, 3)
    got = kernels.conv1x1(np.zeros((4, 0), np.float16), np.ones((0, 3), np.float32))
    assert got.shape == (4, 3) and np.all(got == 0)
    assert np.all(kernels.conv1x1(np.ones((4, 5), np.float16), np.ones((5, 3), np.float32), lanes=0) == 0)


def test_conv1x1_rejects_bad_input():
    w = np.ones((4, 5), np.float16)
    x = np.ones((5, 3), np.float32)
    with pytest.raises(ValueError, match="float16"):
        kernels.conv1x1(w.astype(np.float32), x)
    with pytest.raises(ValueError, match="float32"):
        kernels.conv1x1(w, x.astype(np.float16))
    with pytest.raises(ValueError, match="2-D"):
        kernels.conv1x1(w, x[None])
    with pytest.raises(ValueError, match="channels"):
        kernels.conv1x1(w, np.ones((6, 3), np.float32))
    for lanes in (-1, 4):
        with pytest.raises(ValueError, match="lanes"):
            kernels.conv1x1(w, x, lanes=lanes)
    with pytest.raises(ValueError, match="float16"):
        kernels.PackedConv1x1(w.astype(">f2"))


def test_conv1x1_accepts_non_contiguous_input():
    weight = RNG.standard_normal((20, 30)).astype(np.float16)
    x = RNG.standard_normal((60, 10)).astype(np.float32)[::2]
    assert np.array_equal(kernels.conv1x1(weight, x), kernels.conv1x1(weight, np.ascontiguousarray(x)))
    assert np.array_equal(kernels.conv1x1(np.asfortranarray(weight), x), kernels.conv1x1(weight, x))


# --- conv1x1 with int8 weights (W8A16) ----------------------------------------------------------
# Scales of 4 significant bits make every q * scale (|q| <= 127) an fp16 value: the int8 kernel must
# then give, bit for bit, what the fp16 kernel gives the dequantized weight, and stay within the fp32
# accumulation band of a float64 reference. Power-of-two scales take the kernel's other path (the
# scale applied once per output): the same bits again.


def int8_weight(cout: int, cin: int, low: int = -12, high: int = -4,
                pow2: bool = False) -> tuple[np.ndarray, np.ndarray]:
    q = RNG.integers(-127, 128, size=(cout, cin)).astype(np.int8)
    mantissa = 8 if pow2 else RNG.integers(8, 16, size=cout)
    scale = (mantissa * np.exp2(RNG.integers(low, high, size=cout))).astype(np.float32)
    return q, scale


def test_int8_weights_fp16_exact_detects_inexact_products():
    q, scale = int8_weight(9, 13)
    assert kernels.int8_weights_fp16_exact(q, scale)
    exact = q.astype(np.float64) * scale[:, None]
    assert np.array_equal(exact.astype(np.float16).astype(np.float64), exact)  # the premise, checked by numpy
    scale[4] = np.float32(np.float16(0.1))  # 11 significant bits: q * scale needs up to 18
    assert not kernels.int8_weights_fp16_exact(q, scale)
    with pytest.raises(ValueError, match="fp16"):
        kernels.PackedConv1x1I8(q, scale)
    big = np.full(3, 1024.0, np.float32)  # 127 * 1024 overflows fp16
    assert not kernels.int8_weights_fp16_exact(np.full((3, 2), 127, np.int8), big)
    assert kernels.int8_weights_fp16_exact(np.full((3, 2), 63, np.int8), big)


def test_int8_weights_fp16_exact_agrees_with_float64_on_every_row():
    """The check decides a row from its largest odd part, smallest power of two and largest |q|: each row, alone,
    against float64 products of every weight (exact) and their float16 round trip, over scales whose products land
    on every edge: 11 significant bits, the subnormal step 2^-24, the largest value 65504, zero and non-finite."""
    rows, scales = [], []
    for mantissa_bits in range(1, 13):
        for exponent in (-40, -34, -31, -30, -29, -26, -24, -20, -8, 0, 3, 5, 6, 8, 9):
            mantissa = int(RNG.integers(1 << (mantissa_bits - 1), 1 << mantissa_bits)) | 1
            scales.append(np.float32(np.ldexp(mantissa, exponent)))
            rows.append(RNG.integers(-128, 128, size=6))
    for q in ([0, 0, 0], [1, 2, 4], [127, -127, 1], [-128, 64, 8], [3, 5, 7], [96, 48, 0]):
        for s in (0.0, 2.0 ** -24, 2.0 ** -25, 2.0 ** -17, 511.75, 65504 / 127, 1 / 3, np.inf, np.nan):
            rows.append(np.resize(q, 6))
            scales.append(np.float32(s))
    for q, s in zip(rows, scales):
        q8 = np.asarray(q, np.int8)[None]
        with np.errstate(invalid="ignore", over="ignore"):
            exact = q8.astype(np.float64) * np.float64(s)
            expected = bool(np.all(np.isfinite(exact)) and np.all(exact.astype(np.float16).astype(np.float64) == exact))
        assert kernels.int8_weights_fp16_exact(q8, np.array([s], np.float32)) == expected, (q, s)


@pytest.mark.parametrize("pow2", [False, True], ids=["4-bit scales", "power-of-two scales"])
@pytest.mark.parametrize("cout,cin", [(1, 1), (5, 7), (16, 40), (33, 129), (100, 300), (768, 768), (48, 3072)])
def test_conv1x1_i8_matches_float64_and_the_fp16_kernel_bit_for_bit(cout, cin, pow2):
    if "ORION_SIMD" in os.environ and cout * cin > 300_000:
        pytest.skip("a narrower path's run: the 48 x 3072 case covers the same tiles at a third of the cost")
    q, scale = int8_weight(cout, cin, pow2=pow2)
    w64 = q.astype(np.float64) * scale[:, None]
    halves = w64.astype(np.float16)
    packed = kernels.PackedConv1x1I8(q, scale)
    assert (packed.cout, packed.cin) == (cout, cin)
    for S, lanes in ((1, 1), (2, 2), (5, 3), (13, 13), (64, 64), (64, 1), (600, 517)):
        x = RNG.standard_normal((cin, S)).astype(np.float32)
        for round_ in (True, False):
            got = packed(x, lanes=lanes, round=round_)
            np.testing.assert_array_equal(got, kernels.conv1x1(halves, x, lanes=lanes, round=round_))
            ref = w64 @ x[:, :lanes].astype(np.float64)
            assert_close(got[:, :lanes], ref, fp32_bound(w64, x[:, :lanes]), round_)
            assert np.all(got[:, lanes:] == 0)


@pytest.mark.parametrize("pow2", [False, True], ids=["4-bit scales", "power-of-two scales"])
@pytest.mark.parametrize("lanes", list(range(0, 14)) + [31, 64, 300, 1000])
def test_conv1x1_i8_every_lane_count_is_bit_exact(lanes, pow2):
    q, scale = int8_weight(70, 200, pow2=pow2)
    x = RNG.standard_normal((200, 1024)).astype(np.float32)
    halves = (q.astype(np.float64) * scale[:, None]).astype(np.float16)
    np.testing.assert_array_equal(kernels.conv1x1_i8(q, scale, x, lanes=lanes),
                                  kernels.conv1x1(halves, x, lanes=lanes))


@pytest.mark.parametrize("pow2", [False, True], ids=["4-bit scales", "power-of-two scales"])
def test_conv1x1_i8_subnormal_and_negative_scales(pow2):
    q, scale = int8_weight(20, 30, low=-24, high=-20, pow2=pow2)  # products down to fp16's subnormals
    scale[::3] *= -1
    w64 = q.astype(np.float64) * scale[:, None]
    assert kernels.int8_weights_fp16_exact(q, scale)
    got = kernels.conv1x1_i8(q, scale, np.eye(30, dtype=np.float32), round=False)  # one-hot lanes: the weights
    np.testing.assert_array_equal(got, w64.astype(np.float32))


def test_conv1x1_i8_rejects_bad_input():
    q, scale = int8_weight(4, 5)
    x = np.ones((5, 3), np.float32)
    with pytest.raises(ValueError, match="int8"):
        kernels.conv1x1_i8(q.astype(np.int16), scale, x)
    with pytest.raises(ValueError, match="float32"):
        kernels.conv1x1_i8(q, scale.astype(np.float16), x)
    with pytest.raises(ValueError, match="entries"):
        kernels.conv1x1_i8(q, scale[:3], x)
    with pytest.raises(ValueError, match="channels"):
        kernels.conv1x1_i8(q, scale, np.ones((6, 3), np.float32))


# --- gemm ---------------------------------------------------------------------------------------

GEMM_SIZES = [(1, 1, 1), (1, 17, 5), (7, 1, 300), (13, 29, 17), (6, 16, 256), (100, 257, 300), (97, 513, 70),
              (200, 40, 600), (1, 1000, 64), (33, 7, 1), (2, 300, 129), (3, 70, 1000), (4, 9, 11),
              (1601, 23, 19), (5, 2099, 7),  # these two cross the packed outer blocks (1536 rows, 2048 columns)
              (64, 1, 64), (300, 1, 2)]  # one column (RoPE's partner times a head) streams A as gemv


@pytest.mark.parametrize("M,N,K", GEMM_SIZES)
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_gemm(M, N, K, transpose_a, transpose_b):
    A = RNG.standard_normal((M, K)).astype(np.float32)
    B = RNG.standard_normal((K, N)).astype(np.float32)
    a = np.ascontiguousarray(A.T) if transpose_a else A
    b = np.ascontiguousarray(B.T) if transpose_b else B
    ref = A.astype(np.float64) @ B.astype(np.float64)
    for round_ in (False, True):
        got = kernels.gemm(a, b, transpose_a=transpose_a, transpose_b=transpose_b, round=round_)
        assert got.shape == (M, N)
        assert_close(got, ref, fp32_bound(A, B), round_)


def test_gemm_strided_views():
    big_a = RNG.standard_normal((90, 120)).astype(np.float32)
    big_b = RNG.standard_normal((150, 80)).astype(np.float32)
    for rows in (1, 2, 3, 45):  # few rows stream B, more rows pack it
        a, b = big_a[: 2 * rows : 2, ::3], big_b[1::3, ::-2]  # [rows, 40] and [50, 40]: b.T is [40, 50]
        for b_view, transpose_b in ((b, True), (b.T, False), (np.ascontiguousarray(b.T)[:, ::2], False)):
            b_mat = b_view.T if transpose_b else b_view
            got = kernels.gemm(a, b_view, transpose_b=transpose_b, round=False)
            assert_close(got, a.astype(np.float64) @ b_mat.astype(np.float64), fp32_bound(a, b_mat), False)


def test_gemm_one_column_of_a_signed_permutation_is_exact():
    """A decode step's RoPE partner (one +-1 per row) times a head: the permuted head, exactly, either A layout."""
    mate = RNG.permutation(64)
    sign = RNG.choice([-1.0, 1.0], 64).astype(np.float32)
    partner = np.zeros((64, 64), np.float32)
    partner[np.arange(64), mate] = sign
    x = RNG.standard_normal((64, 1)).astype(np.float16).astype(np.float32)
    for transpose_a in (False, True):
        a = np.ascontiguousarray(partner.T) if transpose_a else partner
        got = kernels.gemm(a, x, transpose_a=transpose_a, round=True)
        np.testing.assert_array_equal(got[:, 0], sign * x[mate, 0])


def test_gemm_empty_and_zero_k():
    assert kernels.gemm(np.zeros((0, 3), np.float32), np.zeros((3, 4), np.float32)).shape == (0, 4)
    got = kernels.gemm(np.zeros((2, 0), np.float32), np.zeros((0, 4), np.float32))
    assert got.shape == (2, 4) and np.all(got == 0)


def test_gemm_rejects_bad_input():
    a = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match="inner dimensions"):
        kernels.gemm(a, np.ones((5, 2), np.float32))
    with pytest.raises(ValueError, match="float32"):
        kernels.gemm(a.astype(np.float64), np.ones((4, 2), np.float32))
    with pytest.raises(ValueError, match="2-D"):
        kernels.gemm(a, np.ones(4, np.float32))


# --- fp16 conversion and NaN scan ---------------------------------------------------------------

def test_to_fp16_rounds_as_numpy():
    edge = np.array([0.0, -0.0, 65504.0, 65519.99, 65520.0, -1e9, 6e-8, 2.98e-8, 2.99e-8, 1e-45, 1.0 + 2.0**-11,
                     1.0 + 3 * 2.0**-11, np.inf, -np.inf, 3.3e-5], np.float32)  # overflow, subnormals, ties
    for src in (edge, (RNG.standard_normal(300_000) * 300).astype(np.float32).reshape(3, 100_000)):
        out = np.empty(src.shape, np.float16)
        kernels.to_fp16(src, out)
        np.testing.assert_array_equal(out.view(np.uint16), src.astype(np.float16).view(np.uint16))
    with pytest.raises(ValueError, match="elements"):
        kernels.to_fp16(edge, np.empty(3, np.float16))
    with pytest.raises(ValueError, match="float32"):
        kernels.to_fp16(edge.astype(np.float64), np.empty(edge.size, np.float16))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_has_nan(dtype):
    a = (RNG.standard_normal(700_001)).astype(dtype)
    a[5] = np.inf
    a[6] = -np.inf
    assert not kernels.has_nan(a)
    for at in (0, 350_000, 700_000):
        b = a.copy()
        b[at] = -np.nan if at else np.nan
        assert kernels.has_nan(b) == bool(np.isnan(b).any())
    with pytest.raises(ValueError, match="float16 or float32"):
        kernels.has_nan(a.astype(np.float64))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.uint8])
@pytest.mark.parametrize("n", [0, 1, 1_000_003, 3 << 19])
def test_copy_is_numpy_copy_bit_for_bit(dtype, n):
    src = RNG.integers(0, 255, n * np.dtype(dtype).itemsize, np.uint8).view(dtype)  # NaN and Inf bits too
    dst = np.zeros(n, dtype)
    kernels.copy(dst, src)
    assert dst.tobytes() == src.tobytes()
    view = np.zeros(n + 8, dtype)[3:3 + n]  # a packed view at an offset, as surfaces hold tensors
    kernels.copy(view, src)
    assert view.tobytes() == src.tobytes()


def test_copy_overlapping_and_errors():
    a = np.arange(2_000_000, dtype=np.float32)
    expected = a[:1_500_000].copy()
    kernels.copy(a[500_000:], a[:1_500_000])  # overlapping ranges: as numpy's copyto, through a buffer
    assert np.array_equal(a[500_000:], expected)
    with pytest.raises(ValueError, match="one dtype"):
        kernels.copy(np.zeros(4, np.float16), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="one size"):
        kernels.copy(np.zeros(4, np.float32), np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.copy(np.zeros(8, np.float32)[::2], np.zeros(4, np.float32))
    read_only = np.zeros(4, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        kernels.copy(read_only, np.zeros(4, np.float32))


def test_copy_into_and_copied_are_numpy_copyto_and_copy():
    from orion.runtime.packing import PARALLEL_COPY_BYTES, copied, copy_into

    big = RNG.standard_normal(PARALLEL_COPY_BYTES // 2 + 7).astype(np.float16)  # the parallel path
    wide = RNG.standard_normal(big.size).astype(np.float32) * 3e4  # float32 into float16: rounded as numpy
    wide[:8] = [np.nan, np.inf, -7e4, 65519.0, 65520.0, 1e-7, -3e-8, 2.0**-24 * 1.5]  # overflow, ties, subnormals
    for src in (big, wide, big[:100], big[::2], 1.5, [1.0, 2.0]):  # strided, small and lists: numpy's copy
        expected = np.zeros(np.shape(src) or (3,), np.float16)
        with np.errstate(over="ignore"):
            np.copyto(expected, src, casting="same_kind")
        dst = np.zeros(expected.shape, np.float16)
        copy_into(dst, src)
        assert dst.tobytes() == expected.tobytes()
    with pytest.raises(TypeError):
        copy_into(np.zeros(4, np.float16), np.zeros(4, np.complex64))  # numpy's refusal, unchanged
    for a in (big.reshape(-1, 1), big[::3], big[:10]):
        out = copied(a)
        assert out.flags.c_contiguous and out.dtype == a.dtype and np.array_equal(out, a, equal_nan=True)


# --- thread pool --------------------------------------------------------------------------------


@pytest.mark.parametrize("guided", [False, True])
@pytest.mark.parametrize("n,grain", [(0, 1), (1, 1), (7, 1), (100, 3), (1000, 1), (1000, 400), (12345, 17)])
def test_parallel_for_covers_each_index_once(n, grain, guided):
    assert np.all(kernels._parallel_for_probe(n, grain, guided=guided) == 1)
    assert np.all(kernels._parallel_for_probe(n, grain, nested=True, guided=guided) == 1)


@pytest.mark.parametrize("n,grain", [(7, 1), (100, 3), (1000, 1), (1000, 400), (12345, 17), (10**6, 1)])
def test_parallel_for_guided_chunks_shrink_and_partition_the_range(n, grain):
    """Guided chunks tile [0, n) in order; each is at least grain and at most the one before it, but the last, which
    takes a rest shorter than grain (or, at the 64th chunk, all the rest); with 2+ threads the first is a
    1/(2 * threads) share of the whole."""
    chunks = kernels._parallel_for_guided_chunks(n, grain)
    assert [b for b, _ in chunks] == [0] + [e for _, e in chunks[:-1]] and chunks[-1][1] == n
    sizes = [e - b for b, e in chunks]
    assert all(s >= grain for s in sizes) and all(a >= b for a, b in zip(sizes[:-2], sizes[1:-1]))
    if len(sizes) > 1:
        share = 2 * kernels.num_threads()
        assert sizes[0] == max(grain, -(-n // share)) and len(sizes) <= 64
        assert len(sizes) == 64 or sizes[-1] < sizes[-2] + grain


def test_parallel_for_propagates_exceptions_and_survives():
    for fail_at in (0, 5, 999):
        for guided in (False, True):
            with pytest.raises(ValueError, match=f"failure at index {fail_at}"):
                kernels._parallel_for_probe(1000, 1, fail_at=fail_at, guided=guided)
            with pytest.raises(ValueError, match="failure"):
                kernels._parallel_for_probe(1000, 1, fail_at=fail_at, nested=True, guided=guided)
    assert np.all(kernels._parallel_for_probe(1000, 1) == 1)
    weight = RNG.standard_normal((64, 64)).astype(np.float16)
    x = RNG.standard_normal((64, 4)).astype(np.float32)
    assert np.array_equal(kernels.conv1x1(weight, x), kernels.conv1x1(weight, x))


def test_concurrent_callers():
    weight = RNG.standard_normal((512, 256)).astype(np.float16)
    x = RNG.standard_normal((256, 16)).astype(np.float32)
    packed = kernels.PackedConv1x1(weight)
    expected = packed(x)
    failures = []

    def worker():
        for _ in range(20):
            if not np.array_equal(packed(x), expected) or not np.all(kernels._parallel_for_probe(5000, 1) == 1):
                failures.append(1)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def run_python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_process_exit_and_fork_do_not_hang():
    done = run_python(
        """
        import os, numpy as np
        from orion._core import kernels
        w = np.ones((256, 256), np.float16); x = np.ones((256, 8), np.float32)
        assert kernels.conv1x1(w, x)[0, 0] == 256
        pid = os.fork()
        if pid == 0:
            ok = kernels.conv1x1(w, x)[0, 0] == 256 and (kernels._parallel_for_probe(1000, 1) == 1).all()
            os._exit(0 if ok else 3)
        assert os.waitpid(pid, 0)[1] == 0
        print("done")
        """
    )
    assert done.returncode == 0 and "done" in done.stdout, done.stderr


@pytest.fixture(scope="module")
def narrower_runs() -> dict[str, subprocess.Popen]:
    """This file's tests under each narrower SIMD path, one subprocess per path, run at the same time."""
    paths = ["portable"] + (["avx2"] if kernels.simd_path() == "avx512f+f16c+fma" else [])
    runs = {path: subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "ORION_SIMD": path, "ORION_NUM_THREADS": "3"})
            for path in paths}
    yield runs
    for run in runs.values():
        run.kill()
        run.wait()


@pytest.mark.skipif("ORION_SIMD" in os.environ, reason="this is a narrower path's run")
@pytest.mark.parametrize("path", ["portable", "avx2"])
def test_narrower_path_in_subprocess(path: str, narrower_runs: dict[str, subprocess.Popen]):
    if path not in narrower_runs:
        pytest.skip("the default path is already AVX2 or portable")
    output, _ = narrower_runs[path].communicate(timeout=900)
    assert narrower_runs[path].returncode == 0, output[-6000:]


def test_tanh_is_accurate_far_below_fp16_rounding() -> None:
    x = np.concatenate([np.linspace(-12, 12, 400_001, dtype=np.float32),
                        np.array([0.0, -0.0, 1e-30, -1e-30, 0.0625, 88, -88, 1e4, -1e4, np.inf, -np.inf], np.float32)])
    got = kernels.tanh(x)
    want = np.tanh(x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=0)  # fp16 rounding is 4.9e-4 relative
    assert np.signbit(got[x == 0]).tolist() == np.signbit(x[x == 0]).tolist()
    assert np.isnan(kernels.tanh(np.array([np.nan], np.float32)))[0]


def reference_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("width", [1, 7, 8, 33, 1024])
def test_softmax_is_accurate_far_below_fp16_rounding(width: int) -> None:
    x = (RNG.standard_normal((64, width)) * 8).astype(np.float32)
    x[::3, width // 2:] += -65504.0  # masked tails (a causal mask): exactly 0 after the exp
    got = kernels.softmax(x)
    want = reference_softmax(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30)  # fp16 rounding is 4.9e-4 relative
    assert np.all(got[::3, width // 2:][:, 1:] == 0) if width > 2 else True
    assert np.array_equal(got.max(axis=-1) > 0, np.ones(64, bool))


def test_softmax_of_specials_follows_ieee() -> None:
    x = np.array([[0.0, np.inf, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
                  [np.nan] + [1.0] * 8,
                  [-np.inf] * 9], np.float32)
    got = kernels.softmax(x)
    assert np.isnan(got[0, 1]) and np.isnan(got[1]).all() and np.isnan(got[2]).all()


def reference_cross_entropy(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy over the kept (non-negative) targets and its gradient, in float64."""
    x = logits.astype(np.float64)
    lse = x.max(1) + np.log(np.exp(x - x.max(1, keepdims=True)).sum(1))
    kept = np.flatnonzero(targets >= 0)
    d = np.exp(x - lse[:, None]) / len(kept)
    d[kept, targets[kept]] -= 1.0 / len(kept)
    d[targets < 0] = 0.0
    return float((lse[kept] - x[kept, targets[kept]]).mean()), d


@pytest.mark.parametrize("vocab", [1, 7, 8, 33, 1000])
def test_cross_entropy_kernel_matches_float64(vocab: int) -> None:
    """orion._core.train.cross_entropy (the scaled_softmax kernel per row, rows across the threads): loss within
    1e-7 relative, the gradient within 5e-7 relative (the exponential, the pairwise fp32 sum, 1 / (sum * kept) and
    the product each rounded) plus 4 fp32 ulps of 1 / kept (a target's p / kept - 1 / kept cancels in fp32)."""
    rows = 67
    logits = (RNG.standard_normal((rows, vocab)) * 12).astype(np.float32)
    logits[5, :] -= 500.0  # a row far from 0: shifted by its max before the exp
    targets = RNG.integers(0, vocab, rows)
    targets[[2, 40]] = -100  # ignored positions
    want_loss, want = reference_cross_entropy(logits, targets)
    got = logits.copy()
    loss = _core.train.cross_entropy(got, targets)
    assert loss == pytest.approx(want_loss, rel=1e-7)
    np.testing.assert_allclose(got, want, rtol=5e-7, atol=4 * EPS32 / (rows - 2))
    assert np.all(got[[2, 40]] == 0.0)


def test_cross_entropy_kernel_rounds_as_numpy() -> None:
    """The gradient's softmax / kept rounds as numpy's fp32 passes with a correctly rounded exp (x - max, e^x in
    float64 rounded to fp32, np.sum's pairwise order, np.float32(1) / (sum * kept), the product): all but a few
    values (an exponential within 1e-11 of a rounding tie) bit for bit, none more than 2 ulps off. (np.exp's own
    fp32 exp is not correctly rounded on every machine: on an AVX2 one, 61% of these values.)"""
    rows, vocab = 16, 32000
    logits = (RNG.standard_normal((rows, vocab)) * 3).astype(np.float32)
    targets = RNG.integers(0, vocab, rows)
    got = logits.copy()
    _core.train.cross_entropy(got, targets)
    want = np.exp((logits - logits.max(-1, keepdims=True)).astype(np.float64)).astype(np.float32)
    want *= np.float32(1.0) / (want.sum(-1, keepdims=True) * np.float32(rows))
    want[np.arange(rows), targets] -= np.float32(1.0 / rows)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    assert ulps.max() <= 2 and np.mean(ulps == 0) > 0.999, (ulps.max(), np.mean(ulps == 0))


def test_cross_entropy_kernel_propagates_specials() -> None:
    """A NaN or Inf logit makes its row's gradient and the loss NaN (the trainer then skips the step); the other
    rows are as without it."""
    logits = RNG.standard_normal((4, 40)).astype(np.float32)
    targets = np.array([1, 2, 3, 4])
    clean = logits.copy()
    _core.train.cross_entropy(clean, targets)
    for special in (np.nan, np.inf):
        got = logits.copy()
        got[1, 17] = special
        assert np.isnan(_core.train.cross_entropy(got, targets))
        assert np.isnan(got[1]).any() and np.array_equal(got[[0, 2, 3]], clean[[0, 2, 3]])


def test_half_to_float_is_exact_for_every_fp16_value() -> None:
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(256, 256)
    got, want = kernels.half_to_float(every), every.astype(np.float32)  # numpy's conversion: the reference
    assert got.dtype == np.float32 and got.shape == every.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan) and np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.array_equal(kernels.half_to_float(every.T), want.T, equal_nan=True)  # a strided view is copied first
    with pytest.raises(ValueError, match="dtype float16"):
        kernels.half_to_float(want)
