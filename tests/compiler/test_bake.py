"""orion.graph.bake: runtime inputs become consts. A baked graph computes what the unbaked one computes with the
same arrays: in float64 numpy (the registry references) to 1e-12 relative (of the largest output for a gradient
that is zero but for rounding); compiled on the emulator in fp16, against
that float64 result and against the unbaked graph on the emulator, within 1% of the output's largest magnitude (or
of 1e-4 of the largest output, for a zero gradient: GPT-2's key bias). A baked weight lowers to a conv, a runtime
one to a matmul, so the fp16 rounding differs (measured: at most 0.2% on the GPT-2 gradient). Covered: a linear
with bias, LayerNorm and RMSNorm parameters, and a whole GPT-2 layer with its gradient graph (baked after the
backward transform, as the training runner does), whose input gradient through a baked weight becomes a conv by
the transposed weight. The original graph is left unchanged; bad inputs raise."""

from __future__ import annotations

import numpy as np
import pytest

from orion import compile_graph
from orion.autodiff import backward, numpy_eval
from orion.autodiff.trainable import input_layout
from orion.compiler import lower_graph
from orion.graph import Graph, GraphError
from orion.graph.bake import bake
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.trainable import GPT2Trainable
from orion.models.gpt2.weights import random_weights

SEQ = 32


def _small() -> Graph:
    g = Graph("small")
    x = g.input("x", [1, 32, 1, SEQ])
    w, b = g.input("w", [1, 48, 1, 32]), g.input("b", [1, 48, 1, 1])
    gamma, beta = g.input("gamma", [1, 48, 1, 1]), g.input("beta", [1, 48, 1, 1])
    h = g.layer_norm(g.linear(x, w, b, name="proj"), gamma, beta, name="ln")
    g.output(g.rms_norm(h, gamma, name="rms"), "y")
    return g


def _small_arrays(rng: np.random.Generator) -> dict[str, np.ndarray]:
    arrays = {"x": rng.standard_normal((1, 32, 1, SEQ)), "w": rng.standard_normal((1, 48, 1, 32)) / 6,
              "b": rng.uniform(-0.5, 0.5, (1, 48, 1, 1)), "gamma": rng.uniform(0.5, 1.5, (1, 48, 1, 1)),
              "beta": rng.uniform(-0.3, 0.3, (1, 48, 1, 1))}
    return {k: v.astype(np.float16).astype(np.float64) for k, v in arrays.items()}


def _gpt2_layer(rng: np.random.Generator) -> tuple[GPT2Trainable, dict[str, np.ndarray]]:
    model = GPT2Trainable(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=SEQ))
    params = model.params(random_weights(model.config, seed=3))
    arrays = {name: input_layout(params[model.layer_param(0, name)]) for name in model.layer_shapes()}
    arrays = {k: v * rng.uniform(0.5, 1.5, v.shape) + (rng.uniform(-0.2, 0.2, v.shape) if v.shape[3] == 1 else 0)
              for k, v in arrays.items()}
    arrays["x"] = rng.standard_normal((1, model.dim, 1, SEQ))
    return model, {k: v.astype(np.float16).astype(np.float64) for k, v in arrays.items()}


def _close_fp16(got: np.ndarray, want: np.ndarray, floor: float, name: str) -> None:
    assert np.abs(got.astype(np.float64) - want).max() <= 1e-2 * max(np.abs(want).max(), floor), name


def _check(graph: Graph, arrays: dict[str, np.ndarray], baked_names: list[str], max_layers: int = 1) -> None:
    baked = bake(graph, {n: arrays[n] for n in baked_names})
    rest = {k: v for k, v in arrays.items() if k not in baked_names}
    assert sorted(n.name for n in baked.inputs) == sorted(rest)
    want = numpy_eval.evaluate(graph, arrays, np.float64)
    got = numpy_eval.evaluate(baked, rest, np.float64)
    assert sorted(got) == sorted(want)
    largest = max(np.abs(w).max() for w in want.values())
    for name in want:  # a gradient that is zero but for float64 rounding (GPT-2's key bias): to the largest output
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12 * largest)
    program = compile_graph(baked, max_layers=max_layers)
    assert sorted(s.name for s in program.layout.inputs) == sorted(rest)
    emulated = program(**rest)
    unbaked = compile_graph(graph, max_layers=max_layers)(**arrays)
    floor = 1e-4 * max(np.abs(w).max() for w in want.values())  # GPT-2's key bias has a zero gradient
    for name in want:
        _close_fp16(emulated[name], want[name], floor, name)
        _close_fp16(emulated[name], unbaked[name].astype(np.float64), floor, name)
    return baked


def test_baked_small_graph_matches_the_unbaked_one() -> None:
    arrays = _small_arrays(np.random.default_rng(0))
    graph = _small()
    before = [(n, n.op, list(n.inputs)) for n in graph.nodes]
    baked = _check(graph, arrays, ["w", "b", "gamma", "beta"])
    assert [(n, n.op, list(n.inputs)) for n in graph.nodes] == before  # the original is untouched
    assert [n.name for n in graph.inputs] == ["x", "w", "b", "gamma", "beta"]
    mil = lower_graph(baked).mil
    assert " conv(" in mil and " matmul(" not in mil  # the baked weight is a conv weight (ANE-32)
    _check(graph, arrays, ["gamma"])  # a partial bake: the weight stays a runtime input


def test_baked_gpt2_layer_and_gradient_match_the_unbaked_ones() -> None:
    rng = np.random.default_rng(1)
    model, arrays = _gpt2_layer(rng)
    params = list(model.layer_shapes())
    layer = model.layer_graph(SEQ)
    _check(layer, arrays, params)
    gradient = backward(layer, ["x", *params])
    cotangent = rng.uniform(-1, 1, (1, model.dim, 1, SEQ)).astype(np.float16).astype(np.float64)
    baked = _check(gradient, {**arrays, "grad_y": cotangent}, params)
    assert list(baked.outputs) == list(gradient.outputs)  # dW of every baked weight is still computed


def test_the_input_gradient_through_a_baked_weight_is_a_conv_by_its_transpose() -> None:
    rng = np.random.default_rng(2)
    arrays = _small_arrays(rng)
    gradient = backward(_small(), ["x"])
    assert " matmul(" in lower_graph(gradient).mil  # the transform's dx = W^T dy through the runtime weight
    cotangent = rng.uniform(-1, 1, (1, 48, 1, SEQ)).astype(np.float16).astype(np.float64)
    baked = _check(gradient, {**arrays, "grad_y": cotangent}, ["w", "b", "gamma", "beta"])
    mil = lower_graph(baked).mil
    assert " matmul(" not in mil and mil.count(" conv(") == 2  # the forward's linear and dx, both convs


def test_bad_names_shapes_and_values_are_refused() -> None:
    graph = _small()
    with pytest.raises(GraphError, match=r"no input 'v'.*\['b', 'beta', 'gamma', 'w', 'x'\].*Fix"):
        bake(graph, {"v": np.zeros((1, 48, 1, 32))})
    with pytest.raises(GraphError, match=r"input 'w' of graph 'small' is \[1, 48, 1, 32\].*\[48, 32\].*Fix"):
        bake(graph, {"w": np.zeros((48, 32))})
    with pytest.raises(Exception, match="ANE-25"):
        bake(graph, {"w": np.full((1, 48, 1, 32), 1e6)})
