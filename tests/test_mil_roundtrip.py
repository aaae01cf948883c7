"""Property tests: parse(emit(p)) == p, emit(parse(t)) == t, and parse never crashes on junk."""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import orion
from orion import ops
from orion.mil import MilProgram, Type, Value, emit, parse

OPS = sorted(ops.REGISTRY.mil_ops())  # every MIL op Orion knows of (dialect, banned counterparts, MIL-only)
FLOAT_DTYPES = ["fp16", "fp32"]
INT_RANGES = {"int32": (-2**31, 2**31 - 1), "int16": (-2**15, 2**15 - 1), "int8": (-128, 127),
              "uint16": (0, 2**16 - 1), "uint8": (0, 255)}
ODD_FLOATS = [2.0 ** -24, 2.0 ** -14, 65504.0, -65504.0, -0.0, 0.0, 1e-5, 1 / 3, 0.1, 1e20, -1e-30]

identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True).filter(
    lambda s: s not in {"true", "false"})
floats = st.sampled_from(ODD_FLOATS) | st.floats(allow_nan=False, allow_infinity=False, width=32)
shapes = st.lists(st.integers(0, 4), max_size=4)


@st.composite
def numbers(draw, dtype: str) -> float:
    if dtype in FLOAT_DTYPES:
        return draw(floats)
    if dtype == "bool":
        return float(draw(st.booleans()))
    return float(draw(st.integers(*INT_RANGES[dtype])))


numeric_dtypes = st.sampled_from(FLOAT_DTYPES + ["bool"] + list(INT_RANGES))


@st.composite
def values(draw) -> Value:
    kind = draw(st.sampled_from(["scalar", "string", "list", "blob"]))
    if kind == "string":
        return Value.string(draw(st.text(max_size=12)))
    if kind == "blob":
        return Value.blob(Type.tensor(draw(st.sampled_from(["fp16", "int8"])), draw(shapes)),
                          draw(st.text(max_size=20)), draw(st.integers(0, 2**63)))
    dtype = draw(numeric_dtypes)
    if kind == "scalar":
        return Value.number(dtype, draw(numbers(dtype)))
    t = Type.tensor(dtype, draw(shapes))
    return Value.list(t, draw(st.lists(numbers(dtype), min_size=t.element_count, max_size=t.element_count)))


types = st.builds(Type.tensor, numeric_dtypes, shapes) | st.builds(Type.scalar, st.sampled_from(FLOAT_DTYPES + ["bool", "int32", "string"]))


@st.composite
def arguments(draw, defined: list[str]) -> list[tuple[str, object]]:
    refs = st.sampled_from(defined or ["undefined_ref"])
    kinds = {"ref": refs, "tuple": st.lists(refs, max_size=3), "literal": values()}
    return [(name, draw(kinds[draw(st.sampled_from(list(kinds)))]))
            for name in draw(st.lists(identifiers, unique=True, max_size=4))]


@st.composite
def programs(draw) -> MilProgram:
    """A random program with inputs, consts of every kind and ops, which calls every op of OPS at least
    once (in a drawn order, with drawn types and arguments), so each example covers all of them."""
    p = MilProgram()
    names = draw(st.lists(identifiers, unique=True, min_size=len(OPS) + 4, max_size=len(OPS) + 14))  # + up to 3 inputs
    for name in names[: draw(st.integers(0, 3))]:
        p.add_input(name, draw(types))
    defined = [name for name, _ in p.inputs]
    body = names[len(defined):]
    required = draw(st.permutations(OPS))
    slots = sorted(draw(st.lists(st.integers(0, len(body) - 1), min_size=len(OPS), max_size=len(OPS),
                                 unique=True)))
    calls = dict(zip(slots, required))
    for i, name in enumerate(body):
        if i in calls:
            p.add_op(calls[i], name, draw(types), draw(arguments(defined)))
        elif draw(st.booleans()):
            p.add_const(name, draw(values()), name=draw(st.none() | st.just(name + "_c")))
        else:
            p.add_op(draw(st.sampled_from(OPS)), name, draw(types), draw(arguments(defined)))
        defined.append(name)
    p.outputs = draw(st.lists(st.sampled_from(defined), max_size=3))
    p.build_info = draw(st.just(p.build_info) | st.lists(st.tuples(st.text(max_size=5), st.text(max_size=5)),
                                                          max_size=2))
    return p


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_parse_of_emit_is_identity(data: st.DataObject) -> None:
    p = data.draw(programs())
    assert {op.op for op in p.operations} >= set(OPS)  # every op, in every example
    text = emit(p)
    q = parse(text)
    assert q == p
    assert emit(q) == text


@given(st.sampled_from(ODD_FLOATS) | st.floats(allow_nan=False, allow_infinity=False))
def test_float_literals_round_trip_exactly(v: float) -> None:
    p = MilProgram()
    p.add_const("v", Value.number("fp32", v))
    parsed = parse(emit(p)).operations[0].val.numbers[0]
    assert struct.pack("<d", parsed) == struct.pack("<d", v)


def _only_parse_errors(text: str | bytes) -> None:
    try:
        parse(text)
    except orion.CompileError:
        pass


SAMPLE = emit(parse("""program(1.3) { func main<ios18>(tensor<fp16, [1, 4, 1, 32]> x) {
    tensor<int32, [2]> ax = const()[name=string("ax"), val=tensor<int32, [2]>([0,1])];
    fp16 e = const()[name=string("e"), val=fp16(0x1p-3)];
    tensor<fp16, [4, 4, 1, 1]> w = const()[name=string("w"), val=tensor<fp16, [4, 4, 1, 1]>(BLOBFILE(path=string("@model_path/weights/w.bin"), offset=uint64(64)))];
    tensor<fp16, [1, 4, 1, 32]> y = conv(weight=w, x=x, t=false, v=(x, e))[name=string("y")];
} -> (y); }"""))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(list('()[]{}<>,=;"\\-.xpe/ \n01289') + ["fp16", "tensor", "const", "->"]))
       .map("".join) | st.text() | st.binary(max_size=200))
def test_parse_of_random_text_only_raises_parse_errors(text: str | bytes) -> None:
    _only_parse_errors(text)


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_parse_of_mutated_text_only_raises_parse_errors(data: st.DataObject) -> None:
    text = SAMPLE
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.integers(0, 5))
        insert = data.draw(st.text(max_size=4) | st.sampled_from(['"', "\\x", "0x", "-", "//", "e9999", "\\xff"]))
        text = text[:at] + insert + text[at + cut:]
    _only_parse_errors(text)
    _only_parse_errors(text.encode("utf-8", "surrogatepass"))
