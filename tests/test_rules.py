"""The hardware's rules, each broken on purpose: the emulator must refuse loudly and name the rule."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import orion
from orion import probes
from support.handmil import SEVERAL_SURFACES, blob_const, blobfile, const, op, program, ttype

ACT = (1, 64, 1, 32)
T = ttype("fp16", ACT)


def constraint_of(excinfo: pytest.ExceptionInfo) -> str:
    return excinfo.value.constraint


def tanh_program(inputs=("x",), shape=ACT, dtype="fp16") -> str:
    t = ttype(dtype, shape)
    body = [op(f"out_{n}", t, "tanh", x=n) for n in inputs]
    return program({n: t for n in inputs}, body, [f"out_{n}" for n in inputs])


BANNED = [
    ("concat", "ANE-01", [const("ax", "int32", 1), const("il", "bool", False)],
     dict(values=["x", "x"], axis="ax", interleave="il"), (1, 128, 1, 32)),
    ("gelu", "ANE-02", [], dict(x="x"), ACT),
    ("rsqrt", "ANE-03", [], dict(x="x"), ACT),
    ("sqrt", "ANE-03", [], dict(x="x"), ACT),
    ("reduce_mean", "ANE-07", [const("ax", "int32", [3], [1]), const("kd", "bool", True)],
     dict(x="x", axes="ax", keep_dims="kd"), (1, 64, 1, 1)),
    ("scaled_dot_product_attention", "ANE-23", [], dict(query="x", key="x", value="x"), ACT),
    ("slice_by_index", "ANE-29", [const("b", "int32", [0, 0, 0, 0], [4]), const("e", "int32", [1, 64, 1, 32], [4])],
     dict(x="x", begin="b", end="e"), ACT),
    ("real_div", "ANE-30", [], dict(x="x", y="x"), ACT),
    ("layer_norm", "ANE-31", [const("ax", "int32", [1], [1])], dict(x="x", axes="ax"), ACT),
]


@pytest.mark.parametrize("name,cid,consts,args,shape", BANNED, ids=[b[0] for b in BANNED])
def test_banned_ops_are_rejected_by_name_and_allowed_when_permissive(name, cid, consts, args, shape) -> None:
    text = program({"x": T}, consts + [op("out", ttype("fp16", shape), name, **args)], ["out"])
    with pytest.raises(orion.ConstraintError) as e:
        orion.compile(text)
    assert constraint_of(e) == cid
    assert f"line {4 + len(consts)}: op 'out' ({name})" in str(e.value)
    orion.compile(text, profile="permissive")


CONV = dict(dilations="dl", groups="gr", pad="pd", pad_type="pt", strides="st", weight="W", x="x")
CONV_CONSTS = [const("dl", "int32", [1, 1], [2]), const("gr", "int32", 1), const("pd", "int32", [0, 0, 0, 0], [4]),
               const("pt", "string", "valid"), const("st", "int32", [1, 1], [2])]


def conv_program(cin=64, cout=64, **changes) -> tuple[str, dict]:
    w = np.full((cout, cin, 1, 1), 0.01, np.float16)
    args = {**CONV, **changes}
    args = {k: v for k, v in args.items() if v is not None}
    consts = CONV_CONSTS + [blob_const("W", "fp16", w.shape, "@model_path/weights/w.bin"),
                            const("bias", "fp16", np.zeros(cout), [cout])]
    text = program({"x": ttype("fp16", [1, cin, 1, 32])}, consts + [op("out", ttype("fp16", [1, cout, 1, 32]), "conv", **args)],
                   ["out"])
    return text, {"@model_path/weights/w.bin": blobfile(w.tobytes())}


def test_conv_bias_is_rejected() -> None:
    text, weights = conv_program(bias="bias")
    with pytest.raises(orion.ConstraintError) as e:
        orion.compile(text, weights)
    assert constraint_of(e) == "ANE-04" and "add" in str(e.value)


def test_conv_needs_all_seven_arguments_and_a_const_weight() -> None:
    text, weights = conv_program(dilations=None)
    with pytest.raises(orion.ConstraintError) as e:
        orion.compile(text, weights)
    assert constraint_of(e) == "ANE-32" and "dilations" in str(e.value)
    text = program({"x": T, "w": ttype("fp16", [64, 64, 1, 1])},
                   CONV_CONSTS + [op("out", T, "conv", **{**CONV, "weight": "w"})], ["out"])
    with pytest.raises(orion.ConstraintError) as e:
        orion.compile(text)
    assert constraint_of(e) == "ANE-32" and "matmul" in str(e.value)


def test_conv_with_32000_input_channels_is_rejected() -> None:
    text, weights = conv_program(cin=32000, cout=1)
    with pytest.raises(orion.ConstraintError) as e:
        orion.compile(text, weights)
    assert constraint_of(e) == "ANE-10"


def test_inline_literal_arguments_are_rejected() -> None:
    text = program({"x": T}, [f'{T} out = mul(x=x, y=fp16(2.0))[name=string("out")];'], ["out"])
    with pytest.raises(orion.ConstraintError) as e:
        orion.compile(text)
    assert constraint_of(e) == "ANE-05" and "'y'" in str(e.value)
    x = np.ones(ACT, np.float16)
    np.testing.assert_array_equal(orion.compile(text, profile="permissive")(x=x)["out"], 2 * x)


def test_softmax_over_a_non_power_of_two_extent_is_rejected() -> None:
    t = ttype("fp16", [1, 48, 1, 32])
    text = program({"x": t}, [const("ax", "int32", 1), op("out", t, "softmax", x="x", axis="ax")], ["out"])
    with pytest.raises(orion.ConstraintError) as e:
        orion.compile(text)
    assert constraint_of(e) == "ANE-08" and "48" in str(e.value)


@pytest.mark.parametrize("returned,hint", [("nowhere", "not computed"), ("c", "const"), ("x", "input")])
def test_dead_return_names_are_rejected(returned, hint) -> None:
    text = program({"x": T}, [const("c", "fp16", 1.0), op("out", T, "tanh", x="x")], ["out", returned])
    with pytest.raises(orion.ConstraintError) as e:
        orion.compile(text, profile="permissive")
    assert constraint_of(e) == "ANE-06" and hint in str(e.value)


@pytest.mark.parametrize("offset", [0, 128, 4096])
def test_blobfile_offset_must_point_at_a_chunk_header(offset) -> None:
    w = np.zeros((64, 64, 1, 1), np.float16)
    text = program({"x": T}, CONV_CONSTS + [blob_const("W", "fp16", w.shape, "@model_path/weights/w.bin", offset),
                                            op("out", T, "conv", **CONV)], ["out"])
    with pytest.raises(orion.ConstraintError) as e:
        orion.compile(text, {"@model_path/weights/w.bin": blobfile(w.tobytes())})
    assert constraint_of(e) == "ANE-22" and "w.bin" in str(e.value)


def test_fp16_io_needs_32_lanes() -> None:
    with pytest.raises(orion.ConstraintError) as e:
        orion.compile(tanh_program(shape=(1, 768, 1, 16)))
    assert constraint_of(e) == "ANE-14"
    orion.compile(tanh_program(shape=(1, 768, 1, 16), dtype="fp32"))  # fp32 I/O with 16 lanes is the proven form


def two_input_program():
    return orion.compile(tanh_program(inputs=("a", "b")), **SEVERAL_SURFACES)


def test_surfaces_under_the_minimum_size_fail() -> None:
    p = two_input_program()
    ins = {n: orion.Surface(ACT, nbytes=ACT[1] * ACT[3] * 2) for n in ("a", "b")}  # 4096 bytes each
    outs = {n: orion.Surface(ACT) for n in ("out_a", "out_b")}
    with pytest.raises(orion.ConstraintError) as e:
        p.evaluate(ins, outs)
    assert constraint_of(e) == "ANE-12" and "49152" in str(e.value)


def test_non_uniform_surface_sizes_fail() -> None:
    p = two_input_program()
    ins = {"a": orion.Surface(ACT), "b": orion.Surface(ACT, nbytes=65536)}
    outs = {n: orion.Surface(ACT) for n in ("out_a", "out_b")}
    with pytest.raises(orion.ConstraintError) as e:
        p.evaluate(ins, outs)
    assert constraint_of(e) == "ANE-13"
    ins["b"] = orion.Surface(ACT)
    outs["out_b"] = orion.Surface(ACT, nbytes=65536)
    with pytest.raises(orion.ConstraintError) as e:
        p.evaluate(ins, outs)
    assert constraint_of(e) == "ANE-13" and "output" in str(e.value)


def test_one_surface_bound_twice_fails() -> None:
    p = two_input_program()
    shared = orion.Surface(ACT)
    with pytest.raises(orion.ConstraintError) as e:
        p.evaluate({"a": shared, "b": shared}, {n: orion.Surface(ACT) for n in ("out_a", "out_b")})
    assert constraint_of(e) == "ANE-15"


def test_binding_is_alphabetical_and_the_python_layer_sorts() -> None:
    # Declared (zeta, alpha), returned (second, first): binding order is by name, not declaration.
    text = program({"zeta": T, "alpha": T}, [op("second", T, "tanh", x="zeta"), op("first", T, "relu", x="alpha")],
                   ["second", "first"])
    p = orion.compile(text, **SEVERAL_SURFACES)
    assert list(p.inputs) == ["alpha", "zeta"] and list(p.outputs) == ["first", "second"]
    z, a = np.full(ACT, 0.5, np.float16), np.full(ACT, -1.0, np.float16)
    ins, outs = p.allocate_surfaces()
    ins["zeta"].write(z)
    ins["alpha"].write(a)
    p.evaluate(dict(reversed(list(ins.items()))), outs)  # caller order does not matter
    np.testing.assert_array_equal(outs["second"].read(), np.tanh(z))
    np.testing.assert_array_equal(outs["first"].read(), np.zeros(ACT, np.float16))
    # Below the Python layer, binding out of alphabetical order is refused, never silently wrong.
    with pytest.raises(orion.ConstraintError) as e:
        p._native.evaluate([("zeta", ins["zeta"].native), ("alpha", ins["alpha"].native)],
                           [(n, outs[n].native) for n in ("first", "second")])
    assert constraint_of(e) == "ANE-20"


def test_weights_are_baked_at_compile() -> None:
    w = np.full((64, 64, 1, 1), 0.01, np.float16)
    file = bytearray(blobfile(w.tobytes()))
    text, _ = conv_program()
    p = orion.compile(text, {"@model_path/weights/w.bin": file})
    x = np.ones(ACT, np.float16)
    before = p(x=x)["out"]
    file[128:] = np.full((64, 64, 1, 1), 0.5, np.float16).tobytes()  # change the weights in place
    np.testing.assert_array_equal(p(x=x)["out"], before)
    recompiled = orion.compile(text, {"@model_path/weights/w.bin": file})
    assert not np.array_equal(recompiled(x=x)["out"], before)


@pytest.mark.parametrize("key", ["/abs/w.bin", "@model_path/../w.bin", "weights/w.bin", "@model_path/weights/"])
def test_weight_paths_must_be_relative_model_paths(key) -> None:
    with pytest.raises(orion.ConstraintError) as e:
        orion.compile(tanh_program(), {key: b""})
    assert constraint_of(e) == "ANE-34"


def test_missing_weight_file_names_the_path() -> None:
    text, _ = conv_program()
    with pytest.raises(orion.CompileError, match=r"@model_path/weights/w\.bin.*weights="):
        orion.compile(text, {})


def test_compile_budget_is_enforced_per_process() -> None:
    script = textwrap.dedent(f"""
        import orion
        texts = [{tanh_program(("x",))!r}, {tanh_program(("y",))!r}, {tanh_program(("z",))!r}, {tanh_program(("w",))!r}]
        for text in texts[:3]:  # distinct programs: on the ane backend a live identical one is reused, not compiled
            orion.compile(text)
        assert orion.compile_count() == 3 and orion.compile_budget() == 3
        try:
            orion.compile(texts[3])
        except orion.CompileBudgetExhausted as e:
            print("EXHAUSTED", e)
    """)
    env = {**os.environ, "ORION_COMPILE_BUDGET": "3"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "EXHAUSTED ANE-11" in result.stdout and "restart" in result.stdout


def test_default_compile_budget_is_119() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ORION_COMPILE_BUDGET"}
    out = subprocess.run([sys.executable, "-c", "import orion; print(orion.compile_budget())"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "119", out.stderr


QUANTIZED = [
    ("quantize", [const("sc", "fp16", 0.5), const("dt", "string", "int8")],
     {"input": "x", "scale": "sc", "output_dtype": "dt"}, "int8", {}),
    ("dequantize", [const("sc", "fp16", 0.5)], {"input": "x", "scale": "sc"}, "fp16", {}),
    ("constexpr_affine_dequantize",
     [blob_const("qd", "int8", ACT, "@model_path/weights/q.bin"), const("sc", "fp16", 0.5), const("zp", "int8", 0),
      const("ax", "int32", 0)],
     {"quantized_data": "qd", "scale": "sc", "zero_point": "zp", "axis": "ax"}, "fp16",
     {"@model_path/weights/q.bin": blobfile(np.arange(np.prod(ACT), dtype=np.int64).astype(np.int8).tobytes())}),
]


@pytest.mark.parametrize("name,consts,args,out_dtype,weights", QUANTIZED, ids=[q[0] for q in QUANTIZED])
def test_ane35_quantized_ops_are_refused_unless_a_probe_relaxed_them(name, consts, args, out_dtype, weights) -> None:
    in_dtype = "int8" if name == "dequantize" else "fp16"
    text = program({"x": ttype(in_dtype, ACT)}, consts + [op("out", ttype(out_dtype, ACT), name, **args)], ["out"])
    with pytest.raises(orion.ConstraintError) as e:
        orion.compile(text, weights)
    assert constraint_of(e) == "ANE-35"
    assert f"line {4 + len(consts)}: op 'out' ({name})" in str(e.value) and "relax" in str(e.value)
    # a report from the emulator relaxes nothing, so the op stays refused
    emulator_report = {"schema": probes.SCHEMA, "backend": "emulator", "probes": {}}
    with pytest.raises(orion.ConstraintError):
        orion.compile(text, weights, relaxed_ops=probes.relaxations(emulator_report).ops)
    # an op proved on this machine compiles under the hardware profile; only that op is relaxed
    orion.compile(text, weights, relaxed_ops=(name,))
    other = next(q[0] for q in QUANTIZED if q[0] != name)
    with pytest.raises(orion.ConstraintError):
        orion.compile(text, weights, relaxed_ops=(other,))


@pytest.mark.parametrize("relaxed", [("concat",), ("no_such_op",)])
def test_only_disputed_ops_can_be_relaxed(relaxed) -> None:
    with pytest.raises(orion.CompileError, match=f"'{relaxed[0]}', which is not a disputed op.*quantize"):
        orion.compile(tanh_program(), relaxed_ops=relaxed)
    with pytest.raises(orion.CompileError, match="not the string"):
        orion.compile(tanh_program(), relaxed_ops="quantize")


def test_the_op_table_lists_every_ban_and_dispute_these_tests_break() -> None:
    table = {row["name"]: row for row in orion._core.op_table()}
    assert all(set(row) == {"name", "required", "optional", "status", "constraint", "type_rule"} for row in table.values())
    banned = {n: r["constraint"] for n, r in table.items() if r["status"] == "banned"}
    assert banned == {name: cid for name, cid, *_ in BANNED}
    disputed = {n: r["constraint"] for n, r in table.items() if r["status"] == "disputed"}
    assert disputed == {**{name: "ANE-35" for name, *_ in QUANTIZED},  # 4-/6-bit weights: tests/test_low_bit.py
                        "constexpr_lut_to_dense": "ANE-38", "constexpr_blockwise_shift_scale": "ANE-38"}
    assert all(r["constraint"] == "" for r in table.values() if r["status"] == "allowed")


def test_conv_arguments_are_the_op_tables_under_every_profile() -> None:
    """validate and the emulator read one row: under permissive, conv still needs its seven arguments."""
    assert orion._core.op_table()[[r["name"] for r in orion._core.op_table()].index("conv")]["required"] == [
        "dilations", "groups", "pad", "pad_type", "strides", "weight", "x"]
    text, weights = conv_program(pad=None)
    with pytest.raises(orion.ConstraintError) as e:
        orion.compile(text, weights)
    assert constraint_of(e) == "ANE-32"
    with pytest.raises(orion.CompileError, match=r"op 'out' \(conv\): missing required argument 'pad'"):
        orion.compile(text, weights, profile="permissive")
