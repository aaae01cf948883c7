"""Shared prompt prefixes (``orion.generation.prefix_cache``): a prompt that starts like one computed before
copies those positions' keys and values instead of recomputing them. References: the same model without
the cache (logits within 3% of the largest, GPT-2's fp16 tolerance: the rest of the prompt runs through
the chunk programs, whose split softmax rounds differently; greedy tokens equal) and the float64 numpy
model of ``tests/support``."""

from __future__ import annotations

import numpy as np
import pytest

from orion.generation.prefix_cache import PrefixCache, PrefixCacheError
from orion.lora import LoraAdapter
from orion.models import GPT2, GPT2Config, Llama, LlamaConfig
from support.gpt2_fixtures import lively_weights
from support.gpt2_reference import reference_logits as gpt2_reference
from support.llama_fixtures import lively
from support.llama_reference import reference_logits as llama_reference

GPT2_CONFIG = GPT2Config(n_layer=2, n_head=2, n_embd=96, vocab_size=300, n_positions=256)
LLAMA_CONFIG = LlamaConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=16, hidden_dim=96, vocab_size=160,
                           max_position_embeddings=384, rope_convention="half", rope_theta=500.0)
SAME = 0.03
POSITION_BYTES = 2 * 2 * 96 * 2  # GPT-2 tiny: k and v, 2 layers, 96 wide, fp16


def within(got: np.ndarray, want: np.ndarray, fraction: float = SAME) -> None:
    np.testing.assert_allclose(got, want, rtol=0, atol=fraction * float(np.abs(want).max()))


@pytest.fixture(scope="module")
def gpt2_pair() -> tuple[GPT2, GPT2]:
    weights = lively_weights(GPT2_CONFIG, seed=3)
    cached = GPT2(GPT2_CONFIG, weights, progress=False)
    cached.prefix_cache = PrefixCache(max_bytes=1 << 20)
    return cached, GPT2(GPT2_CONFIG, weights, progress=False)


@pytest.fixture(scope="module")
def llama_pair() -> tuple[Llama, Llama]:
    weights = lively(LLAMA_CONFIG, seed=5)
    cached = Llama(LLAMA_CONFIG, weights, progress=False)
    cached.prefix_cache = PrefixCache(max_bytes=1 << 20)
    return cached, Llama(LLAMA_CONFIG, weights, progress=False)


def ids(vocab: int, n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


@pytest.mark.parametrize("pair, reference", [("gpt2_pair", gpt2_reference), ("llama_pair", llama_reference)])
def test_a_shared_system_prompt_is_reused_with_the_same_output(pair, reference, request) -> None:
    cached, plain = request.getfixturevalue(pair)
    cache = cached.prefix_cache
    cache.clear()
    vocab = cached.dims.vocab_size
    system = ids(vocab, 70, 1)
    first, second = system + ids(vocab, 9, 2), system + ids(vocab, 13, 3)
    cached.prefill(first)
    hits = cache.stats.hits
    got = cached.prefill(second)
    assert cache.stats.hits == hits + 1 and cached.cache.length == len(second)
    assert cache.stats.reused_tokens >= len(system)
    within(got, plain.prefill(second))
    within(got, reference(cached.config, cached.weights, second)[-1], 0.03)
    for token in (3, 11):  # decode after the reused prefix reads every position
        within(cached.decode_step(token), plain.decode_step(token))
    want = list(plain.generate(second, 12, temperature=0, ignore_eos=True))
    assert list(cached.generate(second, 12, temperature=0, ignore_eos=True)) == want


def test_the_whole_prompt_is_never_reused_and_logits_are_not_served_from_it(gpt2_pair) -> None:
    cached, plain = gpt2_pair
    cached.prefix_cache.clear()
    prompt = ids(300, 40, 4)
    cached.prefill(prompt)
    within(cached.prefill(prompt), plain.prefill(prompt))  # the last position runs: it gives the logits
    assert cached.prefix_cache.stats.reused_tokens >= len(prompt) - 1
    within(cached.logits(prompt), plain.logits(prompt))


def test_short_prefixes_are_recomputed(gpt2_pair) -> None:
    cached, _ = gpt2_pair
    cache = cached.prefix_cache
    cache.clear()
    cached.prefill(ids(300, 30, 5))
    hits = cache.stats.hits
    cached.prefill(ids(300, 30, 5)[: cache.min_tokens - 1] + [1, 2, 3])
    assert cache.stats.hits == hits


def test_the_store_is_bounded_in_bytes_least_recently_used_out(gpt2_pair) -> None:
    cached, _ = gpt2_pair
    saved = cached.prefix_cache
    cached.prefix_cache = cache = PrefixCache(max_bytes=100 * POSITION_BYTES)
    try:
        a, b, c = (ids(300, 40, seed) for seed in (6, 7, 8))
        cached.prefill(a)
        cached.prefill(b)
        assert len(cache) == 2 and cache.nbytes == 80 * POSITION_BYTES
        cached.prefill(a + [1])  # a used again (and extended: its entry replaced)
        cached.prefill(c)  # 121 positions > 100: b, the least recently used, goes
        assert len(cache) == 2 and cache.stats.evicted == 1 and cache.nbytes <= 100 * POSITION_BYTES
        hits = cache.stats.hits
        cached.prefill(a + [2, 3])
        cached.prefill(b + [2, 3])
        assert cache.stats.hits == hits + 1
        cached.prefill(ids(300, 101, 9))  # larger than the whole budget: not kept
        assert cache.nbytes <= 100 * POSITION_BYTES
    finally:
        cached.prefix_cache = saved


def test_forks_share_the_cache(gpt2_pair) -> None:
    cached, plain = gpt2_pair
    cached.prefix_cache.clear()
    system = ids(300, 50, 10)
    cached.prefill(system + [1, 2])
    twin = cached.fork()
    hits = cached.prefix_cache.stats.hits
    within(twin.prefill(system + [4]), plain.prefill(system + [4]))
    assert cached.prefix_cache.stats.hits == hits + 1


def test_entries_are_per_adapter(gpt2_pair) -> None:
    cached, plain = gpt2_pair
    cached.prefix_cache.clear()
    rng = np.random.default_rng(0)
    modules = {f"transformer.h.{i}.attn.c_attn": (rng.normal(0, 0.3, (4, 96)).astype(np.float32),
                                                  rng.normal(0, 0.3, (288, 4)).astype(np.float32))
               for i in range(2)}
    adapter = LoraAdapter(4, 8.0, modules)
    for model in (cached, plain):
        if "a" not in model.adapters:
            model.add_adapter(adapter, "a")
    system = ids(300, 40, 11)
    cached.prefill(system + [1])  # stored for the base model
    hits = cached.prefix_cache.stats.hits
    base = plain.prefill(system + [2])
    try:
        cached.set_adapter("a")
        plain.set_adapter("a")
        adapted = plain.prefill(system + [2])
        assert np.abs(adapted - base).max() > 0.1 * np.abs(base).max()  # the adapter matters
        within(cached.prefill(system + [2]), adapted)
        assert cached.prefix_cache.stats.hits == hits  # the base model's keys are not the adapter's
        within(cached.prefill(system + [3]), plain.prefill(system + [3]))
        assert cached.prefix_cache.stats.hits == hits + 1
    finally:
        cached.set_adapter(None)
        plain.set_adapter(None)


@pytest.mark.parametrize("bad", [{"max_bytes": 0}, {"max_bytes": 1.5}, {"max_bytes": 10, "min_tokens": 0}])
def test_bad_settings_say_what_to_give(bad) -> None:
    with pytest.raises(PrefixCacheError, match="positive integer"):
        PrefixCache(**bad)


def _common_length(a: tuple[int, ...], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class _StubModel:
    """What PrefixCache.store and reusable read of a model: its adapter and a one-lane cache of 64 positions."""

    def __init__(self, adapter: str | None) -> None:
        self.active_adapter = adapter
        self.cache = type("Cache", (), {})()
        self.cache.keys = [np.zeros((1, 4, 64), np.float16)]
        self.cache.values = [np.zeros((1, 4, 64), np.float16)]
        self.cache.lengths = np.array([64])


def test_lookups_find_the_longest_stored_prefix_as_a_scan_of_every_entry_would() -> None:
    """The index by first ids (lookups read only entries that can share min_tokens) gives what a scan of every
    stored entry gives, through stores that replace prefixes and evictions; the byte count stays the entries' sum."""
    rng = np.random.default_rng(0)
    cache = PrefixCache(max_bytes=40 * 4 * 2 * 2 * 30, min_tokens=4)  # about 30 entries of 40 positions
    models = {a: _StubModel(a) for a in (None, "a")}
    stems = [[int(t) for t in rng.integers(0, 3, 6)] for _ in range(4)]  # shared starts, a 3-token vocabulary

    def prompt() -> list[int]:
        return stems[rng.integers(len(stems))][:rng.integers(2, 7)] + [int(t) for t in rng.integers(0, 3, rng.integers(0, 34))]

    for _ in range(400):
        model = models[None if rng.random() < 0.7 else "a"]
        cache.store(model, prompt())
        query = prompt()
        best = max((_common_length(key[1], query[:-1]) for key in cache._entries if key[0] == model.active_adapter),
                   default=0)
        assert cache.reusable(model, query) == (best if best >= cache.min_tokens else 0)
        assert cache.nbytes == sum(e.nbytes for e in cache._entries.values()) <= cache.max_bytes
    assert cache.stats.evicted > 0
