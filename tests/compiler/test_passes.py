"""Each pass's effect on a small graph, and the pipeline reaching a fixed point."""

from __future__ import annotations

import numpy as np
import pytest

import orion
from orion.graph import Graph
from orion.graph.ir import GraphError
from orion.legalize import legalize, prepare_io
from orion.passes import (
    ONCE,
    OPTIMIZATIONS,
    PassContext,
    cast_fusion,
    dce,
    identity,
    io_padding,
    run_pipeline,
    sram,
)
from orion.passes.io_padding import padded_shape


def prepared(g: Graph, io_dtype: str = "fp16") -> tuple[Graph, PassContext]:
    legal = legalize(g)
    return legal, PassContext(prepare_io(legal, io_dtype))


def test_dce_removes_unused_nodes_keeps_inputs() -> None:
    g = Graph("dce")
    x, _ = g.input("x", [1, 64, 1, 32]), g.input("unused", [1, 64, 1, 32])
    g.exp(x, name="dead")
    g.output(g.relu(x), "y")
    legal, ctx = prepared(g)
    assert dce.run(legal, ctx) == ["removed dead (exp)"]
    assert [n.op for n in legal.nodes] == ["input", "input", "relu"]
    assert dce.run(legal, ctx) == []


def test_identity_elimination() -> None:
    g = Graph("ident")
    x = g.input("x", [1, 64, 1, 32])
    g.output(g.relu(g.identity(g.identity(x))), "y")
    legal, ctx = prepared(g)
    assert len(identity.run(legal, ctx)) == 2
    relu = next(n for n in legal.nodes if n.op == "relu")
    assert relu.inputs == legal.inputs and "identity" not in {n.op for n in legal.nodes}


def test_cast_fusion_leaves_no_cast_pairs() -> None:
    g = Graph("casts")
    x = g.input("x", [1, 64, 1, 32])
    g.output(g.relu(g.cast(g.cast(x, "fp32"), "fp16")), "y")
    g.output(g.cast(g.cast(g.relu(x), "fp32"), "fp32"), "z")
    legal, ctx = prepared(g, "fp32")
    report = run_pipeline(legal, ctx)
    casts = [n for n in legal.nodes if n.op == "cast"]
    assert not any(c.inputs[0].op == "cast" for c in casts)
    assert all(c.inputs[0].dtype != c.dtype for c in casts)
    assert report.changes(cast_fusion.NAME)


def test_io_padding_min_size_and_lanes() -> None:
    """ANE-12: every I/O tensor is padded to at least 49,152 bytes."""
    assert padded_shape((1, 768, 1, 1), "fp16", "x") == (1, 32, 1, 768)  # packed at the front, 49,152 bytes
    assert padded_shape((1, 768, 1, 1), "fp32", "x") == (1, 16, 1, 768)
    assert padded_shape((1, 4096, 1, 1), "fp16", "x") == (1, 6, 1, 4096)
    assert padded_shape((1, 8, 1, 16), "fp16", "x") == (1, 192, 1, 128)
    assert padded_shape((1, 64, 1, 1024), "fp16", "x") == (1, 64, 1, 1024)  # already large enough
    assert padded_shape((1, 768, 1, 32), "fp16", "x") == (1, 768, 1, 32)


def test_io_padding_lanes() -> None:
    """ANE-14: every I/O tensor has at least 32 lanes (16 for fp32)."""
    for shape, dtype in [((1, 4096, 1, 4), "fp16"), ((1, 4096, 1, 4), "fp32")]:
        assert padded_shape(shape, dtype, "x")[3] >= io_padding.MIN_LANES[dtype]
    with pytest.raises(GraphError, match="cannot make the 32 lanes"):
        padded_shape((1, 4, 1, 4), "fp16", "input 'tiny'")


def test_io_padding_pass_records_layout_and_is_idempotent() -> None:
    g = Graph("pad")
    x, m = g.input("x", [1, 64, 1, 8]), g.input("m", [1, 128, 1, 8])
    g.output(g.relu(x), "y")
    g.output(g.exp(m), "z")
    legal, ctx = prepared(g)
    changes = io_padding.run(legal, ctx)
    assert len(changes) == 4
    assert [s.padded for s in ctx.layout.inputs] == [(1, 48, 1, 512), (1, 24, 1, 1024)]
    assert [s.padded for s in ctx.layout.outputs] == [(1, 48, 1, 512), (1, 24, 1, 1024)]
    assert [n.shape for n in legal.inputs] == [s.padded for s in ctx.layout.inputs]
    assert all(legal.outputs[s.mil_name].shape == s.padded for s in ctx.layout.outputs)
    assert io_padding.run(legal, ctx) == []


def test_padded_outputs_chain_into_padded_inputs() -> None:
    """A padded output's surface feeds the next program's padded input unchanged (data packed at the front)."""
    first, second = Graph("first"), Graph("second")
    first.output(first.relu(first.input("x", [1, 64, 1, 8])), "y")
    second.output(second.exp(second.input("y", [1, 64, 1, 8])), "z")
    a, b = orion.compile_graph(first), orion.compile_graph(second)
    (x_in,), (y_out,) = a.layout.inputs, a.layout.outputs
    (y_in,), (z_out,) = b.layout.inputs, b.layout.outputs
    assert y_out.padded == y_in.padded
    ins, outs = a.program.allocate_surfaces()
    xv = np.random.default_rng(1).standard_normal((1, 64, 1, 8)).astype(np.float16)
    ins[x_in.mil_name].array.reshape(-1)[: xv.size] = xv.reshape(-1)
    a.program.evaluate(ins, outs)
    chained = b.program(**{y_in.mil_name: outs[y_out.mil_name].array})
    z = chained[z_out.mil_name].reshape(-1)[: xv.size].reshape(xv.shape)
    np.testing.assert_allclose(z, np.exp(np.maximum(xv.astype(np.float32), 0)), rtol=2e-3)


def test_io_padding_leaves_uniform_sizes_to_the_surfaces() -> None:
    """ANE-13: all input (and all output) surfaces get one size."""
    g = Graph("mixed")
    a, b = g.input("a", [1, 997, 1, 64]), g.input("b", [1, 1009, 1, 1])
    g.output(g.relu(a), "ra")
    g.output(g.exp(b), "eb")
    compiled = orion.compile_graph(g)
    ins, outs = compiled.program.allocate_surfaces()
    assert len({s.nbytes for s in ins.values()}) == 1 and len({s.nbytes for s in outs.values()}) == 1
    rng = np.random.default_rng(0)
    av, bv = rng.standard_normal((1, 997, 1, 64)), rng.standard_normal((1, 1009, 1, 1))
    out = compiled(a=av, b=bv)
    np.testing.assert_allclose(out["ra"], np.maximum(av, 0), atol=2e-3)
    np.testing.assert_allclose(out["eb"], np.exp(bv), rtol=2e-3)


def test_sram_under_budget() -> None:
    """ANE-28: the report gives the per-evaluate dispatch cost."""
    g = Graph("small")
    g.output(g.linear(g.input("x", [1, 64, 1, 32]), np.zeros((64, 64))), "y")
    legal, ctx = prepared(g)
    assert sram.run(legal, ctx) == []
    report = ctx.analyses[sram.NAME]
    assert report.weight_bytes == 64 * 64 * 2 and not report.over_budget
    assert "0.095 ms" in str(report)


def test_sram_over_budget_warns_with_split_hint() -> None:
    """ANE-26: over the SRAM budget, a warning suggests a split."""
    g = Graph("big")
    x = g.input("x", [1, 2048, 1, 32])
    for i in range(5):  # 5 x 8 MB of fp16 weights
        x = g.linear(x, np.zeros((2048, 2048)), name=f"fc{i}")
    g.output(x, "y")
    legal, ctx = prepared(g)
    with pytest.warns(sram.SRAMBudgetWarning, match="split into >= 2 programs"):
        sram.run(legal, ctx)
    assert ctx.analyses[sram.NAME].over_budget


def test_sram_reports_const_matmul() -> None:
    g = Graph("mm")
    g.output(g.matmul(g.input("x", [1, 64, 1, 32]), np.zeros((32, 32)), name="slow"), "y")
    legal, ctx = prepared(g)
    sram.run(legal, ctx)
    assert ctx.analyses[sram.NAME].const_matmuls == ("slow",)
    assert "ANE-27" in str(ctx.analyses[sram.NAME])


def test_pipeline_reaches_fixed_point_and_reports() -> None:
    g = Graph("pipe")
    x = g.input("x", [1, 64, 1, 8])
    g.exp(x, name="dead")
    g.output(g.cast(g.cast(g.identity(g.relu(x)), "fp32"), "fp16"), "y")
    legal, ctx = prepared(g)
    report = run_pipeline(legal, ctx)
    assert report.fixed_point and report.iterations >= 2
    last = [r for r in report.runs if r.iteration == report.iterations]
    assert [r.name for r in last] == [name for name, _ in OPTIMIZATIONS] and not any(r.changes for r in last)
    assert report.changes(dce.NAME) and report.changes(identity.NAME) and report.changes(io_padding.NAME)
    once = [(r.name, r.iteration) for r in report.runs[-2:]]
    assert once == [(io_padding.NAME, ONCE), (sram.NAME, ONCE)]  # after the fixed point, exactly once
    assert [r.name for r in report.runs].count(io_padding.NAME) == 1
    text = str(report)
    assert "fixed point: True" in text and "removed dead" in text
    again = run_pipeline(legal, ctx)
    assert again.iterations == 1 and again.fixed_point
