"""The emulator's fused elementwise runs (csrc/emulator/fused_elementwise.h): consecutive binary ops (and
sigmoids and tanhs) of one shape computed row by row in one pass, results nothing else reads never stored.

The run must compute exactly what its ops compute one by one. The unfused twin is the same MIL with an
``identity`` after every fusable op (identity ends a run, and copies its input exactly); both are compared
bit for bit, and against a float64 numpy reference."""

from __future__ import annotations

import re

import numpy as np
import pytest

import orion
from orion.compiler import CompiledGraph, lower_graph
from orion.graph import Graph
from orion.runtime import profile
from support.twins import identity_after

FUSED = "elementwise (fused)"
FUSABLE = re.compile(r"^(\s*)(tensor<[^>]*>) (\w+) = (add|sub|mul|real_div|pow|sigmoid|tanh)\((.*)$")


def unfused_twin(mil: str) -> str:
    """Each fusable op's result passed through an identity under its old name."""
    return identity_after(mil, FUSABLE)


def layer(c: int, s: int, seed: int = 0) -> tuple[Graph, dict[str, np.ndarray]]:
    """LayerNorm -> GELU (tanh form: one run with the binary ops around the tanh) -> residual add, with a runtime
    per-channel scale ([1, C, 1, 1], one value per row) and a per-lane bias ([1, 1, 1, S], shared by rows)."""
    rng = np.random.default_rng(seed)
    g = Graph("ew")
    x = g.input("x", [1, c, 1, s])
    row_scale = g.input("row_scale", [1, c, 1, 1])
    bias = rng.standard_normal((1, 1, 1, s)).astype(np.float16)
    lane_bias = g.input("lane_bias", [1, 1, 1, s]) if s > 1 else g.const("lane_bias", bias)  # I/O needs 32 lanes
    gamma, beta = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    h = g.gelu(g.layer_norm(x, gamma, beta))
    y = g.add(g.mul(g.add(h, x), row_scale), lane_bias)
    g.output(g.div(y, g.add(g.mul(x, x), 1.0)), "y")
    xs = {"x": rng.standard_normal((1, c, 1, s)).astype(np.float16),
          "row_scale": rng.standard_normal((1, c, 1, 1)).astype(np.float16)}
    return g, xs | {"lane_bias": bias, "gamma": gamma, "beta": beta}


def reference(xs: dict[str, np.ndarray]) -> np.ndarray:
    x = xs["x"].astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    ln = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    ln = ln * xs["gamma"].reshape(1, -1, 1, 1) + xs["beta"].reshape(1, -1, 1, 1)
    gelu = 0.5 * ln * (1 + np.tanh(np.sqrt(2 / np.pi) * (ln + 0.044715 * ln ** 3)))
    y = (gelu + x) * xs["row_scale"].astype(np.float64) + xs["lane_bias"].astype(np.float64)
    return y / (x * x + 1)


# (256, 1): a decode step; (768, 8): one over 8 lanes (short rows computed in blocks of rows)
@pytest.mark.parametrize("c, s", [(64, 32), (96, 256), (768, 64), (256, 1), (768, 8)])
def test_fused_runs_are_the_ops_bit_for_bit_and_match_float64(profiling, c, s) -> None:
    g, xs = layer(c, s)
    lowered = lower_graph(g)
    fused = CompiledGraph(lowered, orion.compile(lowered.mil, lowered.weights))
    twin = CompiledGraph(lowered, orion.compile(unfused_twin(lowered.mil), lowered.weights, profile="permissive"))
    inputs = {k: v for k, v in xs.items() if k in {spec.name for spec in lowered.layout.inputs}}
    y, y_twin = fused(**inputs)["y"], twin(**inputs)["y"]
    np.testing.assert_array_equal(y.view(np.uint16), y_twin.view(np.uint16))
    rows = profile.snapshot()
    # The LayerNorm is one fused norm kernel at any lane count (tests/test_stable_norm.py); GELU's binary ops around
    # its tanh are one run.
    assert sum(r.calls for r in rows if r.op == "norm (fused)") == 1
    assert sum(r.calls for r in rows if r.op == FUSED) >= 1
    (program,) = {r.program for r in rows if r.op == FUSED}  # the twin has none
    assert not [r for r in rows if r.op == "tanh" and r.program == program]
    want = reference(xs)
    np.testing.assert_allclose(y.astype(np.float64), want, atol=3e-2 * np.abs(want).max())  # fp16 per op


@pytest.mark.parametrize("act", ["sigmoid", "tanh"])
@pytest.mark.parametrize("c, s", [(96, 256), (4864, 32), (64, 64)])
def test_gated_activations_are_one_fused_run_bit_for_bit(profiling, act, c, s) -> None:
    """gate * act(gate) * up (sigmoid: SiLU and SwiGLU, as the Llama family's MLP lowers; tanh: as in GELU's tanh
    form): the unary op joins the run, so neither its result nor the product's is stored; the run is its ops bit
    for bit and float64's within fp16."""
    rng = np.random.default_rng(c + s)
    g = Graph("gated")
    gate, up = g.input("gate", [1, c, 1, s]), g.input("up", [1, c, 1, s])
    g.output(g.mul(g.mul(gate, getattr(g, act)(gate)), up), "y")
    xs = {"gate": (rng.standard_normal((1, c, 1, s)) * 4).astype(np.float16),
          "up": rng.standard_normal((1, c, 1, s)).astype(np.float16)}
    lowered = lower_graph(g)
    assert f"{act}(" in lowered.mil
    fused = CompiledGraph(lowered, orion.compile(lowered.mil, lowered.weights))
    twin = CompiledGraph(lowered, orion.compile(unfused_twin(lowered.mil), lowered.weights, profile="permissive"))
    y, y_twin = fused(**xs)["y"], twin(**xs)["y"]
    np.testing.assert_array_equal(y.view(np.uint16), y_twin.view(np.uint16))
    rows = profile.snapshot()
    (program,) = {r.program for r in rows if r.op == FUSED}  # the twin has none
    assert not [r for r in rows if r.op in (act, "mul") and r.program == program], rows
    gate64, up64 = xs["gate"].astype(np.float64), xs["up"].astype(np.float64)
    activation = 1 / (1 + np.exp(-gate64)) if act == "sigmoid" else np.tanh(gate64)
    np.testing.assert_allclose(y.astype(np.float64), gate64 * activation * up64, rtol=3e-3, atol=1e-3)  # 3 roundings


# (64, 17) and (1024, 16): a short live prefix, gathered (a short prompt in a large bucket); (1024, 100): row by row
@pytest.mark.parametrize("s, live", [(64, 17), (1024, 16), (1024, 100)])
def test_partially_live_operands_take_the_unfused_path(s, live) -> None:
    """With a live-lanes hint the ops compute only the live lanes; the run must too, with the same bits."""
    g, xs = layer(64, s)
    lowered = lower_graph(g, surface_counts=(16, 16))  # unpacked inputs: the hint names x's own lanes
    fused = orion.compile(lowered.mil, lowered.weights, surface_counts=(16, 16))
    twin = orion.compile(unfused_twin(lowered.mil), lowered.weights, profile="permissive")
    cg = CompiledGraph(lowered, fused)
    packed = cg.pack_inputs({k: v for k, v in xs.items() if k in {spec.name for spec in lowered.layout.inputs}})
    x_name = next(n for n in packed if n.endswith("_x"))
    results = []
    for p in (fused, twin):
        ins, outs = p.allocate_surfaces()
        for name, value in packed.items():
            ins[name].write(value)
        p.evaluate(ins, outs, live_lanes={x_name: live})
        results.append({n: surface.read() for n, surface in outs.items()})
    for name in results[0]:
        got, want = (r[name].reshape(-1, s)[:, :live] for r in results)
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
