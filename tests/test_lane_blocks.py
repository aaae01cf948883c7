"""The emulator's lane-blocked conv chains (csrc/emulator/lane_blocks.h): a pointwise conv, elementwise steps and a
second pointwise conv or channel slices (a transformer's MLP or projection) computed block of lanes by block of
lanes, so that the chain's wide values exist one block at a time.

The chain must compute exactly what its ops compute one by one. The unfused twin is the same MIL with an
``identity`` after every conv and elementwise op (identity ends a chain and a run, and copies exactly); both are
compared bit for bit, over every lane and under live-lanes hints, and against a float64 numpy reference. The buffer
pool's peak bounds what a 1,024-lane MLP holds."""

from __future__ import annotations

import re

import numpy as np
import pytest

import orion
from orion.compiler import CompiledGraph, lower_graph
from orion.graph import Graph
from orion.runtime import profile
from support.twins import RAN_ITS_OPS, identity_after

BLOCKED = "conv chain (lane blocks)"
SPLIT = re.compile(r"^(\s*)(tensor<[^>]*>) (\w+) = (conv|add|sub|mul|real_div|pow|sigmoid|tanh)\((.*)$")


def gelu64(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def gpt2_mlp(c: int, s: int, rng: np.random.Generator, qkv: bool = False) -> tuple[Graph, dict[str, np.ndarray]]:
    """GPT-2's MLP: fc (bias) -> GELU (tanh form) -> proj (bias); with `qkv`, its attention's projection too: qkv
    plus its bias (one elementwise step) cut into three outputs."""
    w = {"fc": rng.standard_normal((4 * c, c)) / np.sqrt(c), "fc_b": rng.standard_normal(4 * c) * 0.1,
         "proj": rng.standard_normal((c, 4 * c)) / np.sqrt(4 * c), "proj_b": rng.standard_normal(c) * 0.1,
         "qkv": rng.standard_normal((3 * c, c)) / np.sqrt(c), "qkv_b": rng.standard_normal(3 * c) * 0.1}
    w = {k: v.astype(np.float16).astype(np.float32) for k, v in w.items()}
    g = Graph("gpt2_mlp")
    x = g.input("x", [1, c, 1, s])
    g.output(g.linear(g.gelu(g.linear(x, w["fc"], w["fc_b"], name="fc")), w["proj"], w["proj_b"], name="proj"), "y")
    if qkv:
        for name, part in zip("qkv", g.split(g.linear(x, w["qkv"], w["qkv_b"], name="qkv"), [c, c, c], axis=1)):
            g.output(part, name)
    return g, w


def gpt2_reference(x: np.ndarray, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    x64 = x[0, :, 0, :].astype(np.float64)
    hidden = gelu64(w["fc"] @ x64 + w["fc_b"][:, None])
    qkv = np.split(w["qkv"] @ x64 + w["qkv_b"][:, None], 3)
    return {"y": w["proj"] @ hidden + w["proj_b"][:, None]} | dict(zip("qkv", qkv))


def llama_mlp_and_qkv(c: int, h: int, s: int, rng: np.random.Generator) -> tuple[Graph, dict[str, np.ndarray]]:
    """Llama's MLP (gate|up in one conv, cut in two, SwiGLU, down) and a projection cut into q, k, v with no
    elementwise step between (each slice then read by a relu, which is none)."""
    w = {"gu": rng.standard_normal((2 * h, c)) / np.sqrt(c), "down": rng.standard_normal((c, h)) / np.sqrt(h),
         "qkv": rng.standard_normal((3 * c, c)) / np.sqrt(c)}
    w = {k: v.astype(np.float16).astype(np.float32) for k, v in w.items()}
    g = Graph("llama")
    x = g.input("x", [1, c, 1, s])
    gate, up = g.split(g.linear(x, w["gu"], name="gu"), [h, h], axis=1)
    g.output(g.linear(g.mul(g.silu(gate), up), w["down"], name="down"), "y")
    for name, part in zip("qkv", g.split(g.linear(x, w["qkv"], name="qkv"), [c, c, c], axis=1)):
        g.output(g.relu(part), name)
    return g, w


def llama_reference(x: np.ndarray, w: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    x64 = x[0, :, 0, :].astype(np.float64)
    gate, up = np.split(w["gu"] @ x64, 2)
    qkv = [np.maximum(part, 0) for part in np.split(w["qkv"] @ x64, 3)]
    return {"y": w["down"] @ (gate / (1 + np.exp(-gate)) * up)} | dict(zip("qkv", qkv))


def fused_and_twin(g: Graph) -> tuple[orion.Program, orion.Program, object]:
    lowered = lower_graph(g, surface_counts=(16, 16))  # unpacked: the live-lanes hint names x's own lanes
    fused = orion.compile(lowered.mil, lowered.weights, surface_counts=(16, 16))
    twin = orion.compile(identity_after(lowered.mil, SPLIT), lowered.weights, profile="permissive",
                         surface_counts=(16, 16))
    return fused, twin, lowered


def evaluate(program: orion.Program, lowered, x: np.ndarray, live: int | None) -> dict[str, np.ndarray]:
    ins, outs = program.allocate_surfaces()
    packed = CompiledGraph(lowered, program).pack_inputs({"x": x})
    for name, value in packed.items():
        ins[name].write(value)
    program.evaluate(ins, outs, live_lanes={next(iter(packed)): live} if live else None)
    s = x.shape[-1]
    return {name.split("_")[-1]: surface.read().reshape(-1, s)[:, :live or s] for name, surface in outs.items()}


def blocks_match(g, x: np.ndarray, live: int | None, ref: dict[str, np.ndarray]) -> None:
    """``g``'s outputs y, q, k, v (its lane-blocked chains) equal its twin's (the ops apart) bit for bit, and
    ``ref`` (float64) within 2% of each output's largest value, over the ``live`` lanes (None: all)."""
    fused, twin, lowered = fused_and_twin(g)
    got, want = evaluate(fused, lowered, x, live), evaluate(twin, lowered, x, live)
    assert set(got) == {"y", "q", "k", "v"}
    for name in got:
        np.testing.assert_array_equal(got[name].view(np.uint16), want[name].view(np.uint16), err_msg=name)
        want64 = ref[name][:, :live or x.shape[-1]]
        np.testing.assert_allclose(got[name].astype(np.float64), want64, atol=2e-2 * np.abs(want64).max(), err_msg=name)


# 1024: four blocks of 256; 1000 live: four of 250; 600: three of 200; 257: two of 128/129; 100 and 3: one block
@pytest.mark.parametrize("live", [None, 1000, 600, 257, 100, 3])
def test_a_gpt2_mlp_and_qkv_in_lane_blocks_are_their_ops_bit_for_bit(profiling, live) -> None:
    rng = np.random.default_rng(live or 0)
    c, s = 64, 1024
    g, w = gpt2_mlp(c, s, rng, qkv=True)
    x = rng.standard_normal((1, c, 1, s)).astype(np.float16)
    blocks_match(g, x, live, gpt2_reference(x, w))
    rows = profile.snapshot()
    assert sum(r.calls for r in rows if r.op == BLOCKED) == 2, rows  # the MLP and the projection; the twin has none
    assert not [r for r in rows if r.op.endswith(RAN_ITS_OPS)], rows
    assert not [r for r in rows if r.op == "conv" and r.program == next(r.program for r in rows if r.op == BLOCKED)]


@pytest.mark.parametrize("live", [None, 990, 300, 17])
def test_a_llama_mlp_and_a_cut_projection_in_lane_blocks_are_their_ops_bit_for_bit(profiling, live) -> None:
    """gate|up cut into two slices read by SwiGLU's run, then down; q|k|v cut into three slices read by other ops."""
    rng = np.random.default_rng(live or 1)
    c, h, s = 64, 96, 1024
    g, w = llama_mlp_and_qkv(c, h, s, rng)
    x = rng.standard_normal((1, c, 1, s)).astype(np.float16)
    blocks_match(g, x, live, llama_reference(x, w))
    assert sum(r.calls for r in profile.snapshot() if r.op == BLOCKED) == 2  # the MLP and the projection


def test_a_conv_ending_one_chain_starts_none(profiling) -> None:
    """conv -> GELU -> conv -> GELU -> conv: the middle conv ends the first chain, so the second GELU and the last
    conv run as their own kernels (a step in two chains would be run twice, or not at all); the bits are the ops'."""
    rng = np.random.default_rng(4)
    c, s = 64, 1024
    w = [(rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float16).astype(np.float32)
         for shape in [(4 * c, c), (4 * c, 4 * c), (c, 4 * c)]]
    g = Graph("three")
    h = g.input("x", [1, c, 1, s])
    for i, weight in enumerate(w):
        h = g.linear(h, weight, name=f"l{i}")
        if i < 2:
            h = g.gelu(h)
    g.output(h, "y")
    fused, twin, lowered = fused_and_twin(g)
    x = rng.standard_normal((1, c, 1, s)).astype(np.float16)
    got, want = evaluate(fused, lowered, x, None), evaluate(twin, lowered, x, None)
    np.testing.assert_array_equal(got["y"].view(np.uint16), want["y"].view(np.uint16))
    rows = profile.snapshot()
    assert sum(r.calls for r in rows if r.op == BLOCKED) == 1, rows
    x64 = x[0, :, 0, :].astype(np.float64)
    ref = w[2] @ gelu64(w[1] @ gelu64(w[0] @ x64))
    np.testing.assert_allclose(got["y"].astype(np.float64), ref, atol=2e-2 * np.abs(ref).max())


def test_a_1024_lane_mlp_holds_its_hidden_values_one_block_at_a_time() -> None:
    """GPT-2's MLP at C = 256 over 1,024 lanes. Whole, its [4C, S] hidden value and GELU's result (the second conv's
    packed copy of it then takes the first's buffer) are 8 units of [C, S] fp32 beside x and y: a pool peak of 10
    units. In blocks of 256 lanes each of them (and the packed copy) is one unit at most: 5.25 units, within 6."""
    from orion._core import kernels

    rng = np.random.default_rng(3)
    c, s = 256, 1024
    g, _ = gpt2_mlp(c, s, rng)
    lowered = lower_graph(g)
    program = CompiledGraph(lowered, orion.compile(lowered.mil, lowered.weights))
    x = rng.standard_normal((1, c, 1, s)).astype(np.float16)
    program(x=x)  # (the first evaluate's frame and weights)
    kernels.release_idle_buffers()
    kernels.buffer_pool(reset_peak=True)
    program(x=x)
    unit = c * s * 4
    assert kernels.buffer_pool()["peak"] <= 6 * unit, kernels.buffer_pool()
