"""A hand-written MIL program in the dialect of docs/hardware.md §4 (not produced by our emitter) runs and matches numpy.

It is a GPT-2 style MLP block with fp32 I/O: layer norm decomposed into reduce_sum / pow, two 1x1
convs whose weights share one multi-chunk BLOBFILE, a tanh GELU, a residual add, and two outputs.
"""

from __future__ import annotations

import numpy as np

import orion

C, H, S = 64, 256, 32
W_UP_BYTES, W_DOWN_BYTES = H * C * 2, C * H * 2
DOWN_OFFSET = 64 + 64 + W_UP_BYTES  # second chunk header: file header, first chunk header, payload

MIL = f"""program(1.3)
[buildInfo = dict<string, string>({{{{"coremlc-component-MIL", "3510.2.1"}}, {{"coremlc-version", "3505.4.1"}}, {{"coremltools-component-milinternal", ""}}, {{"coremltools-version", "9.0"}}}})]
{{
    func main<ios18>(tensor<fp32, [1,{C},1,{S}]> x) {{
        string to16 = const()[name = string("to16"), val = string("fp16")];
        string to32 = const()[name = string("to32"), val = string("fp32")];
        tensor<fp16, [1,{C},1,{S}]> xh = cast(dtype = to16, x = x)[name = string("xh")];
        tensor<int32, [1]> ax = const()[name = string("ax"), val = tensor<int32, [1]>([1])];
        bool kd = const()[name = string("kd"), val = bool(true)];
        fp16 invc = const()[name = string("invc"), val = fp16(0x1p-6)];
        tensor<fp16, [1,1,1,{S}]> sum = reduce_sum(x = xh, axes = ax, keep_dims = kd)[name = string("sum")];
        tensor<fp16, [1,1,1,{S}]> mean = mul(x = sum, y = invc)[name = string("mean")];
        tensor<fp16, [1,{C},1,{S}]> xc = sub(x = xh, y = mean)[name = string("xc")];
        tensor<fp16, [1,{C},1,{S}]> sq = mul(x = xc, y = xc)[name = string("sq")];
        tensor<fp16, [1,1,1,{S}]> ssq = reduce_sum(x = sq, axes = ax, keep_dims = kd)[name = string("ssq")];
        tensor<fp16, [1,1,1,{S}]> var = mul(x = ssq, y = invc)[name = string("var")];
        fp16 eps = const()[name = string("eps"), val = fp16(0.00001)];
        tensor<fp16, [1,1,1,{S}]> vpe = add(x = var, y = eps)[name = string("vpe")];
        fp16 mhalf = const()[name = string("mhalf"), val = fp16(-0.5)];
        tensor<fp16, [1,1,1,{S}]> rstd = pow(x = vpe, y = mhalf)[name = string("rstd")];
        tensor<fp16, [1,{C},1,{S}]> ln = mul(x = xc, y = rstd)[name = string("ln")];
        string pt = const()[name = string("pt"), val = string("valid")];
        tensor<int32, [2]> st = const()[name = string("st"), val = tensor<int32, [2]>([1, 1])];
        tensor<int32, [4]> pd = const()[name = string("pd"), val = tensor<int32, [4]>([0, 0, 0, 0])];
        tensor<int32, [2]> dl = const()[name = string("dl"), val = tensor<int32, [2]>([1, 1])];
        int32 gr = const()[name = string("gr"), val = int32(1)];
        tensor<fp16, [{H},{C},1,1]> wup = const()[name = string("wup"), val = tensor<fp16, [{H},{C},1,1]>(BLOBFILE(path = string("@model_path/weights/mlp.bin"), offset = uint64(64)))];
        tensor<fp16, [{C},{H},1,1]> wdown = const()[name = string("wdown"), val = tensor<fp16, [{C},{H},1,1]>(BLOBFILE(path = string("@model_path/weights/mlp.bin"), offset = uint64({DOWN_OFFSET})))];
        tensor<fp16, [1,{H},1,{S}]> up = conv(dilations = dl, groups = gr, pad = pd, pad_type = pt, strides = st, weight = wup, x = ln)[name = string("up")];
        // gelu(u) = 0.5 * u * (1 + tanh(sqrt(2/pi) * (u + 0.044715 u^3)))
        fp16 c3 = const()[name = string("c3"), val = fp16(0.044715)];
        fp16 k = const()[name = string("k"), val = fp16(0.7978845608)];
        fp16 half = const()[name = string("half"), val = fp16(0.5)];
        fp16 one = const()[name = string("one"), val = fp16(1.0)];
        tensor<fp16, [1,{H},1,{S}]> u2 = mul(x = up, y = up)[name = string("u2")];
        tensor<fp16, [1,{H},1,{S}]> u3 = mul(x = u2, y = up)[name = string("u3")];
        tensor<fp16, [1,{H},1,{S}]> cu3 = mul(x = u3, y = c3)[name = string("cu3")];
        tensor<fp16, [1,{H},1,{S}]> inner = add(x = up, y = cu3)[name = string("inner")];
        tensor<fp16, [1,{H},1,{S}]> scaled = mul(x = inner, y = k)[name = string("scaled")];
        tensor<fp16, [1,{H},1,{S}]> th = tanh(x = scaled)[name = string("th")];
        tensor<fp16, [1,{H},1,{S}]> onep = add(x = th, y = one)[name = string("onep")];
        tensor<fp16, [1,{H},1,{S}]> hu = mul(x = up, y = half)[name = string("hu")];
        tensor<fp16, [1,{H},1,{S}]> act = mul(x = hu, y = onep)[name = string("act")];
        tensor<fp16, [1,{C},1,{S}]> down = conv(dilations = dl, groups = gr, pad = pd, pad_type = pt, strides = st, weight = wdown, x = act)[name = string("down")];
        tensor<fp16, [1,{C},1,{S}]> res = add(x = xh, y = down)[name = string("res")];
        tensor<fp32, [1,{C},1,{S}]> out_res = cast(dtype = to32, x = res)[name = string("out_res")];
        tensor<fp32, [1,{C},1,{S}]> out_ln = cast(dtype = to32, x = ln)[name = string("out_ln")];
    }} -> (out_res, out_ln);
}}
"""


def mlp_blobfile(w_up: np.ndarray, w_down: np.ndarray) -> bytes:
    """Two tensors in one BLOBFILE (docs/hardware.md §5), laid out by hand."""
    def chunk(payload: bytes, start: int) -> bytes:
        header = bytearray(64)
        header[0:4] = (0xDEADBEEF).to_bytes(4, "little")
        header[4] = 1
        header[8:12] = len(payload).to_bytes(4, "little")
        header[16:20] = (start + 64).to_bytes(4, "little")
        return bytes(header) + payload
    file_header = bytearray(64)
    file_header[0], file_header[4] = 1, 2
    first = chunk(w_up.tobytes(), 64)
    return bytes(file_header) + first + chunk(w_down.tobytes(), 64 + len(first))


def reference(x: np.ndarray, w_up: np.ndarray, w_down: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = x[0, :, 0, :].astype(np.float16).astype(np.float32)  # [C, S]
    mu = v.mean(axis=0)
    ln = (v - mu) / np.sqrt(((v - mu) ** 2).mean(axis=0) + 1e-5)
    u = w_up.reshape(H, C).astype(np.float32) @ ln
    g = 0.5 * u * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (u + 0.044715 * u ** 3)))
    out = v + w_down.reshape(C, H).astype(np.float32) @ g
    return out[None, :, None, :], ln[None, :, None, :]


def test_handwritten_mlp_block_matches_numpy() -> None:
    rng = np.random.default_rng(7)
    w_up = (rng.standard_normal((H, C, 1, 1)) / np.sqrt(C)).astype(np.float16)
    w_down = (rng.standard_normal((C, H, 1, 1)) / np.sqrt(H)).astype(np.float16)
    x = rng.standard_normal((1, C, 1, S)).astype(np.float32)
    program = orion.compile(MIL, {"@model_path/weights/mlp.bin": mlp_blobfile(w_up, w_down)})
    assert set(program.outputs) == {"out_ln", "out_res"} and program.inputs["x"].dtype == np.float32
    out = program(x=x)
    ref_res, ref_ln = reference(x, w_up, w_down)
    # fp16 activations through ~20 ops: agreement to 1e-2 of the values' scale.
    np.testing.assert_allclose(out["out_ln"], ref_ln, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(out["out_res"], ref_res, rtol=1e-2, atol=2e-2)
