"""The numpy reference GPT-2: its own properties, and agreement with Hugging Face transformers."""

from __future__ import annotations

import numpy as np
import pytest

from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.weights import random_weights, save_hf
from support import references
from support.gpt2_fixtures import lively_weights
from support.gpt2_reference import reference_greedy, reference_logits

SMALL = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=128)


def test_shape_dtype_and_finite():
    logits = reference_logits(SMALL, lively_weights(SMALL), [1, 2, 3, 4, 5])
    assert logits.shape == (5, 512) and logits.dtype == np.float32
    assert np.all(np.isfinite(logits)) and logits.std() > 1


def test_causal_prefix_logits_do_not_see_the_future():
    w = lively_weights(SMALL)
    ids = np.random.default_rng(0).integers(0, 512, 20)
    full = reference_logits(SMALL, w, ids)
    assert np.allclose(reference_logits(SMALL, w, ids[:7]), full[:7], atol=1e-5)
    changed = ids.copy()
    changed[10] = (changed[10] + 1) % 512
    other = reference_logits(SMALL, w, changed)
    assert np.allclose(other[:10], full[:10], atol=1e-5) and not np.allclose(other[10:], full[10:], atol=1e-3)


def test_positions_matter():
    w = lively_weights(SMALL)
    logits = reference_logits(SMALL, w, [7, 7, 7])
    assert not np.allclose(logits[0], logits[2], atol=1e-3)


def test_rejects_bad_lengths():
    w = random_weights(SMALL)
    with pytest.raises(ValueError, match="1..128 tokens"):
        reference_logits(SMALL, w, [])
    with pytest.raises(ValueError, match="1..128 tokens"):
        reference_logits(SMALL, w, [0] * 129)


def test_greedy_appends_argmax_tokens():
    w = lively_weights(SMALL)
    prompt = [3, 1, 4, 1, 5]
    out = reference_greedy(SMALL, w, prompt, 6)
    assert len(out) == 6 and len(set(out)) > 1
    logits = reference_logits(SMALL, w, prompt + out[:-1])
    assert out == [int(np.argmax(row)) for row in logits[len(prompt) - 1:]]


@pytest.fixture(scope="module")
def torch_and_transformers():
    return references.require("torch", "transformers")


@pytest.mark.parametrize("config", [
    SMALL,
    GPT2Config(n_layer=3, n_head=2, n_embd=32, vocab_size=300, n_positions=64, layer_norm_epsilon=1e-3),
])
def test_matches_hugging_face(torch_and_transformers, tmp_path, config):
    torch, transformers = torch_and_transformers
    w = lively_weights(config, seed=2)
    save_hf(tmp_path, config, w)
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, torch_dtype=torch.float32).eval()
    ids = np.random.default_rng(1).integers(0, config.vocab_size, config.n_positions)
    with torch.no_grad():
        hf = model(torch.tensor(ids)[None]).logits[0].numpy()
    ref = reference_logits(config, w, ids)
    print(f"max |HF - reference| = {np.abs(hf - ref).max():.2e}, max |logit| = {np.abs(ref).max():.1f}")
    assert np.abs(hf - ref).max() < 1e-4

    prompt = ids[:6]
    with torch.no_grad():
        generated = model.generate(torch.tensor(prompt)[None], max_new_tokens=12, min_new_tokens=12,
                                   do_sample=False, pad_token_id=0)
    assert generated[0, len(prompt):].tolist() == reference_greedy(config, w, prompt, 12)
