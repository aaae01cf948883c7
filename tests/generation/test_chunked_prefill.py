"""Chunked prefill: a prompt longer than the largest prefill bucket (``prefill_chunk``) runs in chunks of
it, each chunk attending to the KV cache filled so far plus itself.

References: the independent numpy fp32 models in ``tests/support`` (GPT-2: 3% of the largest logit,
Llama: 2%, the tolerances of their own suites: Orion computes in fp16), and the same model run
unchunked, which must agree to within fp16 rounding (3% of the largest logit, GPT-2's own tolerance: the
chunk attention's split softmax rounds its partial sums to fp16 in a different order from the one softmax;
measured 2.2% for GPT-2's 20x-init weights at 67 tokens, 0.1% at 33). Lengths
straddle the chunk boundary: chunk - 1, chunk, chunk + 1 and 2 * chunk + 3.
"""

from __future__ import annotations

import numpy as np
import pytest

from orion.generation.plan import PlanError, PlanOptions
from orion.lora import LoraAdapter
from orion.models import GPT2, GPT2Config, Llama, LlamaConfig
from support.gpt2_fixtures import lively_weights
from support.gpt2_reference import reference_logits as gpt2_reference
from support.llama_fixtures import lively
from support.llama_reference import reference_logits as llama_reference

CHUNK = 32
LENGTHS = [CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 3]
SAME = 0.03  # chunked against unchunked, of the largest logit (fp16 rounding)
# Caches whose positions are on the lane axis (the cache tensors cut from the packed input), so the emulator's
# live-lanes path over the filled positions is the one tested; Llama with grouped-query attention.
GPT2_CONFIG = GPT2Config(n_layer=2, n_head=2, n_embd=96, vocab_size=300, n_positions=256)
LLAMA_CONFIG = LlamaConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=16, hidden_dim=96, vocab_size=160,
                           max_position_embeddings=384, rope_convention="half", rope_theta=500.0)


def within(got: np.ndarray, want: np.ndarray, fraction: float) -> None:
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=fraction * float(np.abs(want).max()))


def prompt(vocab: int, n: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(n).integers(0, vocab, n)]


@pytest.fixture(scope="module")
def gpt2_pair() -> tuple[GPT2, GPT2]:
    weights = lively_weights(GPT2_CONFIG, seed=3)
    return (GPT2(GPT2_CONFIG, weights, progress=False, prefill_chunk=CHUNK),
            GPT2(GPT2_CONFIG, weights, progress=False))


@pytest.fixture(scope="module")
def llama_pair() -> tuple[Llama, Llama]:
    weights = lively(LLAMA_CONFIG, seed=5)
    return (Llama(LLAMA_CONFIG, weights, progress=False, prefill_chunk=CHUNK),
            Llama(LLAMA_CONFIG, weights, progress=False))


MODELS = {"gpt2_pair": (GPT2_CONFIG, gpt2_reference, 0.03), "llama_pair": (LLAMA_CONFIG, llama_reference, 0.02)}


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("pair", list(MODELS))
def test_chunks_match_the_reference_and_the_unchunked_run(pair, length, request) -> None:
    config, reference, tolerance = MODELS[pair]
    chunked, whole = request.getfixturevalue(pair)
    ids = prompt(config.vocab_size, length)
    got = chunked.logits(ids)
    within(got, reference(config, chunked.weights, ids), tolerance)
    within(got, whole.logits(ids), SAME)


@pytest.mark.parametrize("pair", ["gpt2_pair", "llama_pair"])
def test_decode_after_a_chunked_prefill_reads_the_whole_cache(pair, request) -> None:
    chunked, whole = request.getfixturevalue(pair)
    ids = prompt(chunked.dims.vocab_size, 2 * CHUNK + 3)
    within(chunked.prefill(ids), whole.prefill(ids), SAME)
    assert chunked.cache.length == len(ids)
    for token in (3, 11):
        within(chunked.decode_step(token), whole.decode_step(token), SAME)


def test_the_lm_head_on_the_cpu_sees_every_chunk() -> None:
    weights = lively_weights(GPT2_CONFIG, seed=3)
    model = GPT2(GPT2_CONFIG, weights, progress=False, prefill_chunk=CHUNK, lm_head="cpu")
    ids = prompt(GPT2_CONFIG.vocab_size, CHUNK + 1)
    within(model.logits(ids), gpt2_reference(GPT2_CONFIG, weights, ids), 0.03)


def test_pieces_use_power_of_two_buckets_then_chunks() -> None:
    options = PlanOptions(prefill_chunk=64)
    assert options.prefill_pieces(5) == [(0, 5, 32)]
    assert options.prefill_pieces(64) == [(0, 64, 64)]
    assert options.prefill_pieces(65) == [(0, 64, 64), (64, 1, 64)]
    assert options.prefill_pieces(131) == [(0, 64, 64), (64, 64, 64), (128, 3, 64)]


@pytest.mark.parametrize("chunk", [0, 16, 48, True, 64.0])
def test_a_chunk_that_is_not_a_power_of_two_bucket_is_refused(chunk) -> None:
    with pytest.raises(PlanError, match="prefill_chunk"):
        PlanOptions(prefill_chunk=chunk)


def test_a_fork_runs_its_chunks_on_its_own_cache(gpt2_pair) -> None:
    chunked, whole = gpt2_pair
    ids, other = prompt(GPT2_CONFIG.vocab_size, CHUNK + 5), prompt(GPT2_CONFIG.vocab_size, 2 * CHUNK + 3)
    chunked.prefill(ids)
    twin = chunked.fork()
    within(twin.prefill(other), whole.prefill(other), SAME)  # the fork's chunk programs read the fork's cache
    whole.prefill(ids)
    within(chunked.decode_step(7), whole.decode_step(7), SAME)  # the original's cache is untouched


def test_chunks_carry_the_active_lora_adapter() -> None:
    """The chunk programs are built with the adapter's sites and read its inputs, like the buckets."""
    weights = lively_weights(GPT2_CONFIG, seed=3)
    chunked = GPT2(GPT2_CONFIG, weights, progress=False, prefill_chunk=CHUNK)
    whole = GPT2(GPT2_CONFIG, weights, progress=False)
    rng = np.random.default_rng(4)
    placements = chunked.lora_placements()
    tensors = {path: (rng.normal(0, 0.15, (4, p.in_features)).astype(np.float32),
                      rng.normal(0, 0.15, (p.out_features, 4)).astype(np.float32))
               for path, p in placements.items() if path.endswith("attn.c_attn")}
    ids = prompt(GPT2_CONFIG.vocab_size, CHUNK + 9)
    base = whole.logits(ids)
    for model in (chunked, whole):
        model.add_adapter(LoraAdapter(4, 8.0, tensors), "qkv")
        model.set_adapter("qkv")
    adapted = whole.logits(ids)
    assert np.abs(adapted - base).max() > 0.1 * np.abs(base).max()  # the adapter matters
    within(chunked.logits(ids), adapted, SAME)
