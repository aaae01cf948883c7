"""Replay every MIL program the suite emitted (parsed back with orion.mil.parse) through coremltools' MIL
builder and compare declared output types with coremltools' type inference. conftest's ``SCHEMA_REPLAY``
replays each as it is lowered; the report runs last (see conftest.pytest_collection_modifyitems)."""

from __future__ import annotations

import os

import pytest

from conftest import SCHEMA_REPLAY
from support.compiler.mil_schema_check import coremltools, replay

from .test_compiler import block
from .test_lowering import mlp


def int8_linear():
    """A linear with an int8 weight: constexpr_affine_dequantize in the attribute form, int8 BLOBFILE (code 4)."""
    import numpy as np

    from orion.graph import Graph
    from orion.quant import quantize_int8

    g = Graph("int8_linear")
    w = g.const_quantized("w", quantize_int8(np.random.default_rng(0).standard_normal((96, 64)) / 8, "w"))
    g.output(g.linear(g.input("x", [1, 64, 1, 64]), w), "y")
    return g


def test_int8_programs_use_the_attribute_form_and_pass_the_replay() -> None:
    """ANE-35: the emitted int8 weight is coremltools' spelling (parameters as attributes, int8 data type code 4),
    and coremltools' own constexpr_affine_dequantize infers the declared type."""
    if coremltools() is None:
        pytest.skip("coremltools 9.0 is not installed")
    from orion import mil
    from orion.compiler import lower_graph

    lowered = lower_graph(int8_linear())
    assert "constexpr_affine_dequantize()[axis=int32(0), name=string(" in lowered.mil
    (op,) = [o for o in mil.parse(lowered.mil).operations if o.op == "constexpr_affine_dequantize"]
    assert [k for k, _ in op.attributes] == ["axis", "quantized_data", "scale", "zero_point"] and op.args == []
    data = lowered.weights[dict(op.attributes)["quantized_data"].blob_path]
    assert data[68] == 4  # coremltools' BlobDataType::Int8
    assert replay(mil.parse(lowered.mil), lowered.weights) == []


def test_every_emitted_program_matches_coremltools_types() -> None:
    if coremltools() is None:
        message = "coremltools 9.0 is not installed (pip install '.[test]' brings it)"
        if os.environ.get("CI"):
            pytest.fail(message + ": CI must run the schema replay")
        pytest.skip(message)
    from orion.compiler import lower_graph

    for graph in (mlp(), block()[0], int8_linear()):  # at least these, when this test runs alone
        for io_dtype in ("fp16", "fp32"):
            lower_graph(graph, io_dtype=io_dtype)  # replayed as lowered (conftest)
    assert not SCHEMA_REPLAY.failures, "\n".join(SCHEMA_REPLAY.failures)
    assert SCHEMA_REPLAY.programs >= 4


def test_the_replay_reports_a_declared_type_coremltools_disagrees_with() -> None:
    """The check itself can fail: a reduce_sum declared with the wrong kept shape, and a second use of the
    same op signature in another program (not rebuilt again, so reported once)."""
    if coremltools() is None:
        pytest.skip("coremltools 9.0 is not installed")
    from orion import mil

    text = """program(1.3)
[buildInfo = dict<string, string>({{"coremlc-version", "3505.4.1"}})]
{
    func main<ios18>(tensor<fp16, [1, 4, 1, 8]> x) {
            tensor<int32, [1]> ax = const()[name = string("ax"), val = tensor<int32, [1]>([1])];
            bool kd = const()[name = string("kd"), val = bool(true)];
            tensor<fp16, [1, 4, 1, 1]> y = reduce_sum(x = x, axes = ax, keep_dims = kd)[name = string("y")];
    } -> (y);
}"""
    seen: set[tuple] = set()
    first = replay(mil.parse(text), {}, seen)
    assert first == ["y = reduce_sum(...): declared fp16 [1, 4, 1, 1], coremltools infers fp16 [1, 1, 1, 8]"]
    assert replay(mil.parse(text), {}, seen) == []
    fixed = text.replace("tensor<fp16, [1, 4, 1, 1]> y", "tensor<fp16, [1, 1, 1, 8]> y")
    assert replay(mil.parse(fixed), {}, set()) == []
