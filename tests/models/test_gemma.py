"""Gemma 2 and Gemma 3 (text) on the emulator against transformers 5 (issue 22).

Each family is built from its published ``config.json`` (``support.gemma_configs``: google/gemma-2-2b-it and
google/gemma-3-1b-it) with random weights (norm gains drawn too, so every ``1 + w`` matters), at full width, with
three changes for CI's time: ``vocab_size`` 512 (not 256,000 / 262,144: the embedding would dominate the test),
``sliding_window`` 16 (not 4,096 / 512: prompts and decode run past the window in a few dozen tokens), and the
fewest layers that hold both a sliding and a global layer (Gemma 2: 2; Gemma 3's pattern of 6: 6). Orion loads the
directory with that ``config.json`` as published (transformers' own save replaced by it), a context of 128 and
prompts in chunks of 32 (chunked prefill over the KV cache).

- logits of prompts from 1 token to past the window (and chunked past it) within 2% of the largest |logit|
  (fp16 programs against fp32; measured about 0.1%), and each decode step's logits past the window likewise;
- 32 greedy tokens equal to transformers' ``generate``;
- the independent float64 numpy reference (``support.gemma_reference``, used by the gradient and overflow tests)
  agrees with transformers to 1e-4 of the largest |logit| on small configs (Gemma 3 also with linear RoPE scaling);
- a residual stream pushed past 65504 (post-norm gains of 20,000) gives finite logits within 2% of the float64
  reference with the residual scale Orion derives from the weights, and a clear error naming the layer without it.
"""

from __future__ import annotations

import gc
import json

import numpy as np
import pytest

from orion import models
from orion.generation.loop import ActivationOverflow
from orion.models.gemma.config import ConfigError, GemmaConfig
from orion.models.gemma.weights import random_weights
from support import references
from support.gemma_configs import GEMMA2_2B_IT, GEMMA3_1B_IT
from support.gemma_reference import reference_logits

torch, transformers = references.require("torch", "transformers")

TOLERANCE = 0.02  # of max |logit|: fp16 programs against fp32
WINDOW, VOCAB, CONTEXT, CHUNK = 16, 512, 128, 32
PUBLISHED = {"gemma2": (GEMMA2_2B_IT, 2), "gemma3": (GEMMA3_1B_IT, 6)}


def _close(got: np.ndarray, want: np.ndarray, tolerance: float = TOLERANCE, what: str = "") -> None:
    np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * float(np.abs(want).max()), err_msg=what)


def _hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


@pytest.fixture(scope="module", params=sorted(PUBLISHED))
def published(request, tmp_path_factory):
    """(transformers' model, Orion's model) of the published config (see the module docstring)."""
    config, layers = PUBLISHED[request.param]
    config = config | {"num_hidden_layers": layers, "vocab_size": VOCAB, "sliding_window": WINDOW}
    directory = tmp_path_factory.mktemp(request.param)
    (directory / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    torch.set_num_threads(2)
    hf_config = transformers.AutoConfig.from_pretrained(directory)
    assert {"sliding_attention", "full_attention"} <= set(hf_config.layer_types)
    hf = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager",
                                                       dtype=torch.float32).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim == 1:  # norm weights: transformers initializes w = 0 (gain 1)
                p.copy_(torch.randn_like(p) * 0.3)
    hf.save_pretrained(directory)
    (directory / "config.json").write_text(json.dumps(config))  # the published file, not transformers' rewrite
    model = models.load(directory, progress=False, context=CONTEXT, prefill_chunk=CHUNK)
    assert model.config.sliding_window == WINDOW and model.residual_scale == 1.0
    yield hf, model
    del hf, model  # about 1.5 GB of weights at full width: gone before the next family's
    gc.collect()


def _ids(n: int, seed: int = 1, vocab: int = VOCAB) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(0, vocab, n)]


def test_logits_match_from_one_token_to_past_the_window(published) -> None:
    hf, model = published
    ids = _ids(3 * CHUNK - 10)  # 86 tokens: three chunks, the window passed in each
    want = _hf_logits(hf, ids)
    for n in (1, 7, WINDOW, WINDOW + 1, 2 * WINDOW + 5):
        _close(model.logits(ids[:n]), _hf_logits(hf, ids[:n]), what=f"{n} tokens")
    _close(model.logits(ids), want, what="chunked prefill")


def test_decode_past_the_window_matches(published) -> None:
    hf, model = published
    ids = _ids(3 * WINDOW + 8, seed=2)
    want = _hf_logits(hf, ids)
    _close(model.prefill(ids[:5]), want[4], what="prefill")
    for t in range(5, len(ids)):
        _close(model.decode_step(ids[t]), want[t], what=f"decode at position {t}")


def test_greedy_tokens_agree_over_32_steps(published) -> None:
    hf, model = published
    prompt = _ids(10, seed=3)
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, pad_token_id=0)[0, 10:].tolist()
    assert list(model.generate(prompt, max_new_tokens=32, temperature=0, ignore_eos=True)) == want


# -- the independent reference --------------------------------------------------------------------------

def _tiny_hf(kind: str, seed: int, **changes):
    torch.manual_seed(seed)
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=64, sliding_window=8,
                  query_pre_attn_scalar=24, rms_norm_eps=1e-6)
    if kind == "gemma2":
        config = transformers.Gemma2Config(**common | changes)
    else:
        config = transformers.Gemma3TextConfig(**common | {"sliding_window_pattern": 2, "rope_theta": 1e5} | changes)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.05))
    return hf


@pytest.mark.parametrize("kind,changes", [("gemma2", {}), ("gemma3", {}), ("gemma3", {"rope_scaling": {
    "rope_type": "linear", "factor": 4.0}}), ("gemma2", {"tie_word_embeddings": False})])
def test_reference_matches_transformers(tmp_path, kind, changes) -> None:
    hf = _tiny_hf(kind, 4, **changes)
    hf.save_pretrained(tmp_path)
    config, weights = models.family("gemma2").weights.load_hf(tmp_path, progress=False)
    ids = _ids(40, vocab=96)
    want = _hf_logits(hf, ids)
    _close(reference_logits(config, weights, ids), want, 1e-4)
    _close(models.load(tmp_path, progress=False).logits(ids), want, what="Orion")
    _close(models.load(tmp_path, progress=False, lm_head="cpu").logits(ids), want, what="Orion, LM head on the CPU")


# -- overflow -------------------------------------------------------------------------------------------

def _overflowing() -> tuple[GemmaConfig, object, list[int]]:
    """A Gemma 2 whose post-norm gains of 20,000 push the residual stream past fp16's 65504 (measured in float64:
    8.2e4 after layer 0, 1.1e5 after layer 1; the bound from the weights is 6.4e5, so the residual scale is 32)."""
    config = GemmaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=96,
                         max_position_embeddings=64, sliding_window=8, sliding_layers=(0,), query_pre_attn_scalar=16,
                         attn_softcap=50.0, final_softcap=30.0)
    weights = random_weights(config, seed=9)
    for layer in weights.layers:
        layer.attn_post_norm[:] = 20000.0
        layer.mlp_post_norm[:] = 20000.0
    return config, weights, _ids(20, seed=9, vocab=96)


def test_a_residual_stream_past_fp16_gives_the_float64_logits() -> None:
    config, weights, ids = _overflowing()
    residuals: list[np.ndarray] = []
    want = reference_logits(config, weights, ids, residuals)
    assert np.abs(residuals[0]).max() > 65504 and np.abs(residuals[-1]).max() > 65504
    model = models.Gemma(config, weights, progress=False)
    assert model.residual_scale == 32  # proven from the weights: the stream divided by it stays within fp16
    got = model.logits(ids)
    assert np.isfinite(got).all()
    _close(got, want)
    model.prefill(ids[:10])
    for t in range(10, len(ids)):
        _close(model.decode_step(ids[t]), want[t], what=f"decode at {t}")


def test_an_unscaled_overflow_is_an_error_naming_the_layer() -> None:
    config, weights, ids = _overflowing()
    model = models.Gemma(config, weights, progress=False, residual_scale=1, fusion_depth=1)
    with pytest.raises(ActivationOverflow, match=r"layer 0 overflowed fp16 .* residual_scale"):
        model.logits(ids)
    with pytest.raises(ConfigError, match="residual_scale=3.*power of two"):
        models.Gemma(config, weights, progress=False, residual_scale=3)
