"""The emulator's fused causal attention (csrc/emulator/causal_attention.h): the chain matmul -> [mul] ->
add(causal mask) -> softmax -> matmul runs as one kernel that skips the work above the diagonal.

It must compute exactly what the five ops do. The unfused twin is the same MIL with the softmax output
also returned (an intermediate something else reads is never fused); both are compared bit for bit
(an exact zero's sign aside), and against a float64 numpy reference."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from orion._core import kernels
from orion.graph import Graph
from orion.runtime import profile
from support.attention import twins
from support.twins import RAN_ITS_OPS, kernel_calls, stage_twins

FUSED = "attention (causal, fused)"


def gpt2_attention(seq: int, heads: int, d: int) -> Graph:
    """The graph op GPT-2 uses: legalized to matmul -> mul(scale) -> add(mask) -> softmax -> matmul."""
    g = Graph("attn")
    q, k, v = (g.input(n, [1, heads * d, 1, seq]) for n in "qkv")
    g.output(g.attention(q, k, v, heads, causal=True, name="core"), "y")
    return g


def llama_attention(seq: int, groups: int, d: int) -> Graph:
    """Llama's form (models/llama/graphs.py): q pre-scaled, no mul, a shared [1, 1, S, S] mask."""
    g = Graph("gqa")
    q, k, v = (g.reshape(g.input(n, [1, groups * d, 1, seq]), [1, groups, d, seq]) for n in "qkv")
    mask = g.const("causal_mask", (np.triu(np.ones((seq, seq)), k=1) * -65504.0).reshape(1, 1, seq, seq))
    probs = g.softmax(g.add(g.matmul(q, k, transpose_x=True), mask), axis=-1)
    g.output(g.reshape(g.matmul(v, probs, transpose_y=True), [1, groups * d, 1, seq]), "y")
    return g


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """float64 causal softmax attention of [B, D, S] operands: [B, Dv, S]."""
    scores = np.einsum("bdi,bdj->bij", q, k) * scale
    scores = np.where(np.triu(np.ones(scores.shape[-2:], bool), k=1), -np.inf, scores)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bdj,bij->bdi", v, p)


def run_both(graph: Graph, amplitude: float = 1.0, seed: int = 0) -> tuple[dict, np.ndarray, np.ndarray]:
    """Random inputs by graph name, and output "y" of the program and of its twin."""
    fused, unfused = twins(graph)
    rng = np.random.default_rng(seed)
    xs = {s.name: (rng.standard_normal(s.shape) * amplitude).astype(np.float16) for s in fused.layout.inputs}
    return xs, fused(**xs)["y"], unfused(**xs)["y"]


@pytest.mark.parametrize("seq, heads, d", [(64, 2, 64), (256, 3, 32), (512, 2, 16)])
def test_gpt2_attention_fused_is_the_unfused_ops_bit_for_bit_and_matches_float64(profiling, seq, heads, d) -> None:
    xs, y, unfused = run_both(gpt2_attention(seq, heads, d))
    assert np.array_equal(y, unfused)  # -0 == +0: an exact zero's sign is the one freedom
    assert [r.op for r in profile.snapshot() if r.op == FUSED] == [FUSED]  # fused in one program, not the twin
    q, k, v = (xs[n].astype(np.float64).reshape(heads, d, seq) for n in "qkv")
    want = reference(q, k, v, 1 / np.sqrt(d)).reshape(y.shape)
    np.testing.assert_allclose(y.astype(np.float64), want, atol=2e-2 * np.abs(want).max())  # fp16 rounding per op


def test_llama_form_without_a_scale_is_fused_and_exact(profiling) -> None:
    xs, fused, unfused = run_both(llama_attention(128, 2, 64))
    assert np.array_equal(fused, unfused)
    assert any(r.op == FUSED for r in profile.snapshot())
    q, k, v = (xs[n].astype(np.float64).reshape(2, 64, 128) for n in "qkv")
    want = reference(q, k, v, 1.0).reshape(fused.shape)
    np.testing.assert_allclose(fused.astype(np.float64), want, atol=2e-2 * np.abs(want).max())


@pytest.mark.parametrize("amplitude", [40.0, 300.0])
def test_scores_too_large_for_the_exactness_bound_take_the_unfused_path(profiling, amplitude) -> None:
    """At 40 the scores pass 16384 (no fused shortcut is exact there), at 300 they overflow fp16 and the
    rows turn to NaN: both must be what the five ops compute, NaN for NaN (the profile shows the group ran them)."""
    _, fused, unfused = run_both(gpt2_attention(128, 2, 64), amplitude)
    np.testing.assert_array_equal(fused, unfused)  # NaN in the same places
    assert np.isnan(fused).any() == (amplitude > 100)
    assert [r.op for r in profile.snapshot() if r.op.startswith(FUSED)] == [FUSED + RAN_ITS_OPS]


@pytest.mark.parametrize("live", [1, 100, 128, 200])
def test_live_lanes_compute_only_the_live_queries_fused(live) -> None:
    """A prompt shorter than its bucket hints its live lanes (q, k, v: the tokens; the rest are dead queries
    and keys). The kernel stays fused: no [B, S, S] intermediate of the five ops is taken from the frame pool,
    and the live lanes equal the five ops' bit for bit, with NaN in the surfaces' dead lanes."""
    seq, heads, d = 256, 2, 32
    fused, unfused = twins(gpt2_attention(seq, heads, d), surface_counts=(16, 16), min_surface_bytes=0)  # q, k, v: hinted by name
    rng = np.random.default_rng(live)
    results = []
    for compiled in (fused, unfused):
        program = compiled.program
        ins, outs = program.allocate_surfaces()
        names = {}
        for name, spec in program.inputs.items():
            x = rng.standard_normal(spec.shape).astype(np.float16)
            x[..., live:] = np.nan  # dead lanes: never read into a live lane
            ins[name].write(x)
            names[name] = live
        kernels.buffer_pool(reset_peak=True)
        program.evaluate(ins, outs, live_lanes=names)
        results.append((outs[fused.layout.outputs[0].mil_name].read()[..., :live], kernels.buffer_pool()["peak"]))
        rng = np.random.default_rng(live)  # the twin reads the same inputs
    (y, fused_peak), (want, unfused_peak) = results
    assert np.array_equal(y, want) and not np.isnan(y).any()
    scores = 4 * heads * seq * seq  # one fp32 [B, S, S] tensor, on top of the q, k, v and output the fused kernel holds
    assert fused_peak + scores <= unfused_peak, (fused_peak, unfused_peak)


def test_a_mask_that_is_not_causal_is_not_fused(profiling) -> None:
    g = Graph("band")
    q, k, v = (g.reshape(g.input(n, [1, 128, 1, 64]), [1, 2, 64, 64]) for n in "qkv")
    band = np.triu(np.ones((64, 64)), k=1) * -65504.0
    band[5, 3] = -65504.0  # one masked entry below the diagonal
    probs = g.softmax(g.add(g.matmul(q, k, transpose_x=True), g.const("m", band.reshape(1, 1, 64, 64))), axis=-1)
    g.output(g.reshape(g.matmul(v, probs, transpose_y=True), [1, 128, 1, 64]), "y")
    _, fused, unfused = run_both(g)
    assert np.array_equal(fused, unfused)
    assert not any(r.op == FUSED for r in profile.snapshot())


def test_fusion_keeps_the_intermediates_out_of_the_frame() -> None:
    """The [B, S, S] scores, scaled, masked and probability tensors are never allocated: a 12-head 1024
    attention grows the peak RSS by far less than the two 48 MiB ones live at once unfused (here in a
    fresh interpreter, so the peak is this program's)."""
    code = textwrap.dedent("""
        import resource, numpy as np, orion
        from orion.compiler import CompiledGraph, lower_graph
        from orion.graph import Graph
        g = Graph("attn")
        q, k, v = (g.input(n, [1, 768, 1, 1024]) for n in "qkv")
        g.output(g.attention(q, k, v, 12, causal=True), "y")
        lowered = lower_graph(g)
        p = orion.compile(lowered.mil, lowered.weights)
        xs = {n: (np.random.default_rng(0).standard_normal(s.shape) * 0.5).astype(s.dtype) for n, s in p.inputs.items()}
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        p(**xs)
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
    """)
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout.split()[-1]) < 40, f"the attention grew the peak RSS by {result.stdout.strip()} MiB"


PROBABILITIES = "attention probabilities (causal, fused)"


def recomputed_probabilities(seq: int, heads: int, d: int) -> Graph:
    """A layer gradient's recomputed attention probabilities (the autodiff transform's form of GPT-2's attention): the
    chain matmul -> mul(scale) -> add(causal mask) -> softmax, whose probabilities more than one op reads (here the
    context matmul and the output "p")."""
    g = Graph("probs")
    q, k, v = (g.reshape(g.input(n, [1, heads * d, 1, seq]), [1, heads, d, seq]) for n in "qkv")
    mask = g.const("causal_mask", (np.triu(np.ones((seq, seq)), k=1) * -65504.0).reshape(1, 1, seq, seq))
    scores = g.matmul(q, k, transpose_x=True, name="attn_scores")
    probs = g.softmax(g.add(g.mul(scores, float(1 / np.sqrt(d))), mask), axis=-1)
    g.output(g.reshape(g.matmul(v, probs, transpose_y=True), [1, heads * d, 1, seq]), "y")
    g.output(g.reshape(probs, [1, heads * seq, 1, seq]), "p")
    return g


@pytest.mark.parametrize("seq, heads, d, amplitude", [(64, 2, 16, 1.0), (256, 12, 64, 1.0), (256, 2, 64, 40.0)])
def test_recomputed_probabilities_are_the_ops_bit_for_bit(seq, heads, d, amplitude) -> None:
    """The probabilities chain runs as one kernel (its scores over the lower blocks only, exact zeros above the
    diagonal), exactly what its four ops compute (the twin: the scores also returned, so nothing fuses; -0 == +0),
    at a small shape, a Stories110M layer gradient's 12 heads of 256 and large scores (amplitude 40: the bound check
    fails and the kernel falls back to the ops); and against float64 softmax within fp16
    rounding."""
    fused, unfused = stage_twins(recomputed_probabilities(seq, heads, d), "matmul", "_scores")
    rng = np.random.default_rng(seq + heads)
    xs = {n: (rng.standard_normal((1, heads * d, 1, seq)) * amplitude).astype(np.float16) for n in "qkv"}
    outs = []
    for stage in (fused, unfused):
        for name, value in xs.items():
            stage.input(name)[...] = value
        ops = kernel_calls(stage)
        assert (PROBABILITIES in ops or PROBABILITIES + RAN_ITS_OPS in ops) == (stage is fused), ops
        if stage is fused:  # the kernel ran, or (amplitude 40: scores beyond the bound) fell back to the ops
            assert (PROBABILITIES + RAN_ITS_OPS in ops) == (amplitude > 1.0), ops
        outs.append((stage.output("p").copy(), stage.output("y").copy()))
    for fused_out, unfused_out in zip(*outs, strict=True):
        assert np.array_equal(fused_out, unfused_out, equal_nan=True)
    if amplitude == 1.0:
        q, k = (xs[n].astype(np.float64).reshape(heads, d, seq) for n in "qk")
        scores = np.einsum("bdi,bdj->bij", q, k) / np.sqrt(d)
        scores = np.where(np.triu(np.ones((seq, seq), bool), k=1), -np.inf, scores)
        want = np.exp(scores - scores.max(-1, keepdims=True))
        want /= want.sum(-1, keepdims=True)
        np.testing.assert_allclose(outs[0][0].astype(np.float64).reshape(heads, seq, seq), want, rtol=0, atol=2e-3)
