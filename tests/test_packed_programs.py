"""Under the hardware profile, without a probe report, every program Orion compiles for GPT-2 and Llama decode,
prefill (chunked too), training and LoRA training binds one input surface and at most six output surfaces
(ANE-37: maderix/ANE saw several inputs fail with 0x1d, mechramc/Orion ran up to 6 outputs). The suites of
those paths check their numbers against references."""

from __future__ import annotations

import numpy as np
import pytest

from orion.autodiff.runner import GradientRunner
from orion.lora.train import LoraSpec, LoraTrainable, modules_of
from orion.models.gpt2 import GPT2
from orion.models.gpt2 import weights as gpt2_weights
from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.trainable import GPT2Trainable
from orion.models.llama import weights as llama_weights
from orion.models.llama.config import LlamaConfig
from orion.models.llama.model import Llama
from orion.models.llama.trainable import LlamaTrainable
from orion.runtime.program import Program

SEQ = 32


@pytest.fixture
def surfaces(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(input surfaces, output surfaces) of every program loaded while the test runs."""
    seen: list[tuple[int, int]] = []
    init = Program.__init__

    def recording(self: Program, native, dtypes) -> None:
        init(self, native, dtypes)
        seen.append((len(self.inputs), len(self.outputs)))

    monkeypatch.setattr(Program, "__init__", recording)
    return seen


def test_decode_and_chunked_prefill_programs_bind_one_input_surface(surfaces) -> None:
    """ANE-37 on GPT-2 and Llama (grouped-query) decode, prefill and chunked-prefill programs; sizes unlike the
    other suites' so no program comes from the process's program cache."""
    gpt2 = GPT2Config(n_layer=3, n_head=2, n_embd=80, vocab_size=160, n_positions=128)
    llama = LlamaConfig(dim=80, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=20, hidden_dim=112, vocab_size=160,
                        max_position_embeddings=128)
    models = [GPT2(gpt2, gpt2_weights.random_weights(gpt2, seed=1), progress=False, prefill_chunk=32),
              Llama(llama, llama_weights.random_weights(llama, seed=1), progress=False, prefill_chunk=32)]
    for model in models:
        ids = [int(i) for i in np.random.default_rng(2).integers(0, 160, 45)]  # two chunks of 32
        model.prefill(ids)
        for token in (3, 7):
            model.decode_step(token)
    assert len(surfaces) >= 6
    assert all(inputs == 1 and outputs <= 6 for inputs, outputs in surfaces), surfaces


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_training_and_lora_programs_bind_one_input_surface(kind: str, surfaces) -> None:
    """ANE-37 on the layer forward and gradient programs of a training step (weights as inputs, every dW in the
    program) and of LoRA training (adapters as inputs, bases baked)."""
    if kind == "gpt2":
        config = GPT2Config(n_layer=2, n_head=2, n_embd=80, vocab_size=96, n_positions=SEQ)
        base, weights = GPT2Trainable(config), gpt2_weights.random_weights(config, seed=3)
        targets = ("c_attn", "c_fc")
    else:
        config = LlamaConfig(dim=80, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=20, hidden_dim=112,
                             vocab_size=96, max_position_embeddings=SEQ)
        base, weights = LlamaTrainable(config), llama_weights.random_weights(config, seed=3)
        targets = ("q", "v", "down")
    params = base.params(weights)
    rng = np.random.default_rng(4)
    ids, labels = rng.integers(0, 96, SEQ), rng.integers(0, 96, SEQ)
    GradientRunner(base, SEQ, prefer="ane").loss_and_grads(params, ids, labels, loss_scale=256.0)
    spec = LoraSpec(r=4, alpha=8.0, targets=targets)
    lora = LoraTrainable(base, params, spec, modules_of(base, spec.targets))
    runner = GradientRunner(lora, SEQ, prefer="ane", **lora.runner_options())
    runner.loss_and_grads(lora.init_params(5), ids, labels, loss_scale=256.0)
    assert len(surfaces) >= 4
    assert all(inputs == 1 and outputs <= 6 for inputs, outputs in surfaces), surfaces
