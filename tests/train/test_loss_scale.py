"""Loss scaling against torch's GradScaler update rule, and the fp16-range clamp against numpy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orion.limits import FP16_MAX
from orion.train import loss_scale
from orion.train.errors import TrainError
from support.references import require


def test_dynamic_scale_follows_torch_gradscaler_rule() -> None:
    (torch,) = require("torch")
    rng = np.random.default_rng(0)
    overflows = rng.random(400) < 0.12
    overflows[:3] = True
    ours = loss_scale.DynamicLossScale(scale=2.0**16, growth_interval=7, min_scale=2.0**-100,
                                        max_scale=2.0**100)  # limits torch does not have stay out of reach
    scale, tracker = torch.tensor([2.0**16]), torch.tensor([0], dtype=torch.int32)
    applied = []
    for overflow in overflows:
        applied.append(ours.update(nonfinite=int(overflow)))
        torch._amp_update_scale_(scale, tracker, torch.tensor([float(overflow)]), 2.0, 0.5, 7)
        assert ours.scale == float(scale) and ours.good_steps == int(tracker)
    assert applied == [not o for o in overflows]
    assert ours.skipped_steps == int(overflows.sum())
    assert ours.growths > 0 and ours.scale != 2.0**16


def test_dynamic_scale_limits_and_skips() -> None:
    s = loss_scale.DynamicLossScale(scale=4.0, min_scale=1.0, max_scale=8.0, growth_interval=2)
    assert [s.update(1) for _ in range(4)] == [False] * 4
    assert s.scale == 1.0 and s.skipped_steps == 4  # never below min_scale, every overflow still skipped
    for _ in range(10):
        assert s.update(0)
    assert s.scale == 8.0  # capped at max_scale


def test_static_scale_skips_without_changing() -> None:
    s = loss_scale.StaticLossScale(256.0)
    assert [s.update(n) for n in (0, 3, 0, 1)] == [True, False, True, False]
    assert s.scale == 256.0 and s.skipped_steps == 2


def test_state_round_trip_through_json() -> None:
    s = loss_scale.DynamicLossScale(growth_interval=3)
    for n in (0, 0, 1, 0, 0, 0, 0):
        s.update(n)
    restored = loss_scale.from_state_dict(json.loads(json.dumps(loss_scale.state_dict(s))))
    assert restored == s
    for n in (0, 0, 1, 0):
        assert restored.update(n) == s.update(n)
    assert restored == s
    static = loss_scale.StaticLossScale(128.0, skipped_steps=2)
    assert loss_scale.from_state_dict(loss_scale.state_dict(static)) == static
    with pytest.raises(TrainError, match="kind 'amp'"):
        loss_scale.from_state_dict({"kind": "amp"})
    with pytest.raises(TrainError, match="expected"):
        loss_scale.from_state_dict({"kind": "static", "scale": 2.0})
    with pytest.raises(TrainError, match="backoff_factor"):
        loss_scale.DynamicLossScale(backoff_factor=1.5)
    with pytest.raises(TrainError, match="scale=0"):
        loss_scale.StaticLossScale(0)


def test_clamp_counts_and_never_touches_nan_or_inf() -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(200_003) * 3e4).astype(np.float32)  # spans several blocks, odd length
    x[[5, 70_000, 200_002]] = [np.nan, np.inf, -np.inf]
    x[6], x[7], x[8] = np.float32(FP16_MAX), np.float32(-FP16_MAX), np.nextafter(np.float32(FP16_MAX), np.inf)
    before = x.copy()
    counts = loss_scale.clamp_to_fp16(x, "layer3.attn_out")
    finite = np.isfinite(before)
    expected_clamped = int(np.sum(finite & (np.abs(before) > FP16_MAX)))
    assert expected_clamped > 1000
    assert counts == loss_scale.ClampCounts(clamped=expected_clamped, nonfinite=3)
    np.testing.assert_array_equal(x[finite], np.clip(before[finite], -FP16_MAX, FP16_MAX))
    np.testing.assert_array_equal(x[~finite], before[~finite])  # NaN stays NaN, Inf stays Inf
    assert x[6] == FP16_MAX and x[7] == -FP16_MAX and x[8] == FP16_MAX
    assert np.isfinite(x[finite].astype(np.float16)).all()
    assert counts + counts == loss_scale.ClampCounts(2 * expected_clamped, 6)


def test_clamp_refuses_bad_arrays_naming_them() -> None:
    with pytest.raises(TrainError, match="tensor of 'h1' has dtype float16"):
        loss_scale.clamp_to_fp16(np.zeros(4, np.float16), "h1")
    read_only = np.zeros(4, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(TrainError, match="tensor of 'h2' is read-only"):
        loss_scale.clamp_to_fp16(read_only, "h2")
