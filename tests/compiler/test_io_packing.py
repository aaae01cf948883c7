"""I/O packing (ANE-37): programs bind one input surface and at most six output surfaces under the hardware
profile unless a probe report proved more; every tensor is a view of its packed surface. References are
numpy float64 of the fp16-rounded inputs."""

from __future__ import annotations

import numpy as np
import pytest

import orion
from orion import probes
from orion.compiler import compile_graph, lower_graph
from orion.errors import ConstraintError
from orion.graph.builder import Graph
from orion.passes.io_packing import PACKED_INPUT, row_width
from orion.runtime.stage import Stage

SHAPE = (1, 64, 1, 384)  # 49,152 fp16 bytes: no padding
TWO_INPUTS = """program(1.3)
{
    func main<ios18>(tensor<fp16, [1, 64, 1, 384]> a, tensor<fp16, [1, 64, 1, 384]> b) {
        tensor<fp16, [1, 64, 1, 384]> y = add(x=a, y=b)[name=string("y")];
    } -> (y);
}
"""


def _seven_outputs() -> str:
    body = "".join(f'        fp16 k{i} = const()[name=string("k{i}"), val=fp16({i + 1}.0)];\n'
                   f'        tensor<fp16, [1, 64, 1, 384]> y{i} = mul(x=x, y=k{i})[name=string("y{i}")];\n'
                   for i in range(7))
    return ("program(1.3)\n{\n    func main<ios18>(tensor<fp16, [1, 64, 1, 384]> x) {\n" + body
            + "    } -> (" + ", ".join(f"y{i}" for i in range(7)) + ");\n}\n")


def _fp16(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float16).astype(np.float64)


def test_hardware_profile_refuses_more_surfaces_than_proven() -> None:
    """ANE-37: two input surfaces, or seven output surfaces, are refused at compile under the hardware profile
    (maderix/ANE saw several inputs fail with 0x1d; mechramc/Orion ran at most 6 outputs); the counts a probe
    report proved relax it, and the permissive profile lifts it."""
    with pytest.raises(ConstraintError, match=r"ANE-37.*binds 2 input surfaces; 1 are proven") as err:
        orion.compile(TWO_INPUTS)
    assert err.value.constraint == "ANE-37"
    with pytest.raises(ConstraintError, match=r"ANE-37.*binds 7 output surfaces; 6 are proven"):
        orion.compile(_seven_outputs())
    a, b = (np.random.default_rng(i).standard_normal(SHAPE).astype(np.float16) for i in (1, 2))
    with orion.compile(TWO_INPUTS, surface_counts=(2, 1)) as p:
        np.testing.assert_array_equal(p(a=a, b=b)["y"], (a + b).astype(np.float16))
    with orion.compile(_seven_outputs(), surface_counts=(1, 7)) as p:
        assert len(p(x=a)) == 7
    with orion.compile(TWO_INPUTS, profile="permissive") as p:
        assert list(p.inputs) == ["a", "b"]
    for bad in ((0, 6), (1,), (1.5, 6), "16"):
        with pytest.raises(orion.CompileError, match="surface_counts"):
            orion.compile(TWO_INPUTS, surface_counts=bad)


def _graph() -> tuple[Graph, dict[str, np.ndarray]]:
    """Inputs of several sizes (one that does not fill its rows, a [1, C, 1, 1] bias) and eight outputs of
    three sizes (two groups of one size, one alone)."""
    g = Graph("packed")
    x = g.input("x", [1, 64, 1, 32])
    w = g.input("w", [1, 48, 1, 64])
    b = g.input("b", [1, 48, 1, 1])
    y = g.add(g.linear(x, w), b, name="y")
    g.output(y, "y")
    g.output(g.tanh(y), "t")
    g.output(g.mul(y, 2.0), "m")
    for n in range(4):
        g.output(g.mul(x, float(n + 3)), f"o{n}")
    g.output(g.mul(w, -1.0), "neg_w")
    rng = np.random.default_rng(7)
    arrays = {"x": rng.standard_normal((1, 64, 1, 32)), "w": rng.standard_normal((1, 48, 1, 64)) / 8,
              "b": rng.standard_normal((1, 48, 1, 1))}
    return g, arrays


def _reference(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    x, w, b = (_fp16(arrays[k]) for k in ("x", "w", "b"))
    y = np.einsum("oi,is->os", w[0, :, 0, :], x[0, :, 0, :])[None, :, None, :] + b
    out = {"y": y, "t": np.tanh(y), "m": 2 * y, "neg_w": -w}
    out.update({f"o{n}": (n + 3) * x for n in range(4)})
    return out


@pytest.mark.parametrize("io_dtype", ["fp16", "fp32"])
def test_packed_program_binds_one_input_and_few_outputs_and_matches_numpy(io_dtype: str) -> None:
    """Three inputs become one surface; eight outputs become three (two groups of one size and one alone),
    and every output matches numpy within fp16 rounding."""
    g, arrays = _graph()
    cg = compile_graph(g, io_dtype=io_dtype)
    assert list(cg.program.inputs) == [PACKED_INPUT]
    assert len(cg.program.outputs) == 3
    assert {s.surface for s in cg.layout.inputs} == {PACKED_INPUT}
    got, want = cg(**arrays), _reference(arrays)
    assert sorted(got) == sorted(want)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=4e-3, atol=4e-3, err_msg=name)
    np.testing.assert_array_equal(got["o1"], _fp16(4 * _fp16(arrays["x"])))  # placed exactly (x * 1 + 0)


def test_stage_views_share_the_packed_surfaces() -> None:
    """A stage's inputs and outputs are views of the packed surfaces (writes go through, nothing is copied)."""
    g, arrays = _graph()
    stage = Stage(compile_graph(g))
    packed = stage.inputs[PACKED_INPUT].array
    for name, value in arrays.items():
        view = stage.input(name)
        assert np.shares_memory(view, packed) and view.shape == value.shape
        view[...] = value
    stage.run()
    for name, ref in _reference(arrays).items():
        assert any(np.shares_memory(stage.output(name), s.array) for s in stage.outputs.values())
        np.testing.assert_allclose(stage.output(name), ref, rtol=4e-3, atol=4e-3, err_msg=name)


def test_shared_surfaces_of_packed_tensors_are_copied_in_and_out() -> None:
    """A surface owned elsewhere (a chained residual stream) for a tensor the program packed is copied into
    the packed surface before the run, and an output's out of it after."""
    g, arrays = _graph()
    cg = compile_graph(g)
    x = orion.Surface((1, 64, 1, 32))
    y = orion.Surface((1, 48, 1, 32))
    stage = Stage(cg, {"x": x, "out:y": y})
    x.array[...] = arrays["x"]
    stage.input("w")[...] = arrays["w"]
    stage.input("b")[...] = arrays["b"]
    stage.run()
    np.testing.assert_allclose(y.array, _reference(arrays)["y"], rtol=4e-3, atol=4e-3)


def test_row_width_prefers_the_common_lane_count_then_a_common_divisor() -> None:
    assert row_width([64 * 384, 32 * 384], [384, 384], 32) == 384
    assert row_width([768 * 256, 768 * 768], [256, 768], 32) == 16384
    assert row_width([64 * 32, 48 * 64, 48], [32, 64, 1], 32) == 64  # no common divisor of 32 lanes or more


def test_too_many_output_sizes_raise_ane37_and_the_partitioner_splits() -> None:
    """Seven outputs of seven sizes cannot share six surfaces: lowering raises ANE-37 (the partitioner then
    plans smaller programs); a probe report proving seven outputs lowers it unpacked."""
    g = Graph("sizes")
    x = g.input("x", [1, 64, 1, 64])
    for i in range(7):
        g.output(g.slice(g.mul(x, float(i + 1)), 1, 0, 8 * (i + 1)), f"y{i}")
    with pytest.raises(ConstraintError, match="ANE-37"):
        lower_graph(g)
    assert len(lower_graph(g, surface_counts=(1, 7)).layout.outputs) == 7


def _ane_report(outcomes: dict[str, str]) -> dict:
    return {"schema": probes.SCHEMA, "backend": "ane", **probes.machine(),
            "probes": {pid: {"outcome": outcome} for pid, outcome in outcomes.items()}}


def test_a_probe_report_proving_n_inputs_relaxes_the_packing() -> None:
    """ANE-37 relaxed by a report from this machine's ane backend: 2 and 4 inputs worked, 8 failed -> up to 4
    input surfaces; 2 outputs worked but 4 failed -> still the 6 mechramc/Orion ran. An emulator report
    relaxes nothing."""
    relax = probes.relaxations(_ane_report({"inputs_2": "works", "inputs_4": "works", "inputs_8": "evaluate_fails",
                                            "outputs_2": "works", "outputs_4": "evaluate_fails"}))
    assert relax.surface_counts == (4, 6)
    assert probes.relaxations({**_ane_report({"inputs_2": "works"}), "backend": "emulator"}).surface_counts is None
    assert probes.relaxations(_ane_report({"inputs_4": "works"})).surface_counts is None  # 2 was not proven
    g, arrays = _graph()
    cg = compile_graph(g, probe_report=relax)
    assert sorted(cg.program.inputs) == ["in_00_x", "in_01_w", "in_02_b"]  # three surfaces: not packed
    for name, ref in _reference(arrays).items():
        np.testing.assert_allclose(cg(**arrays)[name], ref, rtol=4e-3, atol=4e-3, err_msg=name)
    five = Graph("five")
    xs = [five.input(f"x{i}", [1, 64, 1, 384]) for i in range(5)]
    total = xs[0]
    for x in xs[1:]:
        total = five.add(total, x)
    five.output(total, "y")
    assert list(compile_graph(five, probe_report=relax).program.inputs) == [PACKED_INPUT]  # 5 > 4: packed


def test_count_probes_show_the_modelled_rule_on_the_emulator() -> None:
    """On the emulator the ANE-37 probes report the conservative rule: several inputs refused, up to 6 outputs
    work, 8 and 16 refused."""
    if orion.backend() != "emulator":
        pytest.skip("the modelled outcomes are the emulator's")
    report = probes.run(tuple(p for p in probes.PROBES if p.rule == "ANE-37"))["probes"]
    assert {pid: r["outcome"] for pid, r in report.items()} == {
        "inputs_2": "refused", "inputs_4": "refused", "inputs_8": "refused", "inputs_16": "refused",
        "outputs_2": "works", "outputs_4": "works", "outputs_8": "refused", "outputs_16": "refused"}
    assert all("ANE-37" in r["detail"] for r in report.values() if r["outcome"] == "refused")
