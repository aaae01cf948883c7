"""The emulator's one-pass placement of packed outputs (csrc/emulator/packed_outputs.h): the I/O packing's
``sum_i mul(block_i, one-hot_i)`` (ANE-37) written row by row must be those ops bit for bit, signed zeros
included; a non-finite block makes the kernel fall back to the ops (their NaNs). The reference is the same
sum computed literally in numpy float16, and the unfused twin (an ``identity`` after each of the packing's
muls and adds, which breaks the pattern)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import orion
from orion.compiler import CompiledGraph, lower_graph
from orion.graph import Graph
from orion.runtime import profile
from orion.runtime.stage import Stage
from support.twins import RAN_ITS_OPS, identity_after

PLACED = "I/O packing (placed)"
FACTORS = (1.0, -1.0, 0.0, 2.0, -0.5, 0.25, -3.0)  # seven outputs of one size: packed into one surface
PACKING_OP = re.compile(r"^(\s*)(tensor<[^>]*>) (out_packed_\w+_(?:placed|sum)) = (mul|add)\((.*)$")


def unplaced_twin(mil: str) -> str:
    """The packing's muls and adds each followed by an identity under its old name."""
    return identity_after(mil, PACKING_OP)


def packed_graph(lanes: int, factors: tuple[float, ...] = FACTORS, channels: int = 64) -> Graph:
    g = Graph("packed_outputs")
    x = g.input("x", [1, channels, 1, lanes])
    for i, factor in enumerate(factors):
        g.output(g.mul(x, factor, name=f"scaled{i}"), f"o{i}")
    return g


def literal_reference(x: np.ndarray, factors: tuple[float, ...] = FACTORS) -> list[np.ndarray]:
    """Each output as the packing computes it in fp16: sum_j (x * f_j) * (j == i), in order."""
    blocks = [(x * np.float16(f)).astype(np.float16) for f in factors]
    out = []
    for i in range(len(factors)):
        total = None
        for j, b in enumerate(blocks):
            placed = b * np.float16(1.0 if j == i else 0.0)
            total = placed if total is None else (total + placed).astype(np.float16)
        out.append(total)
    return out


def _x(seed: int, lanes: int, channels: int = 64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, channels, 1, lanes)).astype(np.float16)
    x.flat[::5] = np.float16(0.0)
    x.flat[1::7] = np.float16(-0.0)
    return x


# 32 lanes: each output one row of the packed surface; 512: two rows each
@pytest.mark.parametrize("lanes", [32, 512])
def test_placement_is_the_ops_bit_for_bit_signed_zeros_included(profiling, lanes) -> None:
    lowered = lower_graph(packed_graph(lanes))
    assert "out_packed_0_1_placed" in lowered.mil
    placed = CompiledGraph(lowered, orion.compile(lowered.mil, lowered.weights))
    twin = CompiledGraph(lowered, orion.compile(unplaced_twin(lowered.mil), lowered.weights, profile="permissive"))
    x = _x(0, lanes)
    got, want = placed(x=x), twin(x=x)
    for i, ref in enumerate(literal_reference(x)):
        np.testing.assert_array_equal(got[f"o{i}"].view(np.uint16), ref.view(np.uint16), err_msg=f"o{i}")
        np.testing.assert_array_equal(got[f"o{i}"].view(np.uint16), want[f"o{i}"].view(np.uint16), err_msg=f"o{i}")
    assert np.signbit(got["o0"]).any() and (got["o0"] == 0).any()  # the case is there: -0 placed as the ops give it
    rows = profile.snapshot()
    (program,) = {r.program for r in rows if r.op == PLACED}  # the twin has none
    assert not [r for r in rows if r.op == "add" and r.program == program], rows


def test_many_blocks_are_placed_in_shorter_slices(profiling) -> None:
    """42 outputs of 32768 values: each pass covers fewer than 4096 of each block's elements (all the blocks'
    slices in L2) and the passes run on the threads; still the ops' bit for bit, signed zeros included."""
    factors = FACTORS * 6
    lowered = lower_graph(packed_graph(512, factors))
    placed = CompiledGraph(lowered, orion.compile(lowered.mil, lowered.weights))
    x = _x(3, 512)
    got = placed(x=x)
    for i, ref in enumerate(literal_reference(x, factors)):
        np.testing.assert_array_equal(got[f"o{i}"].view(np.uint16), ref.view(np.uint16), err_msg=f"o{i}")
    assert PLACED in {r.op for r in profile.snapshot()}


@pytest.mark.parametrize("bad", [np.inf, -np.inf])  # (a NaN input is refused at the input)
def test_a_non_finite_block_falls_back_to_the_ops(profiling, bad) -> None:
    lowered = lower_graph(packed_graph(512))
    placed = CompiledGraph(lowered, orion.compile(lowered.mil, lowered.weights))
    twin = CompiledGraph(lowered, orion.compile(unplaced_twin(lowered.mil), lowered.weights, profile="permissive"))
    x = _x(1, 512)
    x.flat[100] = np.float16(bad)
    got, want = placed(x=x), twin(x=x)
    for i in range(len(FACTORS)):
        np.testing.assert_array_equal(got[f"o{i}"].view(np.uint16), want[f"o{i}"].view(np.uint16), err_msg=f"o{i}")
        assert np.isnan(got[f"o{i}"].flat[100])  # inf * 0 in another row: the group's element is NaN
    assert PLACED + RAN_ITS_OPS in {r.op for r in profile.snapshot()}


def test_placement_of_a_batched_step_with_dead_sequences(profiling) -> None:
    """8 lanes, 3 live (a live-lanes hint on x, as on a batched decode step): placed in one pass, the live
    lanes the ops' bit for bit (the dead ones are undefined for both)."""
    lowered = lower_graph(packed_graph(8))
    placed = Stage(CompiledGraph(lowered, orion.compile(lowered.mil, lowered.weights)))
    twin = Stage(CompiledGraph(lowered, orion.compile(unplaced_twin(lowered.mil), lowered.weights, profile="permissive")))
    x = _x(2, 8)
    outs = []
    for stage in (placed, twin):
        stage.input("x")[...] = x
        stage.run({"x": 3})
        outs.append({f"o{i}": stage.output(f"o{i}")[..., :3].copy() for i in range(len(FACTORS))})
    for i, ref in enumerate(literal_reference(x[..., :3])):
        np.testing.assert_array_equal(outs[0][f"o{i}"].view(np.uint16), ref.view(np.uint16), err_msg=f"o{i}")
        np.testing.assert_array_equal(outs[0][f"o{i}"].view(np.uint16), outs[1][f"o{i}"].view(np.uint16))
    ops = {r.op for r in profile.snapshot()}
    assert PLACED in ops and PLACED + RAN_ITS_OPS not in ops, ops


@pytest.mark.parametrize("channels, lanes, live", [(64, 512, 300), (64, 64, 40), (1, 512, 300)])
def test_placement_of_a_prompt_shorter_than_its_bucket(profiling, channels, lanes, live) -> None:
    """Rows of more than 32 lanes, ``live`` of them live (a prompt in a wider bucket): placed in one pass, not
    by the ops (their fp32 intermediates of the packed size were a 30-layer model's peak). The live lanes are
    the ops' bit for bit. An output reshaped to the packing's width (64 channels) has its dead lanes +0, as the
    reshape makes them: there the whole output is the ops'; one that keeps its lane axis (1 channel) leaves
    them undefined, as the ops do."""
    lowered = lower_graph(packed_graph(lanes, channels=channels))
    placed = Stage(CompiledGraph(lowered, orion.compile(lowered.mil, lowered.weights)))
    twin = Stage(CompiledGraph(lowered, orion.compile(unplaced_twin(lowered.mil), lowered.weights, profile="permissive")))
    x = _x(5, lanes, channels)
    outs = []
    for stage in (placed, twin):
        stage.input("x")[...] = x
        stage.run({"x": live})
        outs.append({f"o{i}": stage.output(f"o{i}").copy() for i in range(len(FACTORS))})
    for i, ref in enumerate(literal_reference(x[..., :live])):
        got, want = outs[0][f"o{i}"], outs[1][f"o{i}"]
        np.testing.assert_array_equal(got[..., :live].view(np.uint16), ref.view(np.uint16), err_msg=f"o{i}")
        if channels > 1:
            np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16), err_msg=f"o{i}")
            assert not got[..., live:].view(np.uint16).any()  # +0
        else:
            np.testing.assert_array_equal(got[..., :live].view(np.uint16), want[..., :live].view(np.uint16))
    ops = {r.op for r in profile.snapshot()}
    assert PLACED in ops, ops
    assert not [r for r in profile.snapshot() if r.op == PLACED + RAN_ITS_OPS], ops


def test_blocks_of_outputs_with_other_lane_axes_are_placed_together(profiling) -> None:
    """Outputs of different shapes and one block size ([1, 64, 1, 512] and [1, 32, 1, 1024], as a layer
    gradient's dW of several shapes), every lane live: placed in one pass, each output its values."""
    g = Graph("mixed_blocks")
    x, y = g.input("x", [1, 64, 1, 512]), g.input("y", [1, 32, 1, 1024])
    for i, factor in enumerate(FACTORS[:4]):
        g.output(g.mul(x, factor, name=f"sx{i}"), f"a{i}")
        g.output(g.mul(y, factor, name=f"sy{i}"), f"b{i}")
    lowered = lower_graph(g)
    placed = CompiledGraph(lowered, orion.compile(lowered.mil, lowered.weights))
    xv = _x(6, 512)
    yv = np.random.default_rng(7).standard_normal((1, 32, 1, 1024)).astype(np.float16)
    got = placed(x=xv, y=yv)
    for i, factor in enumerate(FACTORS[:4]):
        for name, value in ((f"a{i}", xv), (f"b{i}", yv)):
            np.testing.assert_array_equal(got[name], (value * np.float16(factor)).astype(np.float16), err_msg=name)
    ops = {r.op for r in profile.snapshot()}
    assert PLACED in ops and PLACED + RAN_ITS_OPS not in ops, ops


def test_a_fallback_holds_only_the_intermediates_live_at_once(profiling) -> None:
    """When the placement falls back, each of the ops' intermediates (every one of the packed size) is taken
    from the buffer pool at the op that computes it and given back after its last reader: the pool's peak is
    a few packed sizes, not the 2 x 42 - 2 intermediates of the chain at once; results stay the ops'."""
    from orion._core import kernels

    factors = FACTORS * 6
    lowered = lower_graph(packed_graph(512, factors))
    placed = CompiledGraph(lowered, orion.compile(lowered.mil, lowered.weights))
    twin = CompiledGraph(lowered, orion.compile(unplaced_twin(lowered.mil), lowered.weights, profile="permissive"))
    x = _x(4, 512)
    x.flat[7] = np.float16(np.inf)  # a non-finite block: the placement falls back
    kernels.release_idle_buffers()
    kernels.buffer_pool(reset_peak=True)
    got = placed(x=x)
    peak = kernels.buffer_pool()["peak"]
    packed = 4 * len(factors) * 64 * 512  # one fp32 intermediate of the packed shape
    # the blocks (one packed size in all), the output, and three intermediates (the running sum, the next term,
    # their sum) plus slack: 5.0 x packed; before, every intermediate at once: 85 x packed
    assert peak <= 6 * packed, (peak, packed)
    assert PLACED + RAN_ITS_OPS in {r.op for r in profile.snapshot()}
    want = twin(x=x)
    for i in range(len(factors)):
        np.testing.assert_array_equal(got[f"o{i}"].view(np.uint16), want[f"o{i}"].view(np.uint16), err_msg=f"o{i}")
