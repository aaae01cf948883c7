"""LoRA stays differentiable: ``orion.autodiff.backward`` of an adapted GPT-2 / Llama prefill graph with respect
to the A/B inputs matches central finite differences of the forward graph (both evaluated in float64 numpy by
the registry's references). Tolerance: 1e-6 relative to the largest gradient entry."""

from __future__ import annotations

import numpy as np
import pytest

from orion.autodiff import backward, numpy_eval
from orion.lora.graph import a_input, b_input
from orion.models.gpt2 import graphs as gpt2_graphs
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.weights import random_weights as gpt2_weights
from orion.models.llama import graphs as llama_graphs
from orion.models.llama.config import LlamaConfig
from orion.models.llama.weights import random_weights as llama_weights

GPT2_CONFIG = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=32, vocab_size=64)
LLAMA_CONFIG = LlamaConfig(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, hidden_dim=48, vocab_size=64,
                           max_position_embeddings=32)


def graphs():
    yield "gpt2_fc", gpt2_graphs.prefill_graph(GPT2_CONFIG, gpt2_weights(GPT2_CONFIG, 0), range(1), 32,
                                               {"h0_mlp_fc": 2}), "h0_mlp_fc", 1
    # the last linear of the layer: the inference graph's RMSNorm (max-based, exact in fp16) has no gradient rule,
    # so an adapter upstream of a norm is differentiated on the training layers (orion.autodiff's own graphs)
    yield "llama_down", llama_graphs.prefill_graph(LLAMA_CONFIG, llama_weights(LLAMA_CONFIG, 0), range(1), 32,
                                                   {"l0_down": 2}), "l0_down", 1


@pytest.mark.parametrize("name,graph,site,pieces", list(graphs()), ids=[c[0] for c in graphs()])
def test_backward_through_the_adapter_inputs_matches_finite_differences(name, graph, site, pieces) -> None:
    rng = np.random.default_rng(1)
    inputs = {n.name: rng.normal(0, 0.5, n.shape) for n in graph.inputs}
    wrt = [a_input(site, j) for j in range(pieces)] + [b_input(site)]
    grad_graph = backward(graph, wrt)
    cotangent = {f"grad_{o}": rng.normal(0, 1, graph.outputs[o].shape) for o in graph.outputs}
    feeds = inputs | {k: v for k, v in cotangent.items() if k in {n.name for n in grad_graph.inputs}}
    grads = numpy_eval.evaluate(grad_graph, feeds, np.float64)

    def loss(values: dict[str, np.ndarray]) -> float:
        out = numpy_eval.evaluate(graph, values, np.float64)
        return sum(float((out[o] * cotangent[f"grad_{o}"]).sum()) for o in graph.outputs)

    for w in wrt:
        got = grads[f"grad_{w}"]
        assert np.abs(got).max() > 0
        for index in [tuple(rng.integers(0, d) for d in got.shape) for _ in range(4)]:
            step = 1e-5
            plus, minus = dict(inputs), dict(inputs)
            plus[w], minus[w] = inputs[w].copy(), inputs[w].copy()
            plus[w][index] += step
            minus[w][index] -= step
            numeric = (loss(plus) - loss(minus)) / (2 * step)
            assert abs(got[index] - numeric) <= 1e-6 * np.abs(got).max() + 1e-7, (w, index)
