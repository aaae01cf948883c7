"""GradientRunner's weight strategies on tiny GPT-2 and Llama models (programs on the emulator in fp16):

- "patch" and "recompile" (per-layer programs with every layer weight baked) give the loss and gradients of
  "inputs" within fp16 rounding: 1e-3 relative on the loss, 1% of each tensor's largest magnitude on the
  gradients (measured: identical, the emulator accumulates a conv and a matmul alike);
- baked weights are the values of the last ``update``: a changed parameter dict alone changes nothing, and after
  ``update`` the loss is that of "inputs" with the new values; "patch" updates without a compile, "recompile"
  compiles ``compiles_per_update`` (= layers x baked programs) programs per update;
- ``trainable`` returns gradients for those layer parameters only (matching the full run's), and frozen baked
  weights are never re-baked (no compile, even under "recompile"); bad settings raise OrionError.
"""

from __future__ import annotations

import numpy as np
import pytest

from orion import OrionError, compile_count
from orion.autodiff import partition as partition_module
from orion.autodiff.runner import GradientRunner
from orion.models.gpt2 import weights as gpt2_weights
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.trainable import GPT2Trainable
from orion.models.llama import weights as llama_weights
from orion.models.llama.config import LlamaConfig
from orion.models.llama.trainable import LlamaTrainable

SEQ, SCALE = 32, 256.0


def _model(kind: str):
    if kind == "gpt2":
        config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=64, n_positions=SEQ)
        model = GPT2Trainable(config)
        return model, model.params(gpt2_weights.random_weights(config, seed=5))
    config = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=64,
                         max_position_embeddings=SEQ)
    model = LlamaTrainable(config)
    return model, model.params(llama_weights.random_weights(config, seed=5))


def _window(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 64, SEQ), rng.integers(0, 64, SEQ)


def _moved(model, params: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """The parameters with every layer weight perturbed (embedding and head unchanged)."""
    rng = np.random.default_rng(seed)
    layer = {model.layer_param(i, n) for i in range(model.n_layers) for n in model.layer_shapes()}
    return {k: (v + 0.02 * rng.standard_normal(v.shape).astype(np.float32)) if k in layer else v
            for k, v in params.items()}


def _assert_close(got: tuple[float, dict], want: tuple[float, dict]) -> None:
    assert abs(got[0] - want[0]) <= 1e-3 * abs(want[0])
    assert sorted(got[1]) == sorted(want[1])
    for name, g in want[1].items():
        assert np.abs(got[1][name] - g).max() <= 1e-2 * np.abs(g).max() + 1e-12, name


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("weights", ["patch", "recompile"])
def test_baked_strategies_match_inputs_and_follow_update(kind: str, weights: str) -> None:
    model, params = _model(kind)
    ids, targets = _window()
    inputs = GradientRunner(model, SEQ, prefer="ane")
    before = compile_count()
    runner = GradientRunner(model, SEQ, weights=weights, params=params, prefer="ane")
    assert compile_count() - before == 2 * model.n_layers  # forward and gradient, per layer
    assert runner.baked == list(model.layer_shapes())
    want = inputs.loss_and_grads(params, ids, targets, SCALE)
    _assert_close(runner.loss_and_grads(params, ids, targets, SCALE), want)
    moved = _moved(model, params, 1)
    stale = runner.loss_and_grads(moved, ids, targets, SCALE)[0]
    assert stale == runner.loss_and_grads(params, ids, targets, SCALE)[0]  # baked: new values need update()
    before = compile_count()
    runner.update(moved)
    assert compile_count() - before == runner.compiles_per_update == (0 if weights == "patch" else 2 * model.n_layers)
    fresh = runner.loss_and_grads(moved, ids, targets, SCALE)
    assert fresh[0] != stale
    _assert_close(fresh, inputs.loss_and_grads(moved, ids, targets, SCALE))
    runner.unload()


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_trainable_subset_and_frozen_baked_weights(kind: str) -> None:
    model, params = _model(kind)
    ids, targets = _window(2)
    names = list(model.layer_shapes())
    frozen, trained = names[: len(names) // 2], names[len(names) // 2:]
    full = GradientRunner(model, SEQ, prefer="ane").loss_and_grads(params, ids, targets, SCALE)
    runner = GradientRunner(model, SEQ, weights="recompile", baked=frozen, trainable=trained, params=params,
                            prefer="ane")
    loss, grads = runner.loss_and_grads(params, ids, targets, SCALE)
    layer_grads = {k for k in grads if k.startswith(model.layer_prefix) and k[len(model.layer_prefix)].isdigit()}
    assert layer_grads == {model.layer_param(i, n) for i in range(model.n_layers) for n in trained}
    _assert_close((loss, grads), (full[0], {k: full[1][k] for k in grads}))
    before = compile_count()
    runner.update(_moved(model, params, 3))  # only frozen weights are baked: nothing to re-bake
    assert compile_count() == before and runner.compiles_per_update == 0
    lora_like = GradientRunner(model, SEQ, baked=frozen, trainable=trained, params=params, prefer="ane")
    _assert_close(lora_like.loss_and_grads(params, ids, targets, SCALE), (loss, grads))  # frozen bakes under "inputs"


def test_bad_settings_raise() -> None:
    model, params = _model("gpt2")
    with pytest.raises(OrionError, match="weights='baked'.*Fix"):
        GradientRunner(model, SEQ, weights="baked")
    with pytest.raises(OrionError, match=r"baked and trained.*Fix: use weights='patch'"):
        GradientRunner(model, SEQ, baked=["w_q"], params=params)
    with pytest.raises(OrionError, match="no params to bake"):
        GradientRunner(model, SEQ, weights="patch")
    with pytest.raises(OrionError, match=r"trainable: \['h0.w_q'\] are not layer parameters.*Fix"):
        GradientRunner(model, SEQ, trainable=["h0.w_q"])
    big = dict(params, **{"h1.w_fc": params["h1.w_fc"] * 1e6})
    with pytest.raises(OrionError, match=r"ANE-25.*h1.w_fc.*Fix"):
        GradientRunner(model, SEQ, weights="patch", params=big, prefer="ane")


def test_patch_writes_weight_files_directly_and_falls_back_to_lowering(monkeypatch: pytest.MonkeyPatch) -> None:
    from orion.autodiff import runner as runner_module

    model, params = _model("llama")
    ids, targets = _window(4)
    direct = GradientRunner(model, SEQ, weights="patch", params=params, prefer="ane")
    assert all(s.files for s in direct._slots)  # every baked file proven writable in place
    monkeypatch.setattr(runner_module._PerLayer, "_files", lambda self, values: None)
    lowered = GradientRunner(model, SEQ, weights="patch", params=params, prefer="ane")
    moved = _moved(model, params, 5)
    for r in (direct, lowered):
        r.update(moved)
    want = direct.loss_and_grads(moved, ids, targets, SCALE)
    got = lowered.loss_and_grads(moved, ids, targets, SCALE)
    assert got[0] == want[0] and all(np.array_equal(got[1][k], want[1][k]) for k in want[1])


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_inputs_rounded_once_per_step_change_nothing(kind) -> None:
    # With every program on the ANE the runner rounds each layer's inputs to fp16 once per step (its forward
    # and gradient programs share them); the programs' fp16 input surfaces round fp32 inputs the same way, so
    # the loss and every gradient are bit for bit those of passing the fp32 arrays to each program.
    model, params = _model(kind)
    ids, targets = _window()
    runner = GradientRunner(model, SEQ, prefer="ane")
    assert runner._fp16_inputs
    once = runner.loss_and_grads(params, ids, targets, loss_scale=SCALE)
    runner._fp16_inputs = False
    per_program = runner.loss_and_grads(params, ids, targets, loss_scale=SCALE)
    assert once[0] == per_program[0]
    assert sorted(once[1]) == sorted(per_program[1])
    for name, g in per_program[1].items():
        np.testing.assert_array_equal(once[1][name], g, err_msg=name)


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_saved_activations_change_nothing(kind, monkeypatch) -> None:
    # The forward program returns the activations the gradient rules read and the gradient program takes them
    # instead of recomputing its layer's forward: the same fp16 ops on the same inputs, so the loss and every
    # gradient are bit for bit those of the recomputing plan.
    model, params = _model(kind)
    ids, targets = _window()
    saving = GradientRunner(model, SEQ, prefer="ane")
    saved = [n for n in saving.plan.forward.graph.outputs if n.startswith("saved_")]
    assert saved and sorted(saved) == sorted(n.name for n in saving.plan.gradients[0].graph.inputs
                                             if n.name.startswith("saved_"))
    monkeypatch.setattr(partition_module, "_saving_activations", lambda layer, wrt, forward, whole, *rest: (forward, whole))
    recomputing = GradientRunner(model, SEQ, prefer="ane")
    assert list(recomputing.plan.forward.graph.outputs) == ["y"]
    assert saving.plan.gradients[0].flops < recomputing.plan.gradients[0].flops
    got = saving.loss_and_grads(params, ids, targets, loss_scale=SCALE)
    want = recomputing.loss_and_grads(params, ids, targets, loss_scale=SCALE)
    assert got[0] == want[0]
    assert sorted(got[1]) == sorted(want[1])
    for name, g in want[1].items():
        np.testing.assert_array_equal(got[1][name], g, err_msg=name)
