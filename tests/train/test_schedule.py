"""Learning-rate schedules against a separately written formula, and their saved position."""

from __future__ import annotations

import json
import math

import pytest

from orion.train import schedule
from orion.train.errors import TrainError


def _reference_warmup_cosine(i: int, max_lr: float, warmup: int, total: int, min_lr: float) -> float:
    """nanoGPT's get_lr with warmup reaching max_lr on update warmup-1 (written independently)."""
    if i < warmup:
        return max_lr * (i + 1) / warmup
    if i >= total:
        return min_lr
    theta = math.pi * (i - warmup) / (total - warmup)
    return min_lr + (math.cos(theta) + 1) / 2 * (max_lr - min_lr)


def test_warmup_cosine_matches_reference_and_endpoints() -> None:
    s = schedule.WarmupCosine(max_lr=4e-4, warmup_steps=10, total_steps=110, min_lr=4e-5)
    rates = [schedule.advance(s) for _ in range(130)]
    for i, lr in enumerate(rates):
        assert lr == pytest.approx(_reference_warmup_cosine(i, 4e-4, 10, 110, 4e-5), rel=1e-12), i
    assert rates[0] == pytest.approx(4e-5) and rates[9] == pytest.approx(4e-4)  # warmup reaches max at update 9
    assert rates[60] == pytest.approx((4e-4 + 4e-5) / 2)  # halfway through the cosine
    assert all(a >= b for a, b in zip(rates[9:], rates[10:], strict=False))  # non-increasing after warmup
    assert rates[110:] == [4e-5] * 20
    assert s.position == 130


def test_constant_and_no_warmup() -> None:
    c = schedule.Constant(3e-4)
    assert [schedule.advance(c) for _ in range(3)] == [3e-4] * 3 and c.position == 3
    s = schedule.WarmupCosine(max_lr=1.0, warmup_steps=0, total_steps=4)
    assert [schedule.advance(s) for _ in range(5)] == pytest.approx([1.0, 0.5 + 0.5 * math.cos(math.pi / 4), 0.5,
                                                                     0.5 + 0.5 * math.cos(3 * math.pi / 4), 0.0])


def test_position_survives_a_json_round_trip() -> None:
    s = schedule.WarmupCosine(max_lr=1e-3, warmup_steps=5, total_steps=50)
    for _ in range(17):
        schedule.advance(s)
    restored = schedule.from_state_dict(json.loads(json.dumps(schedule.state_dict(s))))
    assert restored == s and restored.position == 17
    assert [schedule.advance(restored) for _ in range(40)] == [schedule.advance(s) for _ in range(40)]
    assert schedule.from_state_dict(schedule.state_dict(schedule.Constant(2e-4, position=3))).position == 3


def test_bad_schedules_raise() -> None:
    with pytest.raises(TrainError, match="total_steps=10 must exceed warmup_steps=10"):
        schedule.WarmupCosine(max_lr=1e-3, warmup_steps=10, total_steps=10)
    with pytest.raises(TrainError, match="min_lr=0.1 is above max_lr=0.01"):
        schedule.WarmupCosine(max_lr=0.01, warmup_steps=0, total_steps=10, min_lr=0.1)
    with pytest.raises(TrainError, match="lr=-1"):
        schedule.Constant(-1)
    with pytest.raises(TrainError, match="kind 'linear'"):
        schedule.from_state_dict({"kind": "linear"})
    with pytest.raises(TrainError, match="unexpected keyword"):
        schedule.from_state_dict({"kind": "constant", "lr": 1.0, "gamma": 2})
