"""Prompt-lookup speculative decoding: the drafter, greedy output equal to plain decoding (GPT-2 and
Llama, prompts that repeat and prompts that do not, drafts that are right and drafts that are wrong),
rejected drafts leaving nothing in the KV cache, and sampled output keeping the model's distribution
(a chi-square test at significance 0.001 against the probabilities of the model's own plain logits).

The chunk programs that check drafts compute the same positions as decode to within fp16 rounding, so
greedy runs are compared token for token, and may part only at a near-tie: a step whose top two logits
in the independent float64 reference (``tests/support``) are within ``TIE`` of the largest logit, where
fp16 rounding may pick either (Llama's "random" prompt has one at step 13: 3.3795 against 3.3645;
decode picks the second, the chunk programs the first); three quarters of all steps must be compared. The
oracle test holds to the same rule: whether a run with its drafts meets such a step in a check or in a decode
step depends on the drafts, and which side a near-tie falls on, on the kernels' fp32 summation order.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2

from orion.generation import speculative
from orion.generation.speculative import Speculation, SpeculationError, prompt_lookup
from orion.models import GPT2, GPT2Config, Llama, LlamaConfig
from support.gpt2_fixtures import lively_weights
from support.gpt2_reference import reference_logits as gpt2_reference
from support.llama_fixtures import lively
from support.llama_reference import reference_logits as llama_reference

GPT2_CONFIG = GPT2Config(n_layer=2, n_head=2, n_embd=96, vocab_size=300, n_positions=256)
LLAMA_CONFIG = LlamaConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=4, head_dim=16, hidden_dim=96, vocab_size=160,
                           max_position_embeddings=384, rope_convention="half", rope_theta=500.0)
NEW = 40
TIE = 0.03  # of the largest logit: closer top-two logits may swap under fp16 rounding (GPT-2's own tolerance)
ALPHA = 1e-3  # significance of the distribution test (its seeds are fixed: the outcome is deterministic)


@pytest.fixture(scope="module")
def gpt2() -> GPT2:
    return GPT2(GPT2_CONFIG, lively_weights(GPT2_CONFIG, seed=3), progress=False)


@pytest.fixture(scope="module")
def llama() -> Llama:
    return Llama(LLAMA_CONFIG, lively(LLAMA_CONFIG, seed=5), progress=False)


def prompts(vocab: int) -> dict[str, list[int]]:
    rng = np.random.default_rng(7)
    base = [int(t) for t in rng.integers(0, vocab, 20)]
    return {"repeated": base * 3, "quoted": base + [1, 2] + base[:9], "one token": [5],
            "random": [int(t) for t in rng.integers(0, vocab, 45)]}


def test_prompt_lookup_drafts_what_followed_the_latest_longest_match() -> None:
    assert prompt_lookup([1, 2, 3, 4, 9, 1, 2, 3], 2) == [4, 9]
    # the 3-gram [7, 1, 2] wins over the later 2-gram match of [1, 2]
    assert prompt_lookup([7, 1, 2, 5, 6, 1, 2, 8, 7, 1, 2], 3) == [5, 6, 1]
    assert prompt_lookup([1, 2, 8, 1, 2, 9, 1, 2], 1, max_ngram=2) == [9]  # the most recent occurrence
    assert prompt_lookup([4, 5, 6], 3) == []
    assert prompt_lookup([3, 3], 4) == [3]  # the continuation may end at the sequence's end
    assert prompt_lookup([1, 2, 1, 2], 5, max_ngram=2, min_ngram=2) == [1, 2]
    assert prompt_lookup([9], 3) == []


@pytest.mark.parametrize("bad", [{"num_tokens": 0}, {"max_ngram": 0}, {"min_ngram": 3, "max_ngram": 2},
                                 {"method": "medusa"}, {"num_tokens": 2.0}])
def test_bad_settings_say_what_to_give(bad) -> None:
    with pytest.raises(SpeculationError, match="speculative"):
        Speculation(**bad)


def test_bad_speculative_argument_is_refused_before_any_work(gpt2) -> None:
    with pytest.raises(SpeculationError, match="prompt-lookup"):
        gpt2.generate([1, 2, 3], 4, speculative=7)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_greedy_output_is_plain_decoding_token_for_token(name, request) -> None:
    model = request.getfixturevalue(name)
    reference = {"gpt2": gpt2_reference, "llama": llama_reference}[name]
    compared = 0
    for label, ids in prompts(model.dims.vocab_size).items():
        plain = list(model.generate(ids, NEW, temperature=0, ignore_eos=True))
        run = model.generate(ids, NEW, temperature=0, ignore_eos=True,
                             speculative=Speculation(num_tokens=6, max_ngram=2, min_ngram=1))
        got = list(run)
        same = next((i for i, (a, b) in enumerate(zip(got, plain)) if a != b), NEW)
        if same < NEW:  # only where fp16 rounding may pick either of two near-equal logits
            step = reference(model.config, model.weights, ids + plain[:same])[-1].astype(np.float64)
            top2 = np.sort(step)[-2:]
            assert top2[1] - top2[0] < TIE * np.abs(step).max(), f"{label}: differs at step {same}, not a near-tie"
        compared += same
        assert run.finish_reason == "length"
        assert model.cache.length == len(ids) + NEW - 1, f"{label}: unconfirmed drafts left in the cache"
        if label != "one token":
            assert run.speculation.checks > 0, label
    assert compared >= 0.75 * NEW * len(prompts(model.dims.vocab_size))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_right_and_wrong_drafts_give_plain_decodings_tokens(name, request, monkeypatch) -> None:
    """Drafts from an oracle (the plain run's own next tokens, with every third one wrong): accepted runs,
    rejections mid-draft and the rejected drafts' positions all leave the output unchanged, but where the checks'
    chunk programs and decode part at a near-tie (as in test_greedy_output_is_plain_decoding_token_for_token),
    and leave the cache holding exactly the run's own positions."""
    model = request.getfixturevalue(name)
    reference = {"gpt2": gpt2_reference, "llama": llama_reference}[name]
    ids = prompts(model.dims.vocab_size)["random"]
    plain = list(model.generate(ids, NEW, temperature=0, ignore_eos=True))
    truth = ids + plain

    def oracle(history: list[int], num_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
        start = len(history)
        drafts = truth[start:start + num_tokens]
        return [(t + 1) % model.dims.vocab_size if (start + i) % 3 == 0 else t for i, t in enumerate(drafts)]

    monkeypatch.setattr(speculative, "prompt_lookup", oracle)
    run = model.generate(ids, NEW, temperature=0, ignore_eos=True, speculative=Speculation(num_tokens=5))
    got = list(run)
    same = next((i for i, (a, b) in enumerate(zip(got, plain)) if a != b), NEW)
    if same < NEW:
        step = reference(model.config, model.weights, ids + plain[:same])[-1].astype(np.float64)
        top2 = np.sort(step)[-2:]
        assert top2[1] - top2[0] < TIE * np.abs(step).max(), f"differs at step {same}, not a near-tie"
    assert same >= NEW // 4, f"parted at step {same}"
    stats = run.speculation
    assert stats.accepted >= same // 3 and stats.drafted > stats.accepted, stats  # right and wrong drafts both met
    assert model.cache.length == len(ids) + NEW - 1
    # the cache holds exactly the run's positions: the next token's logits agree with a fresh read of them
    after = model.decode_step(got[-1])
    want = model.logits(ids + got)[-1]
    np.testing.assert_allclose(after, want, rtol=0, atol=0.03 * float(np.abs(want).max()))


def test_extend_after_truncating_back_reads_the_rewritten_positions(gpt2) -> None:
    """The chunk programs keep the cache positions they were given (``KVCache.copied``): after a truncation below
    them and new tokens in their place, an ``extend`` attends to the new ones (logits as a fresh run's)."""
    ids = prompts(GPT2_CONFIG.vocab_size)["random"][:30]
    gpt2.prefill(ids)
    gpt2.extend([1, 2, 3])
    gpt2.extend([4, 5])  # the chunk programs now hold the first 33 positions
    gpt2.truncate(20)
    for token in (7, 8, 9, 10, 11):
        gpt2.decode_step(token)
    got = gpt2.extend([12, 13])
    want = gpt2.logits(ids[:20] + [7, 8, 9, 10, 11, 12, 13])[-2:]
    np.testing.assert_allclose(got, want, rtol=0, atol=0.03 * float(np.abs(want).max()))


def test_a_stop_token_ends_at_it_with_the_cache_truncated(gpt2) -> None:
    ids = prompts(gpt2.dims.vocab_size)["repeated"]
    plain = list(gpt2.generate(ids, NEW, temperature=0, ignore_eos=True))
    stop = plain[len(plain) // 2]
    want = plain[:plain.index(stop) + 1]
    run = gpt2.generate(ids, NEW, temperature=0, stop=stop, speculative="prompt-lookup")
    assert list(run) == want and run.finish_reason == "stop" and run.stopped_by == stop
    assert gpt2.cache.length == len(ids) + len(want) - 1


def test_extend_at_the_context_end_is_refused_with_the_fix(gpt2) -> None:
    gpt2.prefill([1] * (GPT2_CONFIG.n_positions - 2))
    with pytest.raises(Exception, match="exceed the context length"):
        gpt2.extend([1, 2, 3])


def test_speculation_near_the_context_end_stops_at_it(gpt2) -> None:
    ids = prompts(gpt2.dims.vocab_size)["repeated"] * 4  # 240 of 256 positions
    with pytest.warns(UserWarning, match="context length"):
        plain = list(gpt2.generate(ids, 30, temperature=0, ignore_eos=True))
    with pytest.warns(UserWarning, match="context length"):
        run = gpt2.generate(ids, 30, temperature=0, ignore_eos=True, speculative="prompt-lookup")
        assert list(run) == plain
    assert run.context_full


def test_sampled_output_keeps_the_models_distribution(gpt2, monkeypatch) -> None:
    """Three sampled tokens (top-2 at temperature 1.5, so 8 outcomes) over 600 seeds, with a draft of the
    most likely second and third tokens: the counts against the model's exact conditional probabilities,
    from its plain logits; chi-square with 7 degrees of freedom at significance ``ALPHA``."""
    ids = prompts(GPT2_CONFIG.vocab_size)["random"][:30]
    temperature, top_k, runs = 1.5, 2, 600

    def top2(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(-logits.astype(np.float64))[:top_k]
        p = np.exp((logits[order] - logits[order].max()) / temperature)
        return order, p / p.sum()

    probs: dict[tuple[int, ...], float] = {}
    for a, pa in zip(*top2(gpt2.logits(ids)[-1])):
        for b, pb in zip(*top2(gpt2.logits(ids + [int(a)])[-1])):
            for c, pc in zip(*top2(gpt2.logits(ids + [int(a), int(b)])[-1])):
                probs[(int(a), int(b), int(c))] = pa * pb * pc
    likely: dict[int, tuple[int, ...]] = {}  # first token -> the likeliest three tokens starting with it
    for key, p in probs.items():
        if key[0] not in likely or p > probs[likely[key[0]]]:
            likely[key[0]] = key

    def oracle(history: list[int], num_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
        if len(history) == len(ids) + 1:  # after the first token: draft the likeliest second and third
            return list(likely[history[-1]][1:])[:num_tokens]
        return []

    monkeypatch.setattr(speculative, "prompt_lookup", oracle)
    counts = dict.fromkeys(probs, 0)
    accepted = 0
    for seed in range(runs):
        run = gpt2.generate(ids, 3, temperature=temperature, top_k=top_k, seed=seed, ignore_eos=True,
                            speculative="prompt-lookup")
        outcome = tuple(run)
        assert outcome in counts, f"seed {seed}: {outcome} is outside the top-2 tokens' outcomes"
        counts[outcome] += 1
        accepted += run.speculation.accepted
    assert 0 < accepted < runs  # both the accepted and the rejected paths were taken
    observed = np.array([counts[k] for k in probs])
    expected = np.array([probs[k] for k in probs]) * runs
    statistic = float(((observed - expected) ** 2 / expected).sum())
    assert statistic < chi2.ppf(1 - ALPHA, len(probs) - 1), (statistic, observed, expected.round(1))


def test_failed_checks_back_off_to_plain_steps(gpt2, monkeypatch) -> None:
    """Drafts that are always wrong: the output is still plain decoding's, and after each failed check the
    speculator decodes plainly for a doubling number of steps from the second failure in a row, so checks become
    rare (0, 1, 2, 4, 8, 16 steps between them: 7 checks in 40 tokens) instead of one per token."""
    ids = prompts(gpt2.dims.vocab_size)["random"]
    plain = list(gpt2.generate(ids, NEW, temperature=0, ignore_eos=True))
    truth = ids + plain

    def wrong(history: list[int], num_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
        return [(truth[len(history)] + 1) % gpt2.dims.vocab_size] * min(num_tokens, 3)

    monkeypatch.setattr(speculative, "prompt_lookup", wrong)
    run = gpt2.generate(ids, NEW, temperature=0, ignore_eos=True, speculative="prompt-lookup")
    assert list(run) == plain
    assert run.speculation.accepted == 0 and run.speculation.checks == 7, run.speculation


def test_checks_run_in_the_draft_chunk_bucket() -> None:
    from orion.generation.plan import PlanError, PlanOptions

    options = PlanOptions()
    assert options.extend_pieces(100, 8) == [(100, 8, 8)]  # a token and 7 drafts: the 8-lane programs
    assert options.extend_pieces(100, 3) == [(100, 3, 8)]
    assert options.extend_pieces(100, 9) == [(100, 9, 32)]  # more: the prompts' buckets, 32 lanes at least
    assert PlanOptions(draft_chunk=4).extend_pieces(0, 3) == [(0, 3, 4)]
    with pytest.raises(PlanError, match="draft_chunk=6"):
        PlanOptions(draft_chunk=6)
