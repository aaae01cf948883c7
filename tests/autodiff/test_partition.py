"""The partitioner's decisions for GPT-2 small and Stories110M (seq 256), its FLOP accounting against the
analytic formula, the dx/dW split under a small SRAM budget (run and compared with the unsplit plan) and
the cost model's "does not pay" for a tiny model."""

from __future__ import annotations

import numpy as np
import pytest

from orion import compile_count
from orion.autodiff.partition import ANE, CPU, partition
from orion.autodiff.runner import GradientRunner
from orion.errors import OrionError
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.trainable import GPT2Trainable
from orion.models.gpt2.weights import random_weights
from orion.models.llama.config import LlamaConfig
from orion.models.llama.trainable import LlamaTrainable


@pytest.mark.parametrize("model", [GPT2Trainable(GPT2Config()), LlamaTrainable(LlamaConfig.stories110m())],
                         ids=["gpt2", "stories110m"])
def test_full_size_layers_go_to_the_ane_as_two_programs(model) -> None:
    seq, c = 256, model.dim
    plan = partition(model, seq)
    assert [p.device for p in plan.programs] == [ANE, ANE], str(plan)
    assert plan.dispatches == 2 * model.n_layers
    hidden = 4 * c if model.name == "gpt2" else model.config.hidden_dim
    matmuls = 2 * seq * (4 * c * c + (2 if model.name == "gpt2" else 3) * c * hidden)
    analytic = matmuls + 4 * c * seq * seq  # projections + scores and weighted values
    assert plan.forward.flops == pytest.approx(analytic, rel=0.02)
    # the forward returns the activations the gradient reads, so the gradient recomputes no projection: dx and
    # dW each cost one forward's matmuls; attention: the softmax recomputed and 4 matmuls back
    saved = [n for n in plan.forward.graph.outputs if n.startswith("saved_")]
    assert saved and sorted(saved) == sorted(n.name for n in plan.gradients[0].graph.inputs if n.name in saved)
    assert plan.gradients[0].flops == pytest.approx(2 * matmuls + 10 * c * seq * seq, rel=0.05)
    assert plan.cpu_flops == pytest.approx(6 * seq * c * model.vocab_size)
    assert all(p.sram_bytes <= 32 * 2**20 for p in plan.programs)
    # ANE-37: every input of a program shares one packed surface (separate ones would pay ANE-13: each as
    # large as the largest weight); the forward's outputs (y and the saved activations) and the gradient's
    # share at most 6 surfaces
    largest = 2 * max(int(np.prod(s)) for s in model.layer_shapes().values())
    n_params = len(model.layer_shapes())
    inputs = 2 * (c * seq + sum(int(np.prod(s)) for s in model.layer_shapes().values()))
    outputs = 2 * sum(int(np.prod(n.shape)) for n in plan.forward.graph.outputs.values())
    assert inputs + outputs <= plan.forward.surface_bytes <= 1.01 * inputs + 2 * outputs
    assert inputs + largest <= plan.gradients[0].surface_bytes < ((2 + n_params) + (1 + n_params)) * largest
    assert "ANE dispatches per step" in str(plan)


TINY = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32)


def test_a_small_budget_splits_dx_from_dw_and_gives_the_same_gradients() -> None:
    model = GPT2Trainable(TINY)
    whole = partition(model, 32, prefer="ane")
    budget = whole.gradients[0].sram_bytes * 3 // 4
    split = partition(model, 32, prefer="ane", sram_budget=budget)
    assert len(split.gradients) > 2 and split.gradients[0].name == "layer gradient dx"
    assert all(p.device == ANE and p.sram_bytes <= budget for p in split.gradients), str(split)
    params = model.params(random_weights(TINY, seed=0))
    rng = np.random.default_rng(0)
    ids, targets = rng.integers(0, 64, 32), rng.integers(0, 64, 32)
    loss_a, a = GradientRunner(model, 32, whole).loss_and_grads(params, ids, targets)
    loss_b, b = GradientRunner(model, 32, split).loss_and_grads(params, ids, targets)
    assert loss_a == loss_b and sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-2, atol=1e-2 * np.abs(a[name]).max() + 1e-7,
                                   err_msg=name)


def test_tiny_programs_do_not_pay_on_the_ane() -> None:
    plan = partition(GPT2Trainable(TINY), 32)
    assert {p.device for p in plan.programs} == {CPU} and plan.dispatches == 0
    assert all(p.reason.startswith("CPU pays") for p in plan.programs)


def test_cpu_plan_runs_in_numpy_without_compiling() -> None:
    model = GPT2Trainable(TINY)
    before = compile_count()
    runner = GradientRunner(model, 32, prefer="cpu")
    params = model.params(random_weights(TINY, seed=0))
    loss, grads = runner.loss_and_grads(params, np.arange(32) % 64, (np.arange(32) + 1) % 64)
    assert compile_count() == before and np.isfinite(loss) and sorted(grads) == sorted(params)


def test_bad_options_and_batches_are_errors() -> None:
    model = GPT2Trainable(TINY)
    with pytest.raises(OrionError, match="prefer='gpu'.*Fix"):
        partition(model, 32, prefer="gpu")
    runner = GradientRunner(model, 32, prefer="cpu")
    with pytest.raises(OrionError, match=r"ids \(16,\).*Fix"):
        runner.loss_and_grads(model.params(random_weights(TINY)), np.zeros(16, int), np.zeros(16, int))
