"""Weights as program inputs: ``linear`` with a runtime ``[1, Cout, 1, Cin]`` weight lowers to one matmul (a conv
weight must be const, ANE-32), computes W x + b, and a new weight changes the outputs without a compile."""

from __future__ import annotations

import re

import numpy as np
import pytest

from orion import Graph, compile_count, compile_graph
from orion.compiler import lower_graph
from orion.errors import ConstraintError
from orion.graph import GraphError


def _graph() -> Graph:
    g = Graph("dyn_linear")
    x = g.input("x", [1, 64, 1, 32])
    g.output(g.linear(x, g.input("w", [1, 48, 1, 64]), g.input("b", [1, 48, 1, 1]), name="proj"), "y")
    return g


def test_runtime_weight_lowers_to_matmul_not_conv() -> None:
    ops = re.findall(r"=\s*([a-z_]+)\(", lower_graph(_graph()).mil)
    assert "matmul" in ops and "conv" not in ops


def test_new_weights_take_effect_without_a_compile() -> None:
    rng = np.random.default_rng(0)
    compiled = compile_graph(_graph())
    before = compile_count()
    x = rng.standard_normal((1, 64, 1, 32)).astype(np.float16)
    for seed in (1, 2):
        w = np.random.default_rng(seed).standard_normal((48, 64)).astype(np.float16) / 8
        b = np.random.default_rng(seed + 10).standard_normal(48).astype(np.float16)
        y = compiled(x=x, w=w.reshape(1, 48, 1, 64), b=b.reshape(1, 48, 1, 1))["y"]
        want = np.einsum("oc,cs->os", w.astype(np.float64), x[0, :, 0].astype(np.float64)) + b[:, None]
        np.testing.assert_allclose(y[0, :, 0], want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    assert compile_count() == before


def test_runtime_weight_in_another_layout_or_bias_shape_is_refused() -> None:
    g = Graph("bad")
    x = g.input("x", [1, 64, 1, 32])
    with pytest.raises(ConstraintError, match=r"ANE-32|'proj'.*\[1, Cout, 1, Cin\]"):
        g.linear(x, g.reshape(g.input("w", [1, 64, 1, 64]), [64, 64]), name="proj")
    with pytest.raises(GraphError, match=r"bias shape \[48\].*Fix"):
        g.linear(x, g.input("w2", [1, 48, 1, 64]), g.reshape(g.input("b", [1, 48, 1, 1]), [48]), name="proj2")
