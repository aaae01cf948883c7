"""Llama graphs compiled with orion.compile_graph (fp16 in the emulator) against the numpy reference.

Tolerances (fp16 compute, rounded after every op): layer outputs, keys and values agree to 1% of the
reference's largest magnitude; LM-head logits to 1% of the largest logit (RMSNorm past fp16's overflow:
tests/test_norm_overflow.py). The test weights are 10x llama2.c's init (so every parameter matters and
activations reach RMS ~10) with non-unit norm gains.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import orion
from orion.generation.kv_cache import MASKED
from orion.models.llama import graphs
from orion.models.llama.config import LlamaConfig
from orion.models.llama.weights import random_weights, to_rope_convention
from support.llama_fixtures import lively
from support.llama_reference import (
    head_logits,
    layer_forward,
    reference_greedy,
    reference_logits,
)

SEQ, CONTEXT = 16, 32
CONFIGS = {
    "gqa8x2-interleaved": LlamaConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=16, hidden_dim=96,
                                      vocab_size=160, max_position_embeddings=CONTEXT, rope_convention="interleaved",
                                      tie_embeddings=True),
    "gqa8x2-half-qwen2-bias": LlamaConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=16, hidden_dim=96,
                                          vocab_size=160, max_position_embeddings=CONTEXT, rope_convention="half",
                                          qkv_bias=True, model_type="qwen2", rope_theta=1e6),
    "mha4-half-untied": LlamaConfig(dim=48, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=32, hidden_dim=64,
                                    vocab_size=96, max_position_embeddings=CONTEXT, rope_convention="half",
                                    rope_theta=500.0),
}



def channels(x: np.ndarray) -> np.ndarray:
    """[T, C] -> [1, C, 1, T]."""
    return np.ascontiguousarray(x.T[None, :, None, :])


def rows(x: np.ndarray) -> np.ndarray:
    """[1, C, 1, T] -> [T, C]."""
    return x[0, :, 0, :].T.astype(np.float32)


def close(got: np.ndarray, want: np.ndarray, rel: float = 0.01) -> None:
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * float(np.abs(want).max()))


@pytest.fixture(scope="module", params=list(CONFIGS))
def model(request):
    config = CONFIGS[request.param]
    return config, lively(config, seed=len(request.param))


def _hidden(config: LlamaConfig, n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, config.dim)) * 3).astype(np.float32)


# -- layers ----------------------------------------------------------------------------------------

def test_prefill_layer_matches_the_reference(model) -> None:
    config, weights = model
    compiled = orion.compile_graph(graphs.prefill_graph(config, weights, range(1), SEQ))
    x = _hidden(config, SEQ, 1)
    got = compiled(x=channels(x))
    want, k, v = layer_forward(config, weights.layers[0], x)
    close(rows(got["x"]), want)
    close(rows(got["k0"]), k)
    close(rows(got["v0"]), v)


def test_two_fused_prefill_layers_match_the_reference(model) -> None:
    config, weights = model
    compiled = orion.compile_graph(graphs.prefill_graph(config, weights, range(2), SEQ), max_layers=2)
    x = _hidden(config, SEQ, 2)
    got = compiled(x=channels(x))
    mid, _, _ = layer_forward(config, weights.layers[0], x)
    want, k, v = layer_forward(config, weights.layers[1], mid)
    close(rows(got["x"]), want)
    close(rows(got["k1"]), k)
    close(rows(got["v1"]), v)


def _cache(config: LlamaConfig, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    k = np.zeros((1, config.kv_dim, 1, CONTEXT), np.float32)
    v = np.zeros_like(k)
    n = len(keys)
    k[0, :, 0, :n], v[0, :, 0, :n] = keys.T, values.T
    mask = np.full((1, 1, 1, CONTEXT), MASKED, np.float32)
    mask[..., :n] = 0
    return k, v, mask


def test_one_decode_program_serves_every_position(model) -> None:
    config, weights = model
    compiled = orion.compile_graph(graphs.decode_graph(config, weights, range(1), CONTEXT))
    xs = _hidden(config, CONTEXT, 3)
    want, keys, values = layer_forward(config, weights.layers[0], xs)  # row p: token p over tokens 0..p
    for pos in (0, 1, 9, CONTEXT - 1):
        k, v, mask = _cache(config, keys[:pos], values[:pos])
        got = compiled(x=channels(xs[pos:pos + 1]), mask=mask, rope=graphs.rope_row(config, pos), k0=k, v0=v)
        close(rows(got["x"])[0], want[pos])
        close(rows(got["k0"])[0], keys[pos])
        close(rows(got["v0"])[0], values[pos])


def test_garbage_beyond_the_mask_is_ignored(model) -> None:
    config, weights = model
    compiled = orion.compile_graph(graphs.decode_graph(config, weights, range(1), CONTEXT))
    xs = _hidden(config, 6, 4)
    want, keys, values = layer_forward(config, weights.layers[0], xs)
    k, v, mask = _cache(config, keys[:5], values[:5])
    k[..., 5:] = 50.0  # stale entries of a longer, abandoned sequence
    v[..., 5:] = -50.0
    got = compiled(x=channels(xs[5:6]), mask=mask, rope=graphs.rope_row(config, 5), k0=k, v0=v)
    close(rows(got["x"])[0], want[5])


def test_lm_head_in_vocabulary_chunks(model) -> None:
    config, weights = model
    x = _hidden(config, SEQ, 5) * 4
    want = head_logits(config, weights, x)
    half = config.vocab_size // 2
    chunks = [orion.compile_graph(graphs.lm_head_graph(config, weights, r, SEQ))(x=channels(x))["logits"]
              for r in (range(half), range(half, config.vocab_size))]
    close(np.concatenate([rows(c) for c in chunks], axis=1), want)


def test_both_rope_conventions_compute_the_same_layer() -> None:
    config = CONFIGS["gqa8x2-interleaved"]
    weights = lively(config, seed=9)
    half_config, half_weights = to_rope_convention(config, weights, "half")
    assert not np.array_equal(half_weights.layers[0].wq, weights.layers[0].wq)
    x = _hidden(config, SEQ, 6)
    got = {c.rope_convention: rows(orion.compile_graph(graphs.prefill_graph(c, w, range(1), SEQ))(x=channels(x))["x"])
           for c, w in ((config, weights), (half_config, half_weights))}
    want = layer_forward(config, weights.layers[0], x)[0]
    np.testing.assert_allclose(layer_forward(half_config, half_weights.layers[0], x)[0], want, rtol=0, atol=1e-4)
    close(got["interleaved"], want)
    close(got["half"], want)


def test_spans_beyond_the_context_are_errors() -> None:
    config = CONFIGS["mha4-half-untied"]
    weights = lively(config)
    with pytest.raises(orion.OrionError, match="position 32: outside the context length"):
        graphs.rope_row(config, CONTEXT)
    with pytest.raises(orion.OrionError, match="prefill of 64 tokens: outside the context length"):
        graphs.prefill_graph(config, weights, range(1), 64)
    with pytest.raises(orion.OrionError, match="decode cache of 33 positions"):
        graphs.decode_graph(config, weights, range(1), CONTEXT + 1)
    with pytest.raises(orion.OrionError, match="vocabulary chunk"):
        graphs.lm_head_graph(config, weights, range(90, 100), 1)


def test_rope_tables_follow_the_convention() -> None:
    config = CONFIGS["gqa8x2-interleaved"]
    cos, _ = graphs.rope_tables(config, np.array([3]))
    np.testing.assert_array_equal(cos[0::2], cos[1::2])  # pairs (2i, 2i+1) share an angle
    half = CONFIGS["mha4-half-untied"]
    cos, sin = graphs.rope_tables(half, np.array([5]))
    np.testing.assert_array_equal(cos[:16], cos[16:])  # pairs (i, i + 16) share an angle
    np.testing.assert_allclose(sin[1, 0], np.sin(5 * 500.0 ** (-2 / 32)))


def test_stories110m_shape_layer_decode_and_prefill() -> None:
    config = replace(LlamaConfig.stories110m(), n_layers=1)
    weights = random_weights(config, seed=0)
    pos, t = 100, config.max_position_embeddings
    xs = _hidden(config, pos + 1, 7)
    want, keys, values = layer_forward(config, weights.layers[0], xs)
    k = np.zeros((1, config.kv_dim, 1, t), np.float32)
    v = np.zeros_like(k)
    k[0, :, 0, :pos], v[0, :, 0, :pos] = keys[:pos].T, values[:pos].T
    mask = np.full((1, 1, 1, t), MASKED, np.float32)
    mask[..., :pos] = 0
    decode = orion.compile_graph(graphs.decode_graph(config, weights, range(1)))
    got = decode(x=channels(xs[pos:pos + 1]), mask=mask, rope=graphs.rope_row(config, pos), k0=k, v0=v)
    close(rows(got["x"])[0], want[pos])
    prefill = orion.compile_graph(graphs.prefill_graph(config, weights, range(1), 64))
    close(rows(prefill(x=channels(xs[:64]))["x"]), want[:64])


def test_chained_programs_reproduce_the_reference_logits_and_greedy_tokens(model) -> None:
    """Prefill (padded to a bucket) then decode steps, chained by hand: the graphs alone, no runtime."""
    config, weights = model
    layers = range(config.n_layers)
    prefill = [orion.compile_graph(graphs.prefill_graph(config, weights, range(i, i + 1), SEQ)) for i in layers]
    decode = [orion.compile_graph(graphs.decode_graph(config, weights, range(i, i + 1), CONTEXT)) for i in layers]
    head = orion.compile_graph(graphs.lm_head_graph(config, weights, range(config.vocab_size), 1))
    prompt = [3, 14, 15, 92, 65]
    x = np.zeros((SEQ, config.dim), np.float32)
    x[:len(prompt)] = weights.embed[prompt]  # padding after the prompt: the causal mask keeps it out
    keys = np.zeros((config.n_layers, 1, config.kv_dim, 1, CONTEXT), np.float32)
    values = np.zeros_like(keys)
    h = channels(x)
    for i in layers:
        out = prefill[i](x=h)
        h = out["x"]
        keys[i][..., :len(prompt)] = out[f"k{i}"][..., :len(prompt)]
        values[i][..., :len(prompt)] = out[f"v{i}"][..., :len(prompt)]
    logits = rows(head(x=h[..., len(prompt) - 1:len(prompt)])["logits"])[0]
    close(logits, reference_logits(config, weights, prompt)[-1])
    tokens = []
    for pos in range(len(prompt), len(prompt) + 8):
        tokens.append(int(np.argmax(logits)))
        want = reference_logits(config, weights, prompt + tokens)[-1]
        mask = np.full((1, 1, 1, CONTEXT), MASKED, np.float32)
        mask[..., :pos] = 0
        h = channels(weights.embed[tokens[-1:]])
        for i in layers:
            out = decode[i](x=h, mask=mask, rope=graphs.rope_row(config, pos), **{f"k{i}": keys[i], f"v{i}": values[i]})
            h = out["x"]
            keys[i][..., pos], values[i][..., pos] = out[f"k{i}"][..., 0], out[f"v{i}"][..., 0]
        logits = rows(head(x=h)["logits"])[0]
        close(logits, want)
    assert tokens == reference_greedy(config, weights, prompt, 8)
