"""Whole-layer gradient programs (a GPT-2 block, a Llama block with grouped-query attention; tiny dims),
compiled and run on the emulator in fp16, against the same gradient graph evaluated in float64 numpy, and
that float64 gradient against central finite differences of the layer's forward graph.

fp16 tolerance: per tensor, the largest error is at most 1% of the tensor's largest magnitude and the
relative L2 error at most 0.5% (measured: about 0.2% and 0.1%); a tensor whose true gradient is zero
(GPT-2's key bias) is held to 1e-4 of the largest gradient magnitude instead.
"""

from __future__ import annotations

import numpy as np
import pytest

from orion import compile_graph
from orion.autodiff import backward, grad_name, numpy_eval
from orion.autodiff.trainable import input_layout
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.trainable import GPT2Trainable
from orion.models.gpt2.weights import random_weights as gpt2_random
from orion.models.llama.config import LlamaConfig
from orion.models.llama.trainable import LlamaTrainable
from orion.models.llama.weights import random_weights as llama_random

SEQ = 32


def _gpt2():
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=SEQ)
    return GPT2Trainable(config), gpt2_random(config, seed=1)


def _llama():
    config = LlamaConfig(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, hidden_dim=64, vocab_size=64,
                         max_position_embeddings=SEQ)
    return LlamaTrainable(config), llama_random(config, seed=1)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def layer(request):
    model, weights = (_gpt2 if request.param == "gpt2" else _llama)()
    rng = np.random.default_rng(2)
    params = model.params(weights)
    inputs = {name: input_layout(params[model.layer_param(0, name)]) for name in model.layer_shapes()}
    for name, value in inputs.items():  # move norm gains off 1 and biases off 0, vary the weights
        offset = rng.uniform(-0.2, 0.2, value.shape) if value.shape[3] == 1 else 0.0
        inputs[name] = value * rng.uniform(0.5, 1.5, value.shape) + offset
    inputs["x"] = rng.standard_normal((1, model.dim, 1, SEQ))
    inputs = {k: v.astype(np.float16).astype(np.float64) for k, v in inputs.items()}
    graph = model.layer_graph(SEQ)
    r = rng.uniform(-1, 1, (1, model.dim, 1, SEQ)).astype(np.float16).astype(np.float64)
    grad_graph = backward(graph, ["x", *model.layer_shapes()])
    exact = numpy_eval.evaluate(grad_graph, {**inputs, grad_name("y"): r}, np.float64)
    return model, graph, grad_graph, inputs, r, exact


def test_fp16_program_matches_float64(layer) -> None:
    model, _, grad_graph, inputs, r, exact = layer
    got = compile_graph(grad_graph, max_layers=model.attention_per_layer)(**inputs, grad_y=r)
    floor = 1e-4 * max(np.abs(w).max() for w in exact.values())  # for GPT-2's key bias, whose gradient is 0
    for name, want in exact.items():
        err = got[name].astype(np.float64) - want
        assert np.abs(err).max() <= 1e-2 * max(np.abs(want).max(), floor), name
        assert np.linalg.norm(err) <= 5e-3 * max(np.linalg.norm(want), floor * np.sqrt(want.size)), name


def test_float64_gradient_matches_finite_differences(layer) -> None:
    model, graph, _, inputs, r, exact = layer
    rng = np.random.default_rng(9)
    scale = max(np.linalg.norm(g) for g in exact.values())  # GPT-2's key bias has a zero gradient
    for name in ["x", *model.layer_shapes()]:
        direction = rng.standard_normal(inputs[name].shape)
        eps = 1e-5 * max(1.0, np.abs(inputs[name]).max())
        losses = []
        for sign in (1, -1):
            moved = {**inputs, name: inputs[name] + sign * eps * direction}
            losses.append(float((numpy_eval.evaluate(graph, moved, np.float64)["y"] * r).sum()))
        fd = (losses[0] - losses[1]) / (2 * eps)
        analytic = float((exact[grad_name(name)] * direction).sum())
        assert fd == pytest.approx(analytic, rel=1e-5, abs=1e-8 * scale), name


def test_inference_graph_with_baked_weights_differentiates_in_its_activations() -> None:
    """GPT-2's prefill graph (const weights, outputs x and the layer's k/v) w.r.t. its input only: the shape of
    a frozen base model under adapters. Same tolerances as above."""
    from orion.models.gpt2.graphs import prefill_graph

    model, weights = _gpt2()
    graph = prefill_graph(model.config, weights, range(1), SEQ)
    grad_graph = backward(graph, ["x"])
    rng = np.random.default_rng(4)
    arrays = {n.name: rng.standard_normal(n.shape).astype(np.float16).astype(np.float64) for n in grad_graph.inputs}
    exact = numpy_eval.evaluate(grad_graph, arrays, np.float64)["grad_x"]
    got = compile_graph(grad_graph)(**arrays)["grad_x"].astype(np.float64)
    assert np.linalg.norm(got - exact) <= 5e-3 * np.linalg.norm(exact)
    direction, eps = rng.standard_normal(exact.shape), 1e-5
    cotangents = {out: arrays[grad_name(out)] for out in graph.outputs}

    def loss(x: np.ndarray) -> float:
        outs = numpy_eval.evaluate(graph, {"x": x}, np.float64)
        return sum(float((outs[k] * cotangents[k]).sum()) for k in outs)

    fd = (loss(arrays["x"] + eps * direction) - loss(arrays["x"] - eps * direction)) / (2 * eps)
    assert fd == pytest.approx(float((exact * direction).sum()), rel=1e-5)
