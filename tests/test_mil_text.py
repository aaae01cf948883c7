"""MIL text: the golden emitter output for the example of docs/hardware.md §4, parser variations and parse errors."""

from __future__ import annotations

import pytest

import orion
from orion.mil import MilProgram, Type, Value, emit, parse

DIALECT_EXAMPLE = """\
program(1.3)
[buildInfo = dict<string, string>({{"coremlc-component-MIL", "3510.2.1"}, {"coremlc-version", "3505.4.1"}, {"coremltools-component-milinternal", ""}, {"coremltools-version", "9.0"}})]
{
    func main<ios18>(tensor<fp16, [1, 768, 1, 32]> x, tensor<fp16, [1, 768, 1, 32]> y) {
        tensor<int32, [4]> pd = const()[name=string("pd"), val=tensor<int32, [4]>([0,0,0,0])];
        fp16 eps = const()[name=string("eps"), val=fp16(0.00001)];
        tensor<fp16, [768, 768, 1, 1]> Wq = const()[name=string("Wq"), val=tensor<fp16, [768, 768, 1, 1]>(BLOBFILE(path=string("@model_path/weights/wq.bin"), offset=uint64(64)))];
        tensor<fp16, [1, 768, 1, 32]> out_a = add(x=x, y=y)[name=string("out_a")];
        tensor<fp16, [1, 768, 1, 32]> c = concat(axis=ax, interleave=il, values=(a, b))[name=string("c")];
    } -> (out_a, out_b);
}
"""

ACT = Type.tensor("fp16", [1, 768, 1, 32])


def dialect_example() -> MilProgram:
    p = MilProgram()
    p.add_input("x", ACT)
    p.add_input("y", ACT)
    p.add_const("pd", Value.list(Type.tensor("int32", [4]), [0, 0, 0, 0]))
    p.add_const("eps", Value.number("fp16", 0.00001))
    p.add_const("Wq", Value.blob(Type.tensor("fp16", [768, 768, 1, 1]), "@model_path/weights/wq.bin"))
    p.add_op("add", "out_a", ACT, [("x", "x"), ("y", "y")])
    p.add_op("concat", "c", ACT, [("axis", "ax"), ("interleave", "il"), ("values", ["a", "b"])])
    p.outputs = ["out_a", "out_b"]
    return p


def test_emits_the_facts_example_byte_for_byte() -> None:
    assert emit(dialect_example()) == DIALECT_EXAMPLE


def test_parses_the_facts_example() -> None:
    p = parse(DIALECT_EXAMPLE)
    assert p == dialect_example()
    assert [(op.line, op.column) for op in p.operations] == [(5, 9), (6, 9), (7, 9), (8, 9), (9, 9)]
    concat = p.operations[4]
    assert [(a.name, a.kind, a.refs) for a in concat.args] == [
        ("axis", "ref", ["ax"]), ("interleave", "ref", ["il"]), ("values", "tuple", ["a", "b"])]


def test_empty_function_and_scalar_spellings() -> None:
    p = MilProgram()
    p.add_const("t", Value.number("bool", True))
    p.add_const("pt", Value.string('va"l\\id\n'))
    p.add_const("one", Value.number("fp16", 1.0))
    p.add_const("big", Value.number("fp16", -65504.0))
    p.add_const("k", Value.number("int32", -3))
    p.add_op("matmul", "m", ACT, [("transpose_x", Value.number("bool", False)), ("y", Value.number("fp16", 2.0))])
    lines = emit(p).splitlines()
    assert lines[3] == "    func main<ios18>() {"
    assert lines[4:10] == [
        '        bool t = const()[name=string("t"), val=bool(true)];',
        '        string pt = const()[name=string("pt"), val=string("va\\"l\\\\id\\n")];',
        '        fp16 one = const()[name=string("one"), val=fp16(1.0)];',
        '        fp16 big = const()[name=string("big"), val=fp16(-65504.0)];',
        '        int32 k = const()[name=string("k"), val=int32(-3)];',
        '        tensor<fp16, [1, 768, 1, 32]> m = matmul(transpose_x=false, y=fp16(2.0))[name=string("m")];',
    ]
    assert lines[10] == "    } -> ();"
    assert emit(p).endswith("}\n")


@pytest.mark.parametrize("value, spelling", [
    (0.125, "0.125"), (1e-5, "0.00001"), (1 / 3, "0.3333333333333333"), (-0.0, "-0.0"), (65504.0, "65504.0"),
    (2.0 ** -24, "5.960464477539063e-08"), (1e20, "1e+20"),
])
def test_float_literal_spelling(value: float, spelling: str) -> None:
    p = MilProgram()
    p.add_const("v", Value.number("fp32", value))
    assert f"val=fp32({spelling})]" in emit(p)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_float_is_a_compile_error_naming_the_variable(value: float) -> None:
    p = MilProgram()
    p.add_const("bad_eps", Value.number("fp16", value))
    with pytest.raises(orion.CompileError, match="bad_eps"):
        emit(p)


VARIANT = """// weights for one projection
program(1.3) {
  func main<ios18>(tensor<fp16,[1,768,1,32]> x) {   // no buildInfo line: the default is used
    tensor<fp16,[768,768,1,1]>   W=const()[name=string("W"),
        val=tensor<fp16,[768,768,1,1]>(BLOBFILE(path=string("@model_path/weights/w.bin"),offset=uint64(64)))];
    fp16 a = const()[name = string("a"), val = fp16(1e-5)];
    fp16 b = const()[name=string("b"), val=fp16(-3)];
    fp16 c = const()[val=fp16(.5), name=string("c")];
    fp16 h = const()[name=string("h"), val=fp16(0x1p-3)];
    fp32 g = const()[name=string("g"), val=fp32(-0x1.8p+1)];
    tensor<fp16, []> r = const()[name=string("r"), val=tensor<fp16, []>([0.25])];
    tensor<fp16, []> s = const()[name=string("s"), val=tensor<fp16, []>(0.75)];
    tensor<int32, [2]> ax = const()[name=string("ax"), val=tensor<int32, [2]>([ 1 , -2 ])];
    tensor<fp16, [1, 768, 1, 32]> y = matmul(transpose_x = false, transpose_y=true, x=x, y=fp16(2.0))
        [name=string("y")];
    tensor<fp16, [1, 1536, 1, 32]> z = concat(axis=ax, values=(x,y))[name=string("z")];
  } -> (y, z);
  func second<ios17>() {
  } -> ();
}"""


def test_parses_real_world_variations() -> None:
    p = parse(VARIANT)
    assert p.functions == ["main", "second"]
    assert p.build_info == MilProgram().build_info
    ops = {op.output: op for op in p.operations}
    assert ops["W"].val == Value.blob(Type.tensor("fp16", [768, 768, 1, 1]), "@model_path/weights/w.bin", 64)
    assert ops["a"].val.numbers == [1e-5]
    assert ops["b"].val.numbers == [-3.0]
    assert ops["c"].val.numbers == [0.5] and ops["c"].name == "c"
    assert ops["h"].val.numbers == [0.125]
    assert ops["g"].val == Value.number("fp32", -3.0)
    assert ops["r"].val == Value.list(Type.tensor("fp16", []), [0.25])
    assert ops["s"].val.numbers == [0.75] and ops["s"].type == Type.tensor("fp16", [])
    assert ops["ax"].val.numbers == [1.0, -2.0]
    assert [(a.name, a.kind) for a in ops["y"].args] == [
        ("transpose_x", "literal"), ("transpose_y", "literal"), ("x", "ref"), ("y", "literal")]
    assert ops["y"].args[0].literal == Value.number("bool", False)
    assert ops["y"].args[3].literal == Value.number("fp16", 2.0)
    assert ops["z"].args[1].refs == ["x", "y"]
    assert p.outputs == ["y", "z"]
    assert (ops["W"].line, ops["W"].column) == (4, 5)
    assert (ops["y"].line, ops["y"].column) == (14, 5)
    assert parse(emit(p)) == p


def test_parses_bytes_and_empty_build_info() -> None:
    text = 'program(1.3)\n[buildInfo = dict<string, string>({})]\n{\n}\n'
    p = parse(text.encode())
    assert p.build_info == [] and p.functions == []
    assert emit(p) == text


def error_at(text: str) -> orion.ParseError:
    with pytest.raises(orion.ParseError) as info:
        parse(text)
    return info.value


HEADER = "program(1.3)\n{\n    func main<ios18>(tensor<fp16, [1, 4, 1, 32]> x) {\n"
FOOTER = "    } -> (y);\n}\n"


@pytest.mark.parametrize("statement, line, column, message", [
    ('        tensor<fp16, [1, 4, 1, 32]> y = relu(x=x;\n', 4, 49, "expected ')' after argument list, found ';'"),
    ('        fp64 e = const()[name=string("e"), val=fp64(1.0)];\n', 4, 9, "unknown dtype 'fp64'"),
    ('        tensor<fp64, [1]> e = const()[name=string("e"), val=fp16(1.0)];\n', 4, 16, "unknown dtype 'fp64'"),
    ('        tensor<fp16, [1, x]> e = relu(x=x)[name=string("e")];\n', 4, 26,
     "expected a non-negative integer dimension, found 'x'"),
    ('        tensor<fp16, [1, -2]> e = relu(x=x)[name=string("e")];\n', 4, 26,
     "expected a non-negative integer dimension, found '-2'"),
    ('        tensor<fp16, [1, 4, 1, 32]> x = relu(x=x)[name=string("y")];\n', 4, 37, "duplicate variable name 'x'"),
    ('        fp16 e = const()[name=string("e), val=fp16(1.0)];\n', 4, 38, "unterminated string"),
    ('        fp16 e = const()[name=string("e\\n), val=fp16(1.0)];\n', 4, 38, "unterminated string"),
    ('        fp16 e = const()[name=string("e\\q"), val=fp16(1.0)];\n', 4, 40, "unknown escape sequence in string"),
    ('        fp16 e = const()[name=string("e"), val=fp16(1.0)];\n        fp16 f = const()[name=string("\\x65"), '
     'val=fp16(1.0)];\n', 5, 38, 'duplicate op name "e"'),
    ('        fp16 e = const()[name=string("e"), val=fp16(1.0)]\n        fp16 f = const()[name=string("f"), val=fp16(1.0)];\n',
     5, 9, "expected ';' after the statement, found 'fp16'"),
    ('        tensor<fp16, [1, 4, 1, 32]> y = relu(x=x)[];\n', 4, 51, "expected an attribute name, found ']'"),
    ('        tensor<fp16, [1, 4, 1, 32]> y = relu(x=x)[val=fp16(1.0)];\n', 4, 50, "op 'y' has no name= attribute"),
    ('        fp16 e = const()[name=string("e")];\n', 4, 25, "const 'e' has no val= attribute"),
    ('        fp16 e = const()[name=string("e"), val=fp32(1.0)];\n', 4, 48,
     "const 'e' is declared fp16 but its value is fp32"),
    ('        tensor<int32, [2]> e = const()[name=string("e"), val=tensor<int32, [2]>([1,2,3])];\n', 4, 81,
     "3 values for tensor<int32, [2]>"),
    ('        int32 e = const()[name=string("e"), val=int32(1.5)];\n', 4, 55, "1.5 is not a valid int32 literal"),
    ('        fp16 e = const()[name=string("e"), val=fp16(1e999)];\n', 4, 53, "number 1e999 is out of range"),
    ('        fp16 e = const()[name=string("e"), val=fp16(1.0)]; @\n', 4, 60, "unexpected character '@'"),
])
def test_parse_errors_name_line_column_and_expectation(statement: str, line: int, column: int, message: str) -> None:
    error = error_at(HEADER + statement + FOOTER)
    assert (error.line, error.column) == (line, column)
    assert str(error) == f"line {line}, column {column}: {message}"


def test_parse_errors_at_program_level() -> None:
    assert str(error_at("")) == "line 1, column 1: expected 'program' at the start of the program, found end of input"
    assert str(error_at("program(1.3) {")) == "line 1, column 15: expected '}' to close the program body (or 'func'), found end of input"
    assert str(error_at(HEADER + "    }\n}")).startswith("line 5, column 1: expected '->' after the function body")
    error = error_at(HEADER + FOOTER + "trailing")
    assert (error.line, error.column) == (6, 1)
    assert isinstance(error, orion.CompileError)


def test_builder_rejects_bad_and_duplicate_names() -> None:
    p = MilProgram()
    p.add_input("x", ACT)
    p.add_const("k", Value.number("int32", 1), name="k_const")
    for bad in (lambda: p.add_input("x", ACT), lambda: p.add_input("", ACT), lambda: p.add_input("1x", ACT),
                lambda: p.add_const("k", Value.number("fp16", 1.0)),
                lambda: p.add_const("k2", Value.number("fp16", 1.0), name="k_const"),
                lambda: p.add_const("k3", Value.number("fp16", 1.0), name=""),
                lambda: p.add_op("relu", "x", ACT, [("x", "x")]),
                lambda: p.add_op("relu", "r", ACT, [("x", "x"), ("x", "k")]),
                lambda: p.add_op("relu", "r", ACT, [("x", "")]),
                lambda: Value.number("int32", 0.5), lambda: Value.number("string", 1.0),
                lambda: Value.list(Type.tensor("fp16", [2]), [1.0]), lambda: Value.list(Type.scalar("fp16"), [1.0]),
                lambda: Type.scalar("fp64"), lambda: Type.tensor("fp16", [-1])):
        with pytest.raises(ValueError):
            bad()
    assert [op.output for op in p.operations] == ["k"] and p.inputs == [("x", ACT)]


def test_model_properties() -> None:
    t = Type.tensor("fp16", [1, 768, 1, 32])
    assert (t.dtype, t.is_tensor, t.shape, t.element_count, t.byte_size) == ("fp16", True, [1, 768, 1, 32], 24576, 49152)
    assert str(t) == "tensor<fp16, [1, 768, 1, 32]>" and str(Type.scalar("bool")) == "bool"
    v = Value.blob(Type.tensor("int8", [4]), "@model_path/weights/q.bin", 192)
    assert (v.kind, v.blob_path, v.blob_offset, v.type) == ("blob", "@model_path/weights/q.bin", 192, Type.tensor("int8", [4]))
    assert Value.string("valid").text == "valid" and Value.string("valid").kind == "scalar"
    p = parse(DIALECT_EXAMPLE)
    op = p.operations[1]
    assert (op.op, op.output, op.name, op.type, op.args) == ("const", "eps", "eps", Type.scalar("fp16"), [])
    assert p.operations[3].val is None and p.operations[3].args[0].literal is None
    assert "eps" in repr(op) and "fp16" in repr(op.val) and p != MilProgram()


# -- issue 21: a core that builds with Apple's libc++, buildInfo, the constexpr attribute form ------------------

def _fp32_literal_program(values: list[float]) -> str:
    p = MilProgram()
    for i, v in enumerate(values):
        p.add_const(f"c{i}", Value.number("fp32", v))
    return emit(p)


def test_float_literals_are_the_shortest_round_trip_decimals_without_to_chars() -> None:
    """The emitter prints floats with snprintf under the C locale (mil/number_text.h, not std::to_chars, which
    Apple's libc++ lacks before macOS 13.3): the same digits as numpy's shortest (Dragon4) formatting,
    fixed for 1e-5 <= |v| < 1e16, scientific outside, and every literal parses back to the same double
    (strtod, not std::from_chars: libc++ before LLVM 20 has no floating-point from_chars)."""
    import numpy as np
    rng = np.random.default_rng(21)
    halves = np.arange(0, 65536, 97, dtype=np.uint16).view(np.float16)
    values = [float(v) for v in halves[np.isfinite(halves)]]
    values += [float(v) for v in rng.standard_normal(300) * 10.0 ** rng.integers(-30, 30, 300)]
    values += [2.0 ** k for k in range(-1074, 1024, 37)] + [5e-324, 1.7976931348623157e308, 0.1, 1e-5, 1e16, -0.0]
    text = _fp32_literal_program(values)
    literals = [line.split("val=fp32(")[1].split(")")[0] for line in text.splitlines() if "val=fp32(" in line]
    for v, lit in zip(values, literals):
        m = abs(v)
        ref = (np.format_float_positional(v, unique=True, trim="-") if m == 0 or 1e-5 <= m < 1e16
               else np.format_float_scientific(v, unique=True, trim="-", exp_digits=2))
        if "." not in ref and "e" not in ref:
            ref += ".0"
        assert lit == ref, (v, lit, ref)
    back = parse(text).operations
    assert [op.val.numbers[0] for op in back] == values  # exact round trip
    hexed = parse(text.replace("val=fp32(0.1)", "val=fp32(0x1.999999999999ap-4)"))
    assert [op.val.numbers[0] for op in hexed.operations] == values


def test_float_parsing_ignores_the_process_locale() -> None:
    """A host application's setlocale (a decimal comma) changes nothing: the core reads and writes under 'C'."""
    import locale
    text = _fp32_literal_program([0.5, 1234.25])
    for name in ("de_DE.UTF-8", "fr_FR.UTF-8", "C.UTF-8"):
        try:
            old = locale.setlocale(locale.LC_NUMERIC, name)
        except locale.Error:
            continue
        try:
            assert emit(parse(text)) == text
        finally:
            locale.setlocale(locale.LC_NUMERIC, old)


def test_orion_compile_adds_the_default_build_info_identically_on_both_backends() -> None:
    """docs/hardware.md §4: every program that ran on hardware has buildInfo; the text without one gets the
    default block right after program(...), and a text with one is sent unchanged."""
    from orion._core import mil as core_mil
    bare = "// a comment\nprogram(1.3)  // trailing\n{\n    func main<ios18>() {\n    } -> ();\n}\n"
    added = core_mil.with_build_info(bare)
    assert added == bare.replace("program(1.3)", "program(1.3) " + DIALECT_EXAMPLE.splitlines()[1], 1)
    assert parse(added).build_info == parse(DIALECT_EXAMPLE).build_info
    assert core_mil.with_build_info(added) == added
    assert core_mil.with_build_info(DIALECT_EXAMPLE) == DIALECT_EXAMPLE
    empty = bare.replace("program(1.3)", "program(1.3)\n[buildInfo = dict<string, string>({})]")
    assert core_mil.with_build_info(empty) == empty  # the writer's choice is kept
    assert core_mil.with_build_info("not mil") == "not mil"  # the parser names what is wrong


CONSTEXPR_ATTRIBUTE_FORM = """\
program(1.3)
[buildInfo = dict<string, string>({})]
{
    func main<ios18>(tensor<fp16, [1, 2, 1, 32]> x) {
        tensor<fp16, [2, 2, 1, 1]> W = constexpr_affine_dequantize()[axis=int32(0), name=string("W"), quantized_data=tensor<int8, [2, 2, 1, 1]>([2,-4,6,8]), scale=tensor<fp16, [2]>([0.5,0.25]), zero_point=int8(0)];
        tensor<int32, [2]> st = const()[name=string("st"), val=tensor<int32, [2]>([1,1])];
        tensor<int32, [4]> pd = const()[name=string("pd"), val=tensor<int32, [4]>([0,0,0,0])];
        tensor<int32, [2]> dl = const()[name=string("dl"), val=tensor<int32, [2]>([1,1])];
        int32 gr = const()[name=string("gr"), val=int32(1)];
        string pt = const()[name=string("pt"), val=string("valid")];
        tensor<fp16, [1, 2, 1, 32]> y = conv(dilations=dl, groups=gr, pad=pd, pad_type=pt, strides=st, weight=W, x=x)[name=string("y")];
    } -> (y);
}
"""


def test_constexpr_ops_take_their_parameters_as_attributes() -> None:
    """The form coremltools serializes and [M]'s int8 benchmark ran: parsed, kept, emitted byte for byte in
    alphabetical attribute order, and run by the emulator as the operand form."""
    import numpy as np
    p = parse(CONSTEXPR_ATTRIBUTE_FORM)
    w = p.operations[0]
    assert w.op == "constexpr_affine_dequantize" and w.args == [] and w.name == "W"
    assert [k for k, _ in w.attributes] == ["axis", "quantized_data", "scale", "zero_point"]
    assert emit(p) == CONSTEXPR_ATTRIBUTE_FORM
    x = np.random.default_rng(0).standard_normal((1, 2, 1, 32)).astype(np.float16)
    with orion.compile(CONSTEXPR_ATTRIBUTE_FORM, profile="permissive") as prog:
        y = prog(x=x)["y"].astype(np.float32)
    weight = np.array([[2, -4], [6, 8]], np.float32) * np.array([[0.5], [0.25]], np.float32)
    np.testing.assert_allclose(y[0, :, 0, :], weight @ x[0, :, 0, :].astype(np.float32), rtol=2e-3, atol=2e-3)
    with pytest.raises(orion.ParseError, match=r"only constexpr_\* ops take parameters as attributes"):
        parse(CONSTEXPR_ATTRIBUTE_FORM.replace('[name=string("y")]', '[name=string("y"), groups=int32(1)]'))
    both = CONSTEXPR_ATTRIBUTE_FORM.replace("constexpr_affine_dequantize()", "constexpr_affine_dequantize(axis=gr)")
    with pytest.raises(orion.CompileError, match="'axis' is given both as an argument and as an attribute"):
        orion.compile(both, profile="permissive")
