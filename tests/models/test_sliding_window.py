"""Sliding-window attention, one mechanism for every family (issue 22): Mistral's ``sliding_window`` in every
layer and Qwen2's in its ``sliding_attention`` layers (``use_sliding_window``, ``max_window_layers``), which Orion
refused before, against transformers 5 on checkpoints it saved (window 8, 70-token prompts: whole, in chunks of 32
over the KV cache, and decoded token by token past the window): logits within 2% of the largest |logit| (fp16
against fp32; measured about 0.2%) and 16 greedy tokens equal. The masks themselves are checked against their
definition (query p sees key t when p - window < t <= p). Gemma's alternating layers: tests/models/test_gemma.py."""

from __future__ import annotations

import numpy as np
import pytest

from orion import models
from orion.models.blocks import window_causal_mask, window_mask_columns
from orion.ops import MASK_VALUE
from support import references

WINDOW, LENGTH, CHUNK = 8, 70, 32


def _sees(query: int, key: int, window: int) -> bool:
    return query - window < key <= query


def test_the_masks_are_the_window_definition() -> None:
    s, window = 12, 5
    want = np.array([[0.0 if _sees(i, j, window) else MASK_VALUE for j in range(s)] for i in range(s)])
    np.testing.assert_array_equal(window_causal_mask(s, window)[0, 0], want)
    # a chunk at positions 20..23 over a cache of 32 lanes holding 20 positions: the cached keys it sees
    columns = window_mask_columns(range(20, 24), 20, 32, window)
    want = np.array([[0.0 if t < 20 and _sees(p, t, window) else MASK_VALUE for p in range(20, 24)] for t in range(32)])
    np.testing.assert_array_equal(columns, want)
    assert columns.dtype == np.float32


@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_a_sliding_window_matches_transformers(tmp_path, kind) -> None:
    torch, transformers = references.require("torch", "transformers")
    torch.manual_seed(3)
    shape = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, max_position_embeddings=128, sliding_window=WINDOW)
    config = transformers.MistralConfig(**shape) if kind == "mistral" else \
        transformers.Qwen2Config(**shape, use_sliding_window=True, max_window_layers=1)  # layer 1 slides
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.08))
    hf.save_pretrained(tmp_path)
    model = models.load(tmp_path, progress=False, prefill_chunk=CHUNK)
    assert model.config.sliding_window == WINDOW
    assert [model.config.window(i) for i in range(2)] == ([WINDOW, WINDOW] if kind == "mistral" else [None, WINDOW])
    ids = [int(i) for i in np.random.default_rng(1).integers(0, 96, LENGTH)]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    atol = 0.02 * float(np.abs(want).max())
    np.testing.assert_allclose(model.logits(ids), want, rtol=0, atol=atol)
    np.testing.assert_allclose(model.logits(ids[:WINDOW + 3]), want[:WINDOW + 3], rtol=0, atol=atol)
    model.prefill(ids[:5])
    for t in range(5, LENGTH):
        np.testing.assert_allclose(model.decode_step(ids[t]), want[t], rtol=0, atol=atol, err_msg=f"position {t}")
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        greedy = hf.generate(torch.tensor([ids[:3]]), max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert list(model.generate(ids[:3], 16, temperature=0, ignore_eos=True)) == greedy[0, 3:].tolist()
