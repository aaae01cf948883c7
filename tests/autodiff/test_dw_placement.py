"""Weight gradients placed on the CPU (``partition(..., dw="cpu")``, the public trainers' split): the ANE
gradient program returns each linear's input and output cotangent in fp16 and the CPU forms ``dy x^T`` in
fp32. Checked against the float64 numpy gradient of the same layer graph (cosine >= 0.9999 per tensor) and
against the ``dw="ane"`` plan, on tiny GPT-2 and Llama models."""

from __future__ import annotations

import numpy as np
import pytest

from orion.autodiff import numpy_eval
from orion.autodiff.partition import partition, program_outputs
from orion.autodiff.runner import GradientRunner
from orion.autodiff.transform import backward, grad_name
from orion.errors import OrionError
from orion.models.gpt2 import weights as gpt2_weights
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.trainable import GPT2Trainable
from orion.models.llama import weights as llama_weights
from orion.models.llama.config import LlamaConfig
from orion.models.llama.trainable import LlamaTrainable

SEQ = 32


def _model(kind: str):
    if kind == "gpt2":
        config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=64, n_positions=SEQ)
        return GPT2Trainable(config), gpt2_weights.random_weights(config, seed=5)
    config = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=64,
                         max_position_embeddings=SEQ)
    return LlamaTrainable(config), llama_weights.random_weights(config, seed=5)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_cpu_weight_gradients_match_float64(kind: str) -> None:
    model, weights = _model(kind)
    params = model.params(weights)
    matrices = [n for n, s in model.layer_shapes().items() if len(s) == 2]
    plan = partition(model, SEQ, prefer="ane", dw="cpu")
    (program,) = plan.gradients
    assert program.device == "ane" and sorted(t.param for t in program.cpu_dw) == sorted(matrices)
    assert not any(grad_name(n) in program.graph.outputs for n in matrices)  # no dW is formed in the program
    assert sorted(program_outputs(program)) == sorted(["x", *model.layer_shapes()])
    rng = np.random.default_rng(3)
    ids, targets = rng.integers(0, model.vocab_size, SEQ), rng.integers(0, model.vocab_size, SEQ)
    _, on_cpu = GradientRunner(model, SEQ, plan, trainable=None).loss_and_grads(params, ids, targets, loss_scale=256.0)
    _, on_ane = GradientRunner(model, SEQ, prefer="ane", dw="ane").loss_and_grads(params, ids, targets,
                                                                                   loss_scale=256.0)
    # float64 reference of the last layer's gradient, from the fp32 CPU forward of the same parameters
    _, _, reference = _float64_last_layer(model, params, ids, targets)
    last = model.n_layers - 1
    for name in matrices:  # the weight gradients the placement moves
        full = model.layer_param(last, name)
        assert _cosine(on_cpu[full], reference[name]) >= 0.9999, name
        assert _cosine(on_ane[full], reference[name]) >= 0.999, name


def _float64_last_layer(model, params, ids, targets):
    p64 = {k: v.astype(np.float64) for k, v in params.items()}
    layer = model.layer_graph(SEQ)
    x = model.embed(p64, ids).astype(np.float64)
    arrays = None
    for i in range(model.n_layers):
        arrays = {"x": np.ascontiguousarray(x.T).reshape(1, -1, 1, SEQ), **model.layer_inputs(p64, i)}
        x = numpy_eval.evaluate(layer, arrays, np.float64)["y"][0, :, 0, :].T
    loss, dx, _ = model.head(p64, x, targets)
    grads = numpy_eval.evaluate(backward(layer, ["x", *model.layer_shapes()]),
                                {**arrays, grad_name("y"): np.asarray(dx, np.float64).T.reshape(1, -1, 1, SEQ)},
                                np.float64)
    return loss, dx, {n: grads[grad_name(n)] for n in model.layer_shapes()}


def test_bad_placement_is_an_error() -> None:
    model, _ = _model("llama")
    with pytest.raises(OrionError, match="dw='gpu'.*'ane', 'cpu'"):
        partition(model, SEQ, dw="gpu")
