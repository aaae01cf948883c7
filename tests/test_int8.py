"""W8A16 int8 weights end to end: the quantizer, MIL emission and BLOBFILEs, the ANE-35 rule, the
emulator's conv on constexpr_affine_dequantize weights, and GPT-2 / Llama with quant="int8".

References: numpy float64 (the quantizer's properties, dequantized weights) and the independent numpy
fp32 models of tests/support run on the dequantized weights. Tolerances: a conv program agrees bit for
bit with the same program holding the fp16 weight fp16((q - zp) * scale) (the ANE's values); models
agree with the reference on their quantized weights to the fp16 tolerance of their fp16 suites (3% of
max |logit| for GPT-2, 2% for Llama), and with their own fp16 model to 5% (quantization error,
measured ~1-2% here).
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import orion
from orion import blobfile, compiler, probes, quant
from orion._core import kernels
from orion.graph import Graph
from orion.models import GPT2, GPT2Config, Llama, LlamaConfig
from orion.models.llama.graphs import group_rows
from support.collection import no_collection
from support.gpt2_fixtures import lively_weights
from support.handmil import blob_const, const, op, program, ttype
from support.llama_fixtures import lively
from support.llama_reference import reference_logits as llama_reference

RNG = np.random.default_rng(8)


def dequantized(w: np.ndarray) -> np.ndarray:
    return quant.quantize_int8(w).dequantized().astype(np.float32)


# -- the quantizer -------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale_of_rows", [1e-6, 0.02, 1.0, 300.0])
def test_quantize_int8_rows_are_fp16_exact_and_within_half_a_step(scale_of_rows) -> None:
    w = RNG.standard_normal((37, 53)) * scale_of_rows * np.exp(RNG.uniform(-2, 2, (37, 1)))
    w[3] = 0.0
    qw = quant.quantize_int8(w)
    assert qw.q.dtype == np.int8 and qw.scale.dtype == np.float32 and qw.q.shape == w.shape
    assert np.all(np.abs(qw.q.astype(np.int64)) <= 127)
    s = qw.scale.astype(np.float64)
    mantissa = s / np.exp2(np.floor(np.log2(s)) - 3)  # 4 significant bits: an integer in [8, 16)
    assert np.array_equal(mantissa, np.round(mantissa)) and np.all((mantissa >= 8) & (mantissa < 16))
    deq = qw.q.astype(np.float64) * s[:, None]
    np.testing.assert_array_equal(qw.dequantized(), deq)
    assert np.array_equal(deq.astype(np.float16).astype(np.float64), deq), "not fp16 values"
    assert kernels.int8_weights_fp16_exact(qw.q, qw.scale)
    assert np.all(np.abs(deq - w) <= s[:, None] / 2 * (1 + 1e-12))
    live = np.abs(w).max(1) > 0
    assert np.all(s[live] <= np.maximum(np.abs(w[live]).max(1) / 127 * 1.125, quant.MIN_SCALE))  # <= 1/8 coarser
    assert np.all(qw.q[3] == 0)


def test_quantize_int8_near_fp16_max_does_not_overflow() -> None:
    w = np.array([[65504.0, -65000.0, 1.0], [0.5, 0.25, -0.125]])
    deq = quant.quantize_int8(w).dequantized()
    assert np.all(np.abs(deq) <= 65504) and np.all(np.isfinite(deq.astype(np.float16)))
    assert np.abs(deq[0, 0] - 65504) <= 65504 / 127


def test_quantize_int8_refuses_what_it_cannot_store() -> None:
    with pytest.raises(orion.ConstraintError, match="ANE-25"):
        quant.quantize_int8(np.array([[np.inf, 1.0]]))
    with pytest.raises(quant.QuantError, match="Cout, Cin"):
        quant.quantize_int8(np.ones(4))
    with pytest.raises(quant.QuantError, match="'fp16', 'int8'"):
        quant.check_mode("int3")


# -- emission, BLOBFILE and the ANE-35 rule -----------------------------------------------------------
def int8_linear_graph(w: np.ndarray, s: int = 32, mode: str = "int8") -> Graph:
    g = Graph("lin")
    x = g.input("x", [1, w.shape[1], 1, s])
    g.output(g.linear(x, quant.weight_operand(g, w, mode, "lin"), name="lin"), "y")
    return g


def test_emitted_program_holds_int8_data_and_fp16_scales_in_blobfiles() -> None:
    w = RNG.standard_normal((48, 64)) * 0.1
    lowered = compiler.lower_graph(int8_linear_graph(w))
    qw = quant.quantize_int8(w)
    # the attribute form coremltools serializes (ANE-35), the int8 data typed as such in the file (code 4)
    assert ('constexpr_affine_dequantize()[axis=int32(0), name=string("lin_weight"), quantized_data=tensor<int8, '
            '[48, 64, 1, 1]>(BLOBFILE(path=string("@model_path/weights/lin_weight_quantized_data.bin"), '
            'offset=uint64(64))), scale=tensor<fp16, [48]>(BLOBFILE(path=string("@model_path/weights/'
            'lin_weight_scale.bin"), offset=uint64(64))), zero_point=int8(0)];') in lowered.mil
    data = lowered.weights["@model_path/weights/lin_weight_quantized_data.bin"]
    assert data[68] == 4 and lowered.weights["@model_path/weights/lin_weight_scale.bin"][68] == 1
    assert len(data) == 64 + 64 + 48 * 64  # file header, chunk header, one byte per weight
    np.testing.assert_array_equal(blobfile.read(data, dtype=np.int8, shape=(48, 64, 1, 1))[:, :, 0, 0], qw.q)
    scales = blobfile.read(lowered.weights["@model_path/weights/lin_weight_scale.bin"], shape=(48,))
    np.testing.assert_array_equal(scales.astype(np.float32), qw.scale)
    with pytest.raises(blobfile.BlobfileError):
        blobfile.read(data, dtype=np.float16, shape=(48, 64, 1, 1))  # 1 byte per weight, not 2


def test_ane35_int8_weights_are_refused_under_the_hardware_profile_unless_relaxed() -> None:
    lowered = compiler.lower_graph(int8_linear_graph(RNG.standard_normal((32, 64))))
    with pytest.raises(orion.ConstraintError) as refused:
        compiler.compile_lowered(lowered)
    assert refused.value.constraint == "ANE-35" and "constexpr_affine_dequantize" in str(refused.value)
    assert "doctor --probe" in str(refused.value) and 'profile="permissive"' in str(refused.value)  # how to enable
    emulator_report = {"schema": probes.SCHEMA, "backend": "emulator", "probes": {}}
    with pytest.raises(orion.ConstraintError, match="ANE-35"):
        compiler.compile_lowered(lowered, relaxed_ops=probes.relaxations(emulator_report).ops)
    with pytest.raises(orion.ConstraintError, match="ANE-35"):  # the quantize probe does not cover weights
        compiler.compile_lowered(lowered, relaxed_ops=probes.QUANTIZED_OPS)
    ane_report = {"schema": probes.SCHEMA, "backend": "ane", **probes.machine(),
                  "probes": {"quantized_weights": {"outcome": "works"}}}
    relaxed = probes.relaxations(ane_report)
    assert relaxed.ops == probes.QUANTIZED_WEIGHT_OPS
    compiler.compile_lowered(lowered, relaxed_ops=relaxed.ops)
    compiler.compile_lowered(lowered, profile="permissive")


def test_models_say_how_to_enable_int8(tmp_path) -> None:
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32)
    with pytest.raises(orion.ConstraintError) as refused:
        GPT2.random(config, quant="int8", progress=False)
    message = str(refused.value)
    assert refused.value.constraint == "ANE-35"
    assert "probe_report" in message and "profile='permissive'" in message and "doctor --probe" in message
    assert quant.compile_options("int8", "permissive") == {"profile": "permissive", "relaxed_ops": ()}
    assert quant.compile_options("fp16") == {"profile": "hardware", "relaxed_ops": ()}
    notes: list[str] = []
    assert quant.model_options("int8", None, notes.append) == {"quant": "int8", "profile": "permissive"}
    assert len(notes) == 1 and "disputed" in notes[0] and "ANE-35" in notes[0]
    assert quant.model_options("int8", "r.json", notes.append) == {"quant": "int8", "probe_report": "r.json"}
    assert quant.model_options("fp16", None, notes.append) == {} and len(notes) == 1


def test_the_quantized_weights_probe() -> None:
    outcome, detail = probes._quantized_weights(orion.backend())
    assert outcome == ("refused" if orion.backend() == "emulator" else outcome), detail
    if orion.backend() == "emulator":
        assert "ANE-35" in detail
        assert probes._quantized_weights("ane")[0] == "works"  # as the hardware path runs it (permissive)


# -- the emulator's conv on quantized weights ---------------------------------------------------------
def run(lowered, x: np.ndarray, **options) -> np.ndarray:
    return compiler.compile_lowered(lowered, profile="permissive", **options)(x=x)["y"]


@pytest.mark.parametrize("cout,cin,s", [(48, 64, 1), (100, 96, 32), (40, 200, 512)])
def test_int8_conv_equals_the_fp16_program_of_its_dequantized_weight_bit_for_bit(cout, cin, s) -> None:
    w = RNG.standard_normal((cout, cin)) * 0.05
    x = RNG.standard_normal((1, cin, 1, s)).astype(np.float16)
    with no_collection():
        before = kernels.shared_conv_weights()
        int8 = compiler.compile_lowered(compiler.lower_graph(int8_linear_graph(w, s)), profile="permissive")
        count, nbytes = kernels.shared_conv_weights()
    panels = -(-cout // 16) * 16
    assert (count - before[0], nbytes - before[1]) == (1, panels * cin + panels * 4), "int8 weights stay int8"
    got = int8(x=x)["y"]
    fp16 = run(compiler.lower_graph(int8_linear_graph(dequantized(w), s, "fp16")), x)
    np.testing.assert_array_equal(got, fp16)
    ref = quant.quantize_int8(w).dequantized() @ x[0, :, 0, :].astype(np.float64)  # float64
    np.testing.assert_allclose(got[0, :, 0, :].astype(np.float64), ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())


COMPILE_PEAK = textwrap.dedent("""
    import sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from test_int8 import int8_linear_graph
    from orion import compiler

    def status(key):
        return int(open("/proc/self/status").read().split(key + ":")[1].split()[0]) << 10

    lowered = compiler.lower_graph(int8_linear_graph(np.random.default_rng(0).standard_normal((1024, 1024)) * 0.05))
    open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
    before = status("VmRSS")
    compiler.compile_lowered(lowered, profile="permissive")
    print(status("VmHWM") - before)
""")


def test_compiling_int8_weights_never_dequantizes_them() -> None:
    """The int8 conv reads its weight quantized: compiling it holds the 1 MiB of int8 and its 1 MiB packed
    copy, never the dequantized values (4 MiB of fp32, 8 of float64 in a folded constant)."""
    out = subprocess.run([sys.executable, "-c", COMPILE_PEAK, str(Path(__file__).parent)], capture_output=True,
                         text=True, timeout=120, check=True)
    assert int(out.stdout.split()[-1]) < 6 << 20, out.stdout


def handwritten_conv(weight_lines: list[str], cin: int, cout: int, s: int) -> str:
    return program({"x": ttype("fp16", [1, cin, 1, s])}, weight_lines + [
        const("dl", "int32", [1, 1], [2]), const("gr", "int32", 1), const("pd", "int32", [0, 0, 0, 0], [4]),
        const("pt", "string", "valid"), const("st", "int32", [1, 1], [2]),
        op("y", ttype("fp16", [1, cout, 1, s]), "conv", dilations="dl", groups="gr", pad="pd", pad_type="pt",
           strides="st", weight="W", x="x")], ["y"])


@pytest.mark.parametrize("kind", ["fp16 scale, zero point", "uint8, per-channel zero points", "axis 1"])
def test_any_affine_weight_runs_as_its_fp16_dequantization(kind) -> None:
    cout, cin, s = 24, 40, 32
    shape = [cout, cin, 1, 1]
    qdtype, npq = ("uint8", np.uint8) if kind.startswith("uint8") else ("int8", np.int8)
    q = RNG.integers(0 if npq is np.uint8 else -128, 128, size=shape).astype(npq)
    axis = 1 if kind == "axis 1" else 0
    scale = (RNG.uniform(0.01, 0.1, shape[axis])).astype(np.float16)  # 11-bit scales: products need rounding
    zero = RNG.integers(0, 5, shape[axis]).astype(npq) if "zero points" in kind else np.array(3, npq)
    extent = [1] * 4
    extent[axis] = shape[axis]
    w16 = ((q.astype(np.float64) - zero.astype(np.float64).reshape(extent if zero.ndim else ()))
           * scale.astype(np.float64).reshape(extent)).astype(np.float16)  # fp16((q - zp) * s), one rounding
    paths = {n: f"@model_path/weights/{n}.bin" for n in ("q", "sc", "zp", "w")}
    zp_line = blob_const("zp", qdtype, [shape[axis]], paths["zp"]) if zero.ndim else const("zp", qdtype, int(zero))
    quantized = handwritten_conv([blob_const("q", qdtype, shape, paths["q"]),
                                  blob_const("sc", "fp16", [shape[axis]], paths["sc"]), zp_line,
                                  const("ax", "int32", axis),
                                  op("W", ttype("fp16", shape), "constexpr_affine_dequantize", axis="ax",
                                     quantized_data="q", scale="sc", zero_point="zp")], cin, cout, s)
    plain = handwritten_conv([blob_const("W", "fp16", shape, paths["w"])], cin, cout, s)
    x = RNG.standard_normal((1, cin, 1, s)).astype(np.float16)
    weights = {paths["q"]: blobfile.write(q), paths["sc"]: blobfile.write(scale), paths["zp"]: blobfile.write(zero)}
    got = orion.compile(quantized, weights, profile="permissive")(x=x)["y"]
    want = orion.compile(plain, {paths["w"]: blobfile.write(w16)})(x=x)["y"]
    np.testing.assert_array_equal(got, want)


def test_a_dequantized_weight_read_as_data_is_still_computed() -> None:
    cout, cin = 16, 32
    q = RNG.integers(-127, 128, size=(cout, cin, 1, 1)).astype(np.int8)
    path = "@model_path/weights/q.bin"
    text = program({"x": ttype("fp16", [1, cin, 1, 32])}, [
        blob_const("q", "int8", [cout, cin, 1, 1], path), const("sc", "fp16", 0.125), const("zp", "int8", 0),
        const("ax", "int32", 0),
        op("W", ttype("fp16", [cout, cin, 1, 1]), "constexpr_affine_dequantize", axis="ax", quantized_data="q",
           scale="sc", zero_point="zp"),
        const("sh", "int32", [1, 1, cout, cin], [4]),
        op("y", ttype("fp16", [1, 1, cout, cin]), "reshape", shape="sh", x="W")], ["y"])
    y = orion.compile(text, {path: blobfile.write(q)}, profile="permissive")(x=np.zeros((1, cin, 1, 32), np.float16))
    np.testing.assert_array_equal(y["y"].reshape(cout, cin), q[:, :, 0, 0].astype(np.float32) * 0.125)


# -- models ----------------------------------------------------------------------------------------------
def gpt2_int8_weights(weights):
    """The weights an int8 GPT-2 computes with: each projection dequantized (the embedding stays)."""
    w = copy.deepcopy(weights)
    for b in w.blocks:
        for name in ("w_qkv", "w_attn_out", "w_fc", "w_proj"):
            setattr(b, name, dequantized(getattr(b, name)))
    return w, dequantized(weights.wte)


def test_gpt2_int8_matches_the_reference_on_its_quantized_weights() -> None:
    config = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=128)
    weights = lively_weights(config, seed=3)
    model = GPT2(config, weights, quant="int8", profile="permissive", progress=False)
    fp16 = GPT2(config, weights, progress=False)
    assert model.builder.identity["quant"] == "int8" and "quant" not in fp16.builder.identity
    bytes_of = lambda m: sum(p.bytes_per_token for p in m.decode_plan.programs)  # noqa: E731
    matrices = config.n_layer * 12 * config.n_embd**2 + config.vocab_size * config.n_embd  # one byte less each
    assert bytes_of(fp16) - bytes_of(model) == matrices
    qweights, head = gpt2_int8_weights(weights)
    ids = [int(i) for i in RNG.integers(0, config.vocab_size, 9)]
    want = _gpt2_logits_with_head(config, qweights, head, ids)
    tolerance = 0.03 * float(np.abs(want).max())
    got = model.logits(ids)
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance)
    full = fp16.logits(ids)
    assert np.abs(got - full).max() <= 0.05 * np.abs(full).max()
    np.testing.assert_allclose(model.prefill(ids[:5]), want[4], rtol=0, atol=tolerance)  # the decode programs
    np.testing.assert_allclose(model.decode_step(ids[5]), want[5], rtol=0, atol=tolerance)


def _gpt2_logits_with_head(config, weights, head: np.ndarray, ids: list[int]) -> np.ndarray:
    """The independent reference's forward pass (tests/support/gpt2_reference.py) with the LM head
    ``head`` instead of the tied embedding (an int8 model quantizes its head, not its embedding)."""
    import support.gpt2_reference as ref

    ln = ref._layer_norm
    ids_a = np.asarray(ids)
    x = (weights.wte[ids_a] + weights.wpe[: len(ids)]).astype(np.float32)
    eps = config.layer_norm_epsilon
    for b in weights.blocks:
        h = ref._attention(ln(x, b.ln1_g, b.ln1_b, eps), b.w_qkv, b.b_qkv, config.n_head)
        x = x + h @ b.w_attn_out.T + b.b_attn_out
        h = ref._gelu_new(ln(x, b.ln2_g, b.ln2_b, eps) @ b.w_fc.T + b.b_fc)
        x = x + h @ b.w_proj.T + b.b_proj
    return (ln(x, weights.ln_f_g, weights.ln_f_b, eps) @ head.T).astype(np.float32)


def llama_int8_weights(config, weights):
    """The weights an int8 Llama computes with: fused rows quantize row by row; the output projection
    per query group's column slice; the LM head untied (the embedding stays)."""
    w = copy.deepcopy(weights)
    for layer in w.layers:
        for name in ("wq", "wk", "wv", "w_gate", "w_up", "w_down"):
            setattr(layer, name, dequantized(getattr(layer, name)))
        wo = layer.wo.copy()
        for j in range(config.group_size):
            cols = group_rows(config, j)
            wo[:, cols] = dequantized(layer.wo[:, cols])
        layer.wo = wo
    w.lm_head = dequantized(weights.classifier)
    return w


@pytest.mark.parametrize("tied", [True, False])
def test_llama_int8_matches_the_reference_on_its_quantized_weights(tied) -> None:
    config = LlamaConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=160,
                         max_position_embeddings=32, rope_convention="interleaved" if tied else "half",
                         tie_embeddings=tied)
    weights = lively(config, seed=5)
    model = Llama(config, weights, quant="int8", profile="permissive", progress=False)
    ids = [int(i) for i in RNG.integers(0, config.vocab_size, 11)]
    want = llama_reference(config, llama_int8_weights(config, weights), ids)
    got = model.logits(ids)
    np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * float(np.abs(want).max()))
    full = Llama(config, weights, progress=False).logits(ids)
    assert np.abs(got - full).max() <= 0.05 * np.abs(full).max()
    np.testing.assert_allclose(model.prefill(ids[:6]), want[5], rtol=0, atol=0.02 * float(np.abs(want).max()))
    np.testing.assert_allclose(model.decode_step(ids[6]), want[6], rtol=0, atol=0.02 * float(np.abs(want).max()))


def test_served_model_takes_the_int8_options(tmp_path) -> None:
    from orion.serve.model_engine import ModelEngine
    from support.text_fixtures import write_model_dir

    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=512, n_positions=32)  # the byte-level BPE's
    directory = write_model_dir(tmp_path, config)
    engine = ModelEngine.from_directory(directory, progress=False,
                                        model_options=quant.model_options("int8", None, lambda text: None))
    assert engine.model.quant == "int8" and engine.model.builder.compile_options["profile"] == "permissive"
