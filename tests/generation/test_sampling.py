"""The sampler against references that sort the whole vocabulary (numpy float64, transformers' order) and against
numpy's own ``Generator.choice``: the same distribution, the same draws for the same seed."""

from __future__ import annotations

import numpy as np
import pytest

from orion.generation.sampling import next_token, sampling_probs, top_ids

SETTINGS = [(t, k, p, m) for t in (0.3, 1.0, 1.7) for k in (None, 1, 5, 60) for p in (None, 0.1, 0.9, 0.999, 1.0)
            for m in (None, 0.05)]


def reference_probs(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
                    min_p: float | None) -> np.ndarray:
    """Temperature, top-k, top-p and min-p over the whole vocabulary with one full stable sort (float64)."""
    scaled = (logits.astype(np.float64) - logits.max()) / temperature
    if top_k is not None and top_k < scaled.size:
        order = np.argsort(-scaled, kind="stable")  # ties: lower ids first
        scaled[order[top_k:]] = -np.inf
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if top_p is not None and top_p < 1:
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]  # the mass of the more likely tokens
        probs[order[before >= top_p]] = 0.0
        probs /= probs.sum()
    if min_p:
        probs[probs < min_p * probs.max()] = 0.0
        probs /= probs.sum()
    return probs


def logits_of(kind: str, size: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(size) * {"peaked": 10, "flat": 0.1, "normal": 3}[kind.split("-")[0]]).astype(np.float32)
    return np.round(logits) if kind.endswith("ties") else logits  # many equal logits: the tie rules matter


@pytest.mark.parametrize("kind", ["normal", "peaked", "flat", "normal-ties", "flat-ties"])
@pytest.mark.parametrize("size", [7, 3000])
def test_distribution_and_draws_match_the_references(kind: str, size: int) -> None:
    logits = logits_of(kind, size, seed=size)
    for temperature, top_k, top_p, min_p in SETTINGS:
        got = sampling_probs(logits, temperature, top_k, top_p, min_p)
        want = reference_probs(logits, temperature, top_k, top_p, min_p)
        assert np.array_equal(got > 0, want > 0), (temperature, top_k, top_p, min_p)  # the same tokens kept
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
        for seed in range(4):  # one uniform per token, through the cumulative sums, as Generator.choice draws
            chosen = np.random.default_rng(seed).choice(size, p=got)
            assert next_token(logits, temperature, top_k, top_p, np.random.default_rng(seed), min_p) == chosen


def test_seeded_draws_follow_the_distribution() -> None:
    logits = np.array([2.0, 1.0, 0.5, -1.0, 3.0, 3.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    draws = np.bincount([next_token(logits, 0.8, None, 0.9, rng) for _ in range(20000)], minlength=logits.size)
    want = reference_probs(logits, 0.8, None, 0.9, None)
    assert draws[want == 0].sum() == 0
    np.testing.assert_allclose(draws / draws.sum(), want, atol=0.015)  # 20000 draws: about 3.5 standard errors


def test_top_ids_is_a_stable_descending_sort() -> None:
    rng = np.random.default_rng(1)
    for values in (np.round(rng.standard_normal(500) * 2), rng.standard_normal(500),
                   np.array([1.0, -np.inf, 3.0, np.nan, 3.0, -np.inf, 0.0]), np.full(9, -np.inf)):
        for n in (1, 2, 5, values.size, values.size + 3):
            np.testing.assert_array_equal(top_ids(values, n), np.argsort(-values, kind="stable")[:n])


def test_the_descending_order_is_a_stable_sorts() -> None:
    from orion.generation.sampling import _descending

    rng = np.random.default_rng(2)
    for values in (rng.random(1000), np.round(rng.random(5000), 2), np.zeros(7), np.array([1.0]),
                   np.repeat(rng.random(40), 25)):  # no ties, many ties, all equal, one value, runs
        np.testing.assert_array_equal(_descending(values), np.argsort(-values, kind="stable"))
