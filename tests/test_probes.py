"""`python -m orion doctor [--probe]`, the probe report and its round trip into the compiler."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import orion
from orion import probes
from orion.graph import Graph

OUTCOMES = {"works", "wrong_data", "compile_fails", "evaluate_fails", "refused", "not_probed"}
# What the emulator models (the conservative forms of docs/hardware.md): the report CI checks on every run.
MODELLED = {"concat": "refused", "reduce_mean": "refused", "softmax_non_pow2": "refused", "surface_8k": "refused",
            "channel_vector": "refused", "nonuniform_io": "refused", "weight_patch": "works", "conv_padding": "works",
            "quantized_ops": "refused", "quantized_weights": "refused", "weight_reload_in_place": "not_probed",
            "fusion_depth": "not_probed", "weight_patch_one_file": "works", "weight_patch_multi_file": "works",
            "quantized_weights_operand": "refused", "build_info_present": "works", "build_info_absent": "works",
            "wide_lanes": "works", "padded_io": "works",
            **{f"inputs_{n}": "refused" for n in probes.SURFACE_COUNTS},  # one input surface (ANE-37)
            "outputs_2": "works", "outputs_4": "works", "outputs_8": "refused", "outputs_16": "refused",
            "lut_weights": "refused", "lut6_weights": "refused", "int4_weights": "refused"}  # ANE-38
# What the ane harness's stand-in framework answers for the probes of issue 21 (it refuses MIL without
# buildInfo, runs both int8 spellings and both patch layouts): each probe's test on the harness.
HARNESS = {"weight_patch_one_file": "works", "weight_patch_multi_file": "works", "quantized_weights": "works",
           "quantized_weights_operand": "works", "build_info_present": "works", "build_info_absent": "compile_fails",
           "wide_lanes": "works", "padded_io": "works", "lut_weights": "works", "lut6_weights": "works",
           "int4_weights": "works"}


@pytest.fixture(scope="module")
def report() -> dict:
    return probes.run()


def test_every_probe_runs_and_the_emulator_shows_the_modelled_behaviour(report) -> None:
    assert set(report["probes"]) == {p.id for p in probes.PROBES}
    assert {r["outcome"] for r in report["probes"].values()} <= OUTCOMES
    assert report["backend"] == orion.backend() and report["chip"] and report["os"]
    if report["backend"] == "emulator":
        assert {k: r["outcome"] for k, r in report["probes"].items()} == MODELLED
        assert report["probes"]["surface_8k"]["detail"].startswith("ANE-12")
    else:  # the ane harness
        assert {k: report["probes"][k]["outcome"] for k in HARNESS} == HARNESS, \
            {k: report["probes"][k]["detail"] for k in HARNESS}
        assert "no buildInfo block" in report["probes"]["build_info_absent"]["detail"]
    assert all(p.settles or p.id in MODELLED for p in probes.PROBES)


def test_the_probe_summary_says_what_was_settled_and_which_file_to_share(report) -> None:
    text = probes.summary(report, "orion-probe-x.json")
    assert text.startswith("summary:") and "share: orion-probe-x.json" in text
    if report["backend"] == "emulator":
        assert "settled nothing about the hardware" in text
    ane = {**report, "backend": "ane", **probes.machine(),
           "probes": {**report["probes"], "weight_patch_multi_file": {**report["probes"]["weight_patch_multi_file"],
                                                                      "outcome": "works"}}}
    text = probes.summary(ane, "r.json")
    assert "weight_patch_multi_file: works -> whether 'data' as the weight files concatenated" in text
    assert "with_weights(unverified_patch=True)" in text
    assert probes.relaxations(ane).multi_file_patch


def test_the_int8_probe_uses_the_attribute_form_and_coremltools_type_codes() -> None:
    """ANE-35: the probe must test the syntax coremltools writes before its verdict means anything."""
    captured = {}
    real = orion.compile

    def spy(mil, weights=None, **kw):
        captured["mil"], captured["weights"] = mil, weights
        return real(mil, weights, **kw)

    import unittest.mock
    with unittest.mock.patch.object(orion, "compile", spy):
        probes._quantized_weights("emulator")
    assert "constexpr_affine_dequantize()[axis=int32(0), name=string(\"W\"), quantized_data=tensor<int8" in captured["mil"]
    (data,) = captured["weights"].values()
    assert data[68] == 4 and data[0] == 2  # int8 chunk (coremltools' Int8 = 4), two blobs in the file


def test_report_round_trips_into_the_compiler(report, tmp_path) -> None:
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(report))
    relaxed = probes.load_report(path)
    if report["backend"] == "emulator":
        assert relaxed.min_surface_bytes is None and "emulator" in relaxed.source
    # the same report, as if the ane backend of this machine had proven 8 KB surfaces
    ane = {**report, "backend": "ane", **probes.machine(),
           "probes": {**report["probes"], "surface_8k": {**report["probes"]["surface_8k"], "outcome": "works"}}}
    path.write_text(json.dumps(ane))
    assert probes.load_report(path).min_surface_bytes == 8192
    def proved(probe: str) -> bool:  # never on the emulator (MODELLED); on the ane harness's stand-in, yes
        return report["probes"][probe]["outcome"] == "works"

    assert probes.load_report(path).ops == ((probes.QUANTIZED_OPS if proved("quantized_ops") else ())
                                            + (probes.QUANTIZED_WEIGHT_OPS if proved("quantized_weights") else ())
                                            + (probes.LUT_WEIGHT_OPS if proved("lut_weights") else ())
                                            + (probes.INT4_WEIGHT_OPS if proved("int4_weights") else ()))
    neither = {**ane, "probes": {**ane["probes"], **{probe: {"outcome": "refused"} for probe in (
        "quantized_ops", "quantized_weights", "lut_weights", "lut6_weights", "int4_weights")}}}
    quantized = {**neither, "probes": {**neither["probes"], "quantized_ops": {"outcome": "works"}}}
    assert probes.relaxations(quantized).ops == ("quantize", "dequantize")
    weights = {**neither, "probes": {**neither["probes"], "quantized_weights": {"outcome": "works"}}}
    assert probes.relaxations(weights).ops == ("constexpr_affine_dequantize",)  # what quant="int8" needs
    assert probes.load_report(path, require_same_machine=True).min_surface_bytes == 8192
    other = {**ane, "chip": "Apple M1 (not this one)"}
    assert probes.relaxations(other).min_surface_bytes is None
    assert probes.relaxations(other, require_same_machine=False).min_surface_bytes == 8192
    with pytest.raises(orion.OrionError, match="schema"):
        probes.relaxations({**ane, "schema": 99})

    g = Graph("probe_relaxed")
    g.output(g.tanh(g.input("x", [1, 64, 1, 32])), "y")
    x = np.random.default_rng(0).standard_normal((1, 64, 1, 32)).astype(np.float16)
    conservative = orion.compile_graph(g)
    relaxed_graph = orion.compile_graph(g, probe_report=str(path))
    assert conservative.layout.inputs[0].padded == (1, 12, 1, 2048)  # 49,152 bytes, packed at the front
    assert relaxed_graph.layout.inputs[0].padded == (1, 2, 1, 2048)  # 8,192 bytes, proven by the report
    assert relaxed_graph.program.allocate_surfaces()[0][next(iter(relaxed_graph.program.inputs))].nbytes == 8192
    assert np.array_equal(relaxed_graph(x=x)["y"], conservative(x=x)["y"])
    # without the report the small surfaces are refused at evaluate (ANE-12)
    small = relaxed_graph.program
    plain = orion.compile(relaxed_graph.mil, relaxed_graph.weights)
    ins, outs = small.allocate_surfaces()
    with pytest.raises(orion.ConstraintError) as e:
        plain.evaluate(ins, outs)
    assert e.value.constraint == "ANE-12"


def test_doctor_command_explains_the_backend(tmp_path) -> None:
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, "-m", "orion", "doctor", "--probe", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    for line in ("platform:", "backend:", "ANE framework:", "compile budget:", "cache:", "end to end:      ok"):
        assert line in run.stdout
    if orion.backend() == "emulator":
        assert "backend:         emulator: software ANE emulator: " in run.stdout
    assert json.loads(out.read_text())["schema"] == probes.SCHEMA
    js = subprocess.run([sys.executable, "-m", "orion", "doctor", "--json"], capture_output=True, text=True, timeout=120)
    assert json.loads(js.stdout)["end_to_end"]["ok"] is True
