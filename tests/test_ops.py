"""Every emulator op against an independent numpy fp32 reference.

Inputs are fp16; the reference computes in fp32 on the same fp16 values. Tolerances: one op's
result is rounded to fp16 once, so elementwise results must agree to 1e-3 relative (two fp16
ulps); accumulating ops (conv, matmul, reductions) to 2e-3 relative of the output magnitude.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import orion
from support.handmil import SEVERAL_SURFACES, blob_const, blobfile, const, op, program, ttype

RNG = np.random.default_rng(1234)
MIL_OF = {np.float16: "fp16", np.float32: "fp32", np.int32: "int32", np.int8: "int8", np.uint8: "uint8", np.bool_: "bool"}


def mil_dtype(a: np.ndarray) -> str:
    return MIL_OF[a.dtype.type]


def run_op(name: str, inputs: dict[str, np.ndarray], out_shape, out_dtype: str = "fp16", consts=(), weights=None,
           profile: str = "hardware", **args) -> np.ndarray:
    """Runs one op `name(**args)` on `inputs` (also usable as args) with extra const statements."""
    text = program({k: ttype(mil_dtype(v), v.shape) for k, v in inputs.items()},
                   list(consts) + [op("out", ttype(out_dtype, out_shape), name, **args)], ["out"])
    return orion.compile(text, weights, profile=profile, **SEVERAL_SURFACES)(**inputs)["out"]


def f16(*shape, scale=1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float16)


def close(out: np.ndarray, ref: np.ndarray, rtol: float = 1e-3, atol: float = 1e-3) -> None:
    assert out.shape == ref.shape
    np.testing.assert_allclose(out.astype(np.float32), ref.astype(np.float32), rtol=rtol, atol=atol)


ACT = (1, 64, 1, 32)


@pytest.mark.parametrize("name,fn", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply)])
@pytest.mark.parametrize("y_shape", [ACT, (1, 64, 1, 1), (1, 1, 1, 32), (1, 1, 1, 1), (64, 1, 1)])
def test_binary_broadcasting(name, fn, y_shape) -> None:
    x, y = f16(*ACT), f16(*y_shape)
    text_y = const("yc", "fp16", y, y_shape)
    out = run_op(name, {"x": x}, np.broadcast_shapes(ACT, y_shape), consts=[text_y], x="x", y="yc")
    close(out, fn(x.astype(np.float32), y.astype(np.float32)))


def test_binary_with_scalar_const_and_runtime_operands() -> None:
    x, y = f16(*ACT), f16(*ACT)
    out = run_op("mul", {"x": x}, ACT, consts=[const("s", "fp16", 0.125)], x="x", y="s")
    close(out, x.astype(np.float32) * 0.125)
    close(run_op("sub", {"a": x, "b": y}, ACT, x="a", y="b"), x.astype(np.float32) - y.astype(np.float32))


def test_real_div() -> None:
    x, y = f16(*ACT), (np.abs(f16(*ACT)) + 0.5).astype(np.float16)
    out = run_op("real_div", {"x": x, "y": y}, ACT, profile="permissive", x="x", y="y")
    close(out, x.astype(np.float32) / y.astype(np.float32))


def test_pow_as_rsqrt() -> None:
    x = (np.abs(f16(*ACT)) + 0.1).astype(np.float16)
    out = run_op("pow", {"x": x}, ACT, consts=[const("e", "fp16", -0.5)], x="x", y="e")
    close(out, x.astype(np.float32) ** -0.5)


def _gelu_exact(v):
    return 0.5 * v * (1.0 + np.vectorize(math.erf)(v / math.sqrt(2.0)))


UNARY = [
    ("tanh", np.tanh, {}, "hardware"),
    ("sigmoid", lambda v: 1.0 / (1.0 + np.exp(-v)), {}, "hardware"),
    ("exp", np.exp, {}, "hardware"),
    ("relu", lambda v: np.maximum(v, 0.0), {}, "hardware"),
    ("identity", lambda v: v, {}, "hardware"),
    ("sqrt", lambda v: np.sqrt(np.abs(v)), {}, "permissive"),
]


@pytest.mark.parametrize("name,fn,extra,profile", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, fn, extra, profile) -> None:
    x = f16(*ACT, scale=2.0)
    if name == "sqrt":
        x = np.abs(x)
    close(run_op(name, {"x": x}, ACT, profile=profile, x="x"), fn(x.astype(np.float32)))


@pytest.mark.parametrize("name,fn", [("sigmoid", lambda v: 1.0 / (1.0 + np.exp(-v))), ("tanh", np.tanh)])
def test_vectorised_unary_over_every_fp16_value(name, fn) -> None:
    """The vectorised kernels (e^x by a series, clamped to [-88, 88]) over all 63,488 finite fp16 values and the
    infinities: each result is float64's rounded to fp16, or one fp16 ulp from it where float64's lies within a few
    fp32 ulps of a rounding boundary; the infinities give the limits. (Inputs holding a NaN are refused.)"""
    bits = np.arange(1 << 16, dtype=np.uint16)
    values = bits.view(np.float16)
    x = np.concatenate([values[np.isfinite(values)], np.float16([np.inf, -np.inf])])
    x = np.resize(x, 64 * 1024).reshape(1, 64, 1, 1024)  # padded by repeating: the lanes fill the rows
    with np.errstate(over="ignore"):
        want = fn(x.astype(np.float64)).astype(np.float16)
    got = run_op(name, {"x": x}, x.shape, x="x")
    g, w = got.astype(np.float64), want.astype(np.float64)
    ulp = np.spacing(np.abs(w).astype(np.float16)).astype(np.float64)
    assert (np.abs(g - w) <= ulp).all(), x[np.abs(g - w) > ulp][:8]
    assert np.mean(g == w) > 0.999


def test_rsqrt_with_epsilon() -> None:
    x = np.abs(f16(*ACT)).astype(np.float16)
    out = run_op("rsqrt", {"x": x}, ACT, consts=[const("eps", "fp16", 0.01)], profile="permissive", x="x", epsilon="eps")
    close(out, 1.0 / np.sqrt(x.astype(np.float32) + np.float32(np.float16(0.01))))


@pytest.mark.parametrize("mode,fn", [
    ("EXACT", _gelu_exact),
    ("TANH_APPROXIMATION", lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))),
    ("SIGMOID_APPROXIMATION", lambda v: v / (1 + np.exp(-1.702 * v))),
])
def test_gelu_modes(mode, fn) -> None:
    x = f16(*ACT, scale=2.0)
    out = run_op("gelu", {"x": x}, ACT, consts=[const("m", "string", mode)], profile="permissive", x="x", mode="m")
    close(out, fn(x.astype(np.float32)))


def test_fp16_overflow_becomes_inf() -> None:
    x = np.full(ACT, 300.0, np.float16)
    x[0, 0, 0, 0] = -300.0
    x[0, 1, 0, 0] = 255.0  # 65025 stays finite
    out = run_op("mul", {"x": x}, ACT, x="x", y="x")
    assert np.isinf(out[0, 2, 0, 0]) and out[0, 2, 0, 0] > 0
    assert out[0, 0, 0, 0] == np.inf  # (-300)^2
    assert out[0, 1, 0, 0] == np.float16(65024.0)
    big = np.full(ACT, 65504.0, np.float16)
    summed = run_op("add", {"x": big}, ACT, consts=[const("d", "fp16", 16.0)], x="x", y="d")
    assert np.all(np.isinf(summed))  # 65520 rounds up past the largest fp16
    kept = run_op("add", {"x": big}, ACT, consts=[const("d", "fp16", 8.0)], x="x", y="d")
    assert np.all(kept == np.float16(65504.0))  # 65512 rounds back down
    e = run_op("exp", {"x": np.full(ACT, 12.0, np.float16)}, ACT, x="x")
    assert np.all(np.isinf(e))


@pytest.mark.parametrize("axis", [1, 3, -1])
def test_softmax(axis) -> None:
    x = f16(*ACT, scale=3.0)
    out = run_op("softmax", {"x": x}, ACT, consts=[const("ax", "int32", axis)], x="x", axis="ax")
    v = x.astype(np.float32)
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    close(out, e / e.sum(axis=axis, keepdims=True), rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize("name,fn,profile", [("reduce_sum", np.sum, "hardware"), ("reduce_max", np.max, "hardware"),
                                             ("reduce_mean", np.mean, "permissive")])
@pytest.mark.parametrize("axes,keep", [([1], True), ([1], False), ([1, 3], True), ([-1], True)])
def test_reductions(name, fn, profile, axes, keep) -> None:
    x = f16(*ACT)
    ref = fn(x.astype(np.float32), axis=tuple(axes), keepdims=keep)
    kd = const("kd", "bool", keep)
    if ref.ndim == 0 or ref.shape[-1] < 32:  # fp16 outputs under 32 lanes are an ANE-14 error on hardware
        profile = "permissive"
    out = run_op(name, {"x": x}, ref.shape, consts=[const("ax", "int32", axes, [len(axes)]), kd], profile=profile,
                 x="x", axes="ax", keep_dims="kd")
    close(out, ref, rtol=2e-3, atol=2e-3 * float(np.abs(ref).max()))


@pytest.mark.parametrize("name", ["reduce_sum", "reduce_max", "reduce_mean"])
@pytest.mark.parametrize("shape,axes", [((1, 768, 1, 256), [1]), ((1, 768, 1, 256), [3]), ((2, 384, 1, 256), [0, 1]),
                                        ((2, 384, 1, 256), [1, 3]), ((2, 384, 1, 200), [0, 3]),
                                        ((1, 12, 13, 256), [3])])
def test_large_reductions_sum_in_row_then_lane_order(name, shape, axes) -> None:
    """Training-sized reductions, whose rows or lanes the emulator splits over its threads (a kept last axis: the
    lanes; a reduced one: the rows, when each has a group of its own, 8 rows' sums interleaved, with a tail of
    fewer, e.g. 156 rows): every result is the fp32 sum of its
    elements in row order, then lane order, as one thread computes it, bit for bit (fp32 in and out, against
    sequential fp32 sums by np.add.accumulate over the elements in that order); and within 2e-3 of float64."""
    x = f16(*shape).astype(np.float32)  # fp32 in and out: no fp16 rounding hides a change of order
    moved = np.moveaxis(x, axes, list(range(4 - len(axes), 4)))  # reduced axes last, in order
    flat = moved.reshape(*moved.shape[:4 - len(axes)], -1)
    if name == "reduce_max":
        seq = flat.max(-1)
    else:
        seq = np.add.accumulate(flat, axis=-1, dtype=np.float32)[..., -1]
        if name == "reduce_mean":
            seq = seq / np.float32(flat.shape[-1])
    keep_shape = tuple(1 if d in axes else n for d, n in enumerate(shape))
    ref = seq.reshape(keep_shape)
    kd = const("kd", "bool", True)
    out = run_op(name, {"x": x}, keep_shape, "fp32", consts=[const("ax", "int32", axes, [len(axes)]), kd],
                 profile="permissive", x="x", axes="ax", keep_dims="kd")
    np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32))
    if name == "reduce_sum":  # the order is visible in fp32: the sums in reverse order differ somewhere
        assert (np.add.accumulate(flat[..., ::-1], axis=-1)[..., -1].reshape(keep_shape) != out).any()
    fn = {"reduce_sum": np.sum, "reduce_max": np.max, "reduce_mean": np.mean}[name]
    want = fn(x.astype(np.float64), axis=tuple(axes), keepdims=True)
    close(out, want, rtol=2e-3, atol=2e-3 * float(np.abs(want).max()))


def test_reshape_and_transpose() -> None:
    x = f16(1, 64, 1, 32)
    out = run_op("reshape", {"x": x}, (1, 4, 16, 32), consts=[const("s", "int32", [1, 4, -1, 32], [4])], x="x", shape="s")
    close(out, x.reshape(1, 4, 16, 32), rtol=0, atol=0)
    perm = [0, 3, 2, 1]
    out = run_op("transpose", {"x": x}, (1, 32, 1, 64), consts=[const("p", "int32", perm, [4])], profile="permissive",
                 x="x", perm="p")
    close(out, x.transpose(perm), rtol=0, atol=0)


def test_cast() -> None:
    x = (RNG.standard_normal(ACT) * 4e4).astype(np.float32)
    text = program({"x": ttype("fp32", ACT)}, [
        const("h", "string", "fp16"), const("f", "string", "fp32"), const("i", "string", "int32"),
        op("a", ttype("fp16", ACT), "cast", x="x", dtype="h"),
        op("b", ttype("fp32", ACT), "cast", x="a", dtype="f"),
        op("c", ttype("int32", ACT), "cast", x="x", dtype="i"),
    ], ["b", "c"])
    out = orion.compile(text)(x=x)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out["b"], x.astype(np.float16).astype(np.float32))  # overflow to inf included
    assert np.isinf(out["b"]).any()
    np.testing.assert_array_equal(out["c"], np.trunc(x).astype(np.int32))


def test_slice_by_size() -> None:
    x = f16(1, 64, 1, 64)
    out = run_op("slice_by_size", {"x": x}, (1, 16, 1, 32),
                 consts=[const("b", "int32", [0, 8, 0, 32], [4]), const("s", "int32", [1, 16, 1, -1], [4])],
                 x="x", begin="b", size="s")
    close(out, x[:, 8:24, :, 32:], rtol=0, atol=0)


def test_slice_by_index_with_stride_and_masks() -> None:
    x = f16(1, 64, 1, 64)
    consts = [const("b", "int32", [0, 4, 0, 1], [4]), const("e", "int32", [1, 60, 1, 0], [4]),
              const("st", "int32", [1, 2, 1, 1], [4]), const("em", "bool", [False, False, False, True], [4])]
    out = run_op("slice_by_index", {"x": x}, (1, 28, 1, 63), consts=consts, profile="permissive",
                 x="x", begin="b", end="e", stride="st", end_mask="em")
    close(out, x[:, 4:60:2, :, 1:], rtol=0, atol=0)


@pytest.mark.parametrize("interleave", [False, True])
def test_concat(interleave) -> None:
    a, b = f16(1, 32, 1, 32), f16(1, 32, 1, 32)
    out = run_op("concat", {"a": a, "b": b}, (1, 64, 1, 32), profile="permissive",
                 consts=[const("ax", "int32", 1), const("il", "bool", interleave)], values=["a", "b"], axis="ax",
                 interleave="il")
    ref = np.stack([a, b], axis=2).reshape(1, 64, 1, 32) if interleave else np.concatenate([a, b], axis=1)
    close(out, ref, rtol=0, atol=0)


CONV_ARGS = dict(dilations="dl", groups="gr", pad="pd", pad_type="pt", strides="st", weight="W", x="x")


def conv_consts(groups=1, pad=(0, 0, 0, 0), pad_type="valid", strides=(1, 1), dilations=(1, 1)):
    return [const("dl", "int32", dilations, [2]), const("gr", "int32", groups), const("pd", "int32", pad, [4]),
            const("pt", "string", pad_type), const("st", "int32", strides, [2])]


def test_conv_1x1_blobfile_weights() -> None:
    w = f16(96, 64, 1, 1, scale=0.2)
    x = f16(*ACT)
    weights = {"@model_path/weights/w.bin": blobfile(w.tobytes())}
    out = run_op("conv", {"x": x}, (1, 96, 1, 32), weights=weights,
                 consts=conv_consts() + [blob_const("W", "fp16", w.shape, "@model_path/weights/w.bin")], **CONV_ARGS)
    ref = np.einsum("oc,bcs->bos", w[:, :, 0, 0].astype(np.float32), x[:, :, 0, :].astype(np.float32))[:, :, None, :]
    close(out, ref, rtol=2e-3, atol=2e-3 * float(np.abs(ref).max()))


def _conv_reference(x, w, stride, pad, dilation, groups):
    """Direct NCHW convolution in fp32 (pad = top, bottom, left, right)."""
    x = np.pad(x.astype(np.float32), ((0, 0), (0, 0), (pad[0], pad[1]), (pad[2], pad[3])))
    n, cin, h, wd = x.shape
    cout, cin_g, kh, kw = w.shape
    oh = (h - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, cout, oh, ow), np.float32)
    cout_g = cout // groups
    for o in range(cout):
        g = o // cout_g
        for i in range(kh):
            for j in range(kw):
                patch = x[:, g * cin_g:(g + 1) * cin_g, i * dilation[0]:i * dilation[0] + stride[0] * oh:stride[0],
                          j * dilation[1]:j * dilation[1] + stride[1] * ow:stride[1]]
                out[:, o] += np.einsum("c,nchw->nhw", w[o, :, i, j].astype(np.float32), patch)
    return out


def test_conv_general_kernel_stride_pad_groups_dilation() -> None:
    x = f16(1, 8, 9, 40)
    w = f16(6, 4, 3, 3, scale=0.3)
    consts = conv_consts(groups=2, pad=(1, 0, 2, 1), pad_type="custom", strides=(2, 1), dilations=(1, 2))
    ref = _conv_reference(x, w, (2, 1), (1, 0, 2, 1), (1, 2), 2)
    out = run_op("conv", {"x": x}, ref.shape, consts=consts + [const("W", "fp16", w, w.shape)], **CONV_ARGS)
    close(out, ref, rtol=2e-3, atol=2e-3 * float(np.abs(ref).max()))


@pytest.mark.parametrize("tx,ty", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_runtime_operands_and_transposes(tx, ty) -> None:
    a = f16(2, 3, 48, 32) if not tx else f16(2, 3, 32, 48)
    b = f16(1, 3, 32, 64) if not ty else f16(1, 3, 64, 32)
    consts = [const("tx", "bool", tx), const("ty", "bool", ty)]
    out = run_op("matmul", {"a": a, "b": b}, (2, 3, 48, 64), consts=consts, x="a", y="b", transpose_x="tx",
                 transpose_y="ty")
    ref = np.matmul(np.swapaxes(a, -1, -2) if tx else a, np.swapaxes(b, -1, -2) if ty else b, dtype=np.float32)
    close(out, ref, rtol=2e-3, atol=2e-3 * float(np.abs(ref).max()))


@pytest.mark.parametrize("tx,ty", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_runtime_operands_odd_sizes_against_float64(tx, ty) -> None:
    # Both operands program inputs (fp16; y read in place by the packed GEMM): odd M and N, K across two
    # 256-deep slices, a broadcast batch; the reference is float64 on the same fp16 values.
    M, K, N = 37, 301, 53
    a = f16(2, 1, *((K, M) if tx else (M, K)))
    b = f16(1, 3, *((N, K) if ty else (K, N)))
    consts = [const("tx", "bool", tx), const("ty", "bool", ty)]
    out = run_op("matmul", {"a": a, "b": b}, (2, 3, M, N), consts=consts, x="a", y="b", transpose_x="tx",
                 transpose_y="ty")
    ref = np.matmul(np.swapaxes(a, -1, -2) if tx else a, np.swapaxes(b, -1, -2) if ty else b, dtype=np.float64)
    close(out, ref, rtol=2e-3, atol=2e-3 * float(np.abs(ref).max()))


def test_layer_norm() -> None:
    x = f16(*ACT, scale=3.0)
    gamma, beta = f16(64), f16(64)
    consts = [const("ax", "int32", [1], [1]), const("g", "fp16", gamma, [64]), const("bt", "fp16", beta, [64]),
              const("eps", "fp16", 1e-5)]
    out = run_op("layer_norm", {"x": x}, ACT, consts=consts, profile="permissive", x="x", axes="ax", gamma="g",
                 beta="bt", epsilon="eps")
    v = x.astype(np.float32)
    mu, var = v.mean(axis=1, keepdims=True), v.var(axis=1, keepdims=True)
    ref = (v - mu) / np.sqrt(var + np.float32(np.float16(1e-5))) * gamma.astype(np.float32)[None, :, None, None] \
        + beta.astype(np.float32)[None, :, None, None]
    close(out, ref, rtol=3e-3, atol=3e-3)


@pytest.mark.parametrize("mask_kind", ["none", "float", "bool"])
def test_scaled_dot_product_attention(mask_kind) -> None:
    q, k, v = f16(1, 2, 32, 32), f16(1, 2, 32, 32), f16(1, 2, 32, 32)
    causal = np.tril(np.ones((32, 32), bool))
    inputs, args, consts = {"q": q, "k": k, "v": v}, dict(query="q", key="k", value="v"), []
    if mask_kind == "float":
        consts.append(const("m", "fp16", np.where(causal, 0.0, -65504.0), [32, 32]))
        args["attn_mask"] = "m"
    if mask_kind == "bool":
        consts.append(const("m", "bool", causal, [32, 32]))
        args["attn_mask"] = "m"
    out = run_op("scaled_dot_product_attention", inputs, (1, 2, 32, 32), consts=consts, profile="permissive", **args)
    s = q.astype(np.float32) @ np.swapaxes(k.astype(np.float32), -1, -2) / math.sqrt(32)
    if mask_kind != "none":
        s = np.where(causal, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v.astype(np.float32)
    close(out, ref, rtol=3e-3, atol=3e-3)


def test_quantize_dequantize_round_trip() -> None:
    x = f16(*ACT)
    scale = np.float16(0.02)
    text = program({"x": ttype("fp16", ACT)}, [
        const("sc", "fp16", scale), const("zp", "int8", 3), const("dt", "string", "int8"),
        op("q", ttype("int8", ACT), "quantize", input="x", scale="sc", zero_point="zp", output_dtype="dt"),
        op("d", ttype("fp16", ACT), "dequantize", input="q", scale="sc", zero_point="zp"),
    ], ["d"])
    out = orion.compile(text, relaxed_ops=("quantize", "dequantize"))(x=x)["d"]  # disputed (ANE-35)
    q = np.clip(np.round(x.astype(np.float32) / np.float32(scale)) + 3, -128, 127)
    close(out, (q - 3) * np.float32(scale), rtol=1e-3, atol=1e-4)


def test_constexpr_affine_dequantize_per_channel() -> None:
    q = RNG.integers(-128, 128, size=(64, 32)).astype(np.int8)
    scale = (RNG.random(64) * 0.1 + 0.01).astype(np.float16)
    zp = RNG.integers(-5, 5, size=64).astype(np.int8)
    x = f16(64, 32)
    weights = {"@model_path/weights/q.bin": blobfile(q.tobytes())}
    text = program({"x": ttype("fp16", [64, 32])}, [
        blob_const("qd", "int8", [64, 32], "@model_path/weights/q.bin"),
        const("sc", "fp16", scale, [64]), const("zp", "int8", zp, [64]), const("ax", "int32", 0),
        op("w", ttype("fp16", [64, 32]), "constexpr_affine_dequantize", quantized_data="qd", scale="sc",
           zero_point="zp", axis="ax"),
        op("out", ttype("fp16", [64, 32]), "add", x="x", y="w"),
    ], ["out"])
    out = orion.compile(text, weights, relaxed_ops=("constexpr_affine_dequantize",))(x=x)["out"]  # ANE-35
    w = (q.astype(np.float32) - zp[:, None]) * scale.astype(np.float32)[:, None]
    close(out, x.astype(np.float32) + w.astype(np.float16).astype(np.float32), rtol=1e-3, atol=1e-3)
